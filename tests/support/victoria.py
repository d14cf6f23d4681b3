"""VictoriaMetrics on loopback for end-to-end tests: the single-node database, vmagent and vmalert.

Command lines for the binaries of Debian's ``victoria-metrics`` package (``victoria-metrics``,
``vmagent``, ``vmalert``; tested with 1.79), to be started with :class:`tests.support.stack.Processes`,
plus the checks, imports and queries the tests share. Every listener is ``127.0.0.1:<port>``; every
data directory is the caller's (a temporary one). Nothing here starts a process itself, except the
short-lived ``vmalert -dryRun`` of :func:`vmalert_check_rules`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

PACKAGE = "victoria-metrics"
VICTORIA_METRICS = "victoria-metrics"
VMAGENT = "vmagent"
VMALERT = "vmalert"
WRITE_PATH = "/api/v1/write"
"""The Prometheus remote-write endpoint of VictoriaMetrics (and the suffix vmalert appends itself)."""
HEALTH_PATH = "/health"
"""Answers ``OK`` once a VictoriaMetrics component serves HTTP."""


def require_binary(name: str, package: str = PACKAGE) -> str:
    """Path of ``name``; skip without it, but fail when the ``CI`` environment variable is set."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found (Debian package {package!r}; `make system-deps` installs it)"
        if os.environ.get("CI"):
            pytest.fail(message + " and CI is set: this test must not be skipped")
        pytest.skip(message)
    return path


def victoria_metrics_cmd(binary: str, data: Path, port: int, *, latency_offset: str = "5s") -> list[str]:
    """A single-node VictoriaMetrics on 127.0.0.1 storing into ``data``.

    ``-search.latencyOffset`` (default 30 s) moves an instant query at "now" back by that much unless
    it says ``nocache=1``, which vmalert 1.79 does not (it sends ``query``, ``time`` in whole seconds
    and ``step=300s``): with the default, vmalert sees nothing younger than 30 s, and each recording
    reaches the rules built on it half a minute late. Too small an offset shows a query the last
    scrape of some series and not yet of others (vmagent flushes its remote write each second, and
    VictoriaMetrics makes what arrives searchable a second or two later): with one second, a loaded
    CI machine once recorded a 1h error ratio 6.5e-6 off Prometheus' (its bucket and count read from
    different scrapes). Five seconds leave ingestion time to flush.
    """
    return [
        binary,
        f"-storageDataPath={data}",
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-search.latencyOffset={latency_offset}",
        "-search.disableCache",  # tests query data seconds old; no response cache to invalidate
        "-loggerLevel=WARN",
    ]


def vmagent_cmd(
    binary: str,
    config: Path,
    data: Path,
    port: int,
    remote_write: str,
    *,
    members: int = 1,
    member: int = 0,
    labels: dict[str, str] | None = None,
) -> list[str]:
    """One vmagent scraping the ``scrape_configs`` of a Prometheus ``config`` into ``remote_write``.

    With ``members`` > 1 it is member ``member`` of a scraping cluster: each target is scraped by one
    member only (``-promscrape.cluster.membersCount``/``memberNum``, replication factor 1). The other
    sections of a Prometheus configuration (``rule_files``, ``alerting``, ``remote_write``, a file_sd
    ``refresh_interval``) are ignored (``-promscrape.config.strictParse=false``): vmagent rejects them
    otherwise. ``labels`` are added to every sample it sends (``-remoteWrite.label``).
    """
    cmd = [
        binary,
        f"-promscrape.config={config}",
        "-promscrape.config.strictParse=false",
        f"-remoteWrite.url={remote_write}",
        f"-remoteWrite.tmpDataPath={data}",
        "-remoteWrite.flushInterval=1s",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-loggerLevel=WARN",
    ]
    if members > 1:
        cmd += [f"-promscrape.cluster.membersCount={members}", f"-promscrape.cluster.memberNum={member}"]
    cmd += [f"-remoteWrite.label={k}={v}" for k, v in sorted((labels or {}).items())]
    return cmd


def vmalert_cmd(
    binary: str,
    rules: Sequence[Path],
    port: int,
    *,
    datasource: str,
    remote_write: str,
    notifier: str,
    evaluation_interval: str = "1s",
) -> list[str]:
    """vmalert evaluating ``rules`` against ``datasource`` (a VictoriaMetrics base URL).

    Recording rules and the alerts' state are written back with ``-remoteWrite.url`` (vmalert adds
    ``/api/v1/write``), alerts go to the Alertmanager at ``notifier``. ``evaluation_interval`` is for
    groups without an ``interval`` of their own. Queries are not aligned to the evaluation interval
    (``-datasource.queryTimeAlignment=false``): a group with a 30 s interval would otherwise query up
    to 30 s in the past.
    """
    return [
        binary,
        *(f"-rule={path}" for path in rules),
        f"-datasource.url={datasource}",
        f"-remoteWrite.url={remote_write}",
        "-remoteWrite.flushInterval=1s",
        f"-notifier.url={notifier}",
        f"-evaluationInterval={evaluation_interval}",
        "-datasource.queryTimeAlignment=false",
        f"-external.url=http://127.0.0.1:{port}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-loggerLevel=WARN",
    ]


def vmalert_check_rules(binary: str, rules: Sequence[Path]) -> subprocess.CompletedProcess[str]:
    """``vmalert -dryRun``: parses every rule file, each expression with MetricsQL, each template."""
    return subprocess.run(
        [binary, "-dryRun", *(f"-rule={p}" for p in rules), "-loggerLevel=ERROR"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def query(base: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """An instant query against a Prometheus-compatible API (Prometheus, VictoriaMetrics): the result vector."""
    params: dict[str, str] = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    r = httpx.get(f"{base}/api/v1/query", params=params, timeout=30)
    body = r.json()
    if body.get("status") != "success":
        raise AssertionError(f"{base}: {expr}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def labelled_values(result: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], float]:
    """``{sorted label pairs (with __name__ when present): value}`` of an instant-query vector."""
    return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in result}


def import_prometheus(base: str, text: str) -> None:
    """Write samples in the Prometheus text format, with millisecond timestamps, into VictoriaMetrics
    (``/api/v1/import/prometheus``: how history is backfilled; the samples are searchable a second later)."""
    r = httpx.post(f"{base}/api/v1/import/prometheus", content=text.encode(), timeout=60)
    if r.status_code != 204:
        raise AssertionError(f"{base}: import answered {r.status_code}: {r.text[:500]}")
