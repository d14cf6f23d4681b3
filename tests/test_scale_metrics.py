"""Scale-out of metrics (issue 14): Prometheus and sharded vmagents into VictoriaMetrics, the rules in vmalert.

Everything runs on 127.0.0.1 with Debian's binaries (``prometheus``, ``promtool``,
``prometheus-alertmanager``, and from ``victoria-metrics``: ``victoria-metrics``, ``vmagent``,
``vmalert``)::

    11 targets ─┬─> Prometheus: prometheus.yml of inferwatch.stack (file_sd targets, remote_write;
                │   its alerting section left out), alerts/generated/rules.yml
                │      └──remote_write──> VictoriaMetrics "prom"
                └─> 3 vmagents, one cluster (each target scraped by one member), the same scrape
                    configs ──remote write──> VictoriaMetrics "vm" <──reads, writes recordings── vmalert
                    (the same rules.yml) ──alerts──> Alertmanager (generated alertmanager.yml) ──> webhook

**The fleet is deterministic.** Every counter and histogram bucket of a target grows linearly with
wall-clock time (value = requests/s x share x (t - t0)), computed when it is scraped, so whoever
scrapes it whenever sees the same line. Nine targets serve the canonical exposition themselves (as an
exporter does); two are real ``inferwatch exporter`` processes in front of a synthetic vLLM page (its
names taken from the vLLM adapter's mapping rows; the exporter's output is the same canonical page).

**History.** Prometheus' ``rate(x[5m])`` of a series younger than five minutes is its slope scaled
by the part of the window its samples cover, VictoriaMetrics' the slope itself: the absolute rates
a recording rule may keep (e.g. the error and event rates over 5 minutes) would differ tenfold
after half a minute. So
the last ``HISTORY_S`` seconds of the series the SLOs read are written into both stores before they
scrape, one sample a second, the same samples (``promtool tsdb create-blocks-from openmetrics`` for
Prometheus, ``/api/v1/import/prometheus`` for VictoriaMetrics, with the label of the vmagent that owns
the target). From then on both 5-minute windows are full, and for a linear series Prometheus'
extrapolation to the window's edges is exact.

**Parity.** Each recording of rules.yml in a group evaluated at least every 30 s must exist in both,
with the same labels, for every model, from an evaluation after the scrapers started; slower groups
(a 5m period group) are compared when both have evaluated them. Tolerances, relative:

- ratios (``...:ratio...`` recordings) and constants, for the models whose replicas all have the same
  shares (``chat``, ``code``, ``burning``): ``EXACT_TOLERANCE``. Whatever scaling a pipeline applies to
  a rate applies alike to a target's buckets, count and error counter (one page, one timestamp) and
  cancels in the ratio; the error ratios must also equal the shares the fleet was built with. What
  remains is rounding: VictoriaMetrics keeps about 12 significant digits of a sample, and a latency
  SLI subtracts the bucket's rate from the count's, losing log10(1 / share) more (3 for 0.1 %),
  ~1e-9 (4.4e-10 measured); any real disagreement (another window, a lost series, extrapolation) is
  >= 1e-3. The tolerance, 1e-5, leaves room for a query that reads a target's bucket and count from
  two scrapes (their values are computed a few microseconds apart after the scrape's timestamp:
  seen once as 6.5e-6, before VictoriaMetrics' latency offset was raised to 5 s) and stays a
  hundred times under any real disagreement. Remote-written samples must match to
  ``FORWARDING_TOLERANCE``;
- ratios built on other recordings of their own group (e.g. a burn rate recorded from the 5-minute
  error ratio, itself recorded from the error and event rates): ``CHAINED_TOLERANCE`` = 1e-3. vmalert
  reads a rule's inputs from VictoriaMetrics, where the recordings of the evaluation under way arrive
  only after the remote-write flush: such a recording first has a value one evaluation (30 s) later
  per level, and may divide a rate of this evaluation by one of the previous (each known to a few ms
  over 300 s, ~1e-5). The test waits for those evaluations (``recordings_timeout``);
- ratios for ``mixed``, whose replicas differ in their shares (as in a real fleet): over windows
  longer than the history Prometheus weighs each replica's rate by the time its samples cover, which
  differs between replicas only by their last scrape (< 1.1 s of >= 360 s): under 0.4 %, times
  max|share - ratio| / ratio (0.25) < 0.1 % on the ratio: ``MIXED_TOLERANCE`` = 1 %;
- absolute rates over windows within the history: ``RATE_TOLERANCE`` = 1 %: a live value is computed
  a few milliseconds after the timestamp its scraper gives it, and Prometheus extrapolates by half
  an interval when a scrape is late (0.5 s of 300 s, 0.2 %). Longer windows are not compared.

``burning`` fails 20x faster than the availability SLO allows: the burn-rate alerts of that SLO
(every window pair) fire for it in Prometheus and in vmalert alike, and nothing else fires;
vmalert's alerts must reach Alertmanager and the page its webhook (Prometheus' alerts are read from
its API, so that Alertmanager hears vmalert only and the timings are vmalert's). Every process
started here is stopped at the end; logs are printed when something fails. Set
``INFERWATCH_TEST_ARTIFACTS`` to keep the measured figures (``scale-metrics.json``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from inferwatch.alerts.generate import generate as generate_alerts
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import BURN_PAIRS, SLO, SLOFile, burn_factor, load
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import Row
from inferwatch.stack import EXPORTERS_JOB, Exporter, Layout, exporter_targets, prometheus_config
from tests.conftest import ROOT, free_port, require_tool
from tests.support.httpserver import serving as serving_http
from tests.support.sink import Sink, running_sink
from tests.support.stack import Processes, alertmanager_cmd, exporter_cmd, prometheus_cmd
from tests.support.victoria import (
    HEALTH_PATH,
    VICTORIA_METRICS,
    VMAGENT,
    VMALERT,
    WRITE_PATH,
    import_prometheus,
    labelled_values,
    query,
    require_binary,
    victoria_metrics_cmd,
    vmagent_cmd,
    vmalert_check_rules,
    vmalert_cmd,
)

T = TypeVar("T")
Key = tuple[tuple[str, str], ...]
"""A series or an alert: its sorted label pairs (``__name__`` included for a series)."""

RULES = ROOT / "inferwatch" / "alerts" / "generated" / "rules.yml"
SLO_FILE = ROOT / "inferwatch" / "alerts" / "slos.yaml"
"""The SLO file ``alerts/generated/`` is generated from."""
SCRAPERS = 3
SHARD_LABEL = "vmagent_member"
"""Added by each vmagent to what it sends (``-remoteWrite.label``): who scraped a target."""
CANONICAL = "canonical"
ENGINE_UPTIME_S = 900.0
"""The counters start as if every engine had been serving for a quarter of an hour."""
HISTORY_S = 360
"""Seconds of history written into both stores (> the 5-minute rate window)."""
FAST_GROUP_S = 30.0
"""Rule groups evaluated at least this often must have produced every recording."""
EXACT_TOLERANCE = 1e-5
FORWARDING_TOLERANCE = 1e-9
CHAINED_TOLERANCE = 1e-3
MIXED_TOLERANCE = 0.01
RATE_TOLERANCE = 0.01
ROUTE_TIMINGS = {
    "group_wait": "1s",
    "group_interval": "1s",
    "repeat_interval": "1h",
    "page_repeat_interval": "1h",
    "ticket_repeat_interval": "1h",
}
WEBHOOK_PATH = "/hook"
READY_TIMEOUT_S = 30.0
ARTIFACTS_ENV = "INFERWATCH_TEST_ARTIFACTS"


# --- the deterministic fleet -----------------------------------------------------------------------
@dataclass(frozen=True)
class Replica:
    """One engine replica: ``rate`` requests/s; per SLO, the share of bad requests is ``burn`` x its budget."""

    name: str
    model: str
    rate: float
    latency_burn: float
    error_burn: float
    dialect: str = CANONICAL
    """``canonical``: the target serves the canonical exposition itself; an engine (``vllm``): the
    target is a real inferwatch exporter scraping a synthetic page in that engine's dialect."""


FLEET: tuple[Replica, ...] = (
    *(Replica(f"chat-{i}", "chat", rate, 0.4, 0.5) for i, rate in enumerate((2.0, 3.0, 5.0, 8.0))),
    *(Replica(f"code-{i}", "code", rate, 0.7, 0.2, V.ENGINE_VLLM) for i, rate in enumerate((4.0, 6.0))),
    *(Replica(f"burning-{i}", "burning", rate, 0.3, 20.0) for i, rate in enumerate((3.0, 5.0))),
    Replica("mixed-0", "mixed", 2.0, 0.15, 0.75),
    Replica("mixed-1", "mixed", 4.0, 0.25, 0.5),
    Replica("mixed-2", "mixed", 6.0, 0.2, 0.6),
)
EXACT_MODELS = frozenset({"chat", "code", "burning"})
MODELS = frozenset(r.model for r in FLEET)


def share(replica: Replica, slo: SLO) -> float:
    """The fraction of ``replica``'s requests that are bad for ``slo``."""
    burn = replica.latency_burn if slo.indicator.latency else replica.error_burn
    return burn * float(slo.error_budget)


def cumulative(bounds: tuple[float, ...], anchors: dict[float, float]) -> list[float]:
    """Cumulative shares for ``bounds`` + ``+Inf``: exactly ``anchors[b]`` at each anchored boundary
    (the SLO thresholds), 1 at ``+Inf``, strictly increasing in between (linear in the bucket index)."""
    known = {-1: 0.0, len(bounds): 1.0}
    known.update({bounds.index(b): v for b, v in anchors.items()})
    points = sorted(known.items())
    out = []
    for i in range(len(bounds) + 1):
        (i0, v0), (i1, v1) = next((a, b) for a, b in itertools.pairwise(points) if a[0] <= i <= b[0])
        out.append(v0 + (v1 - v0) * (i - i0) / (i1 - i0))
    return out


Dialect = Callable[[V.MetricSpec, dict[str, str]], tuple[str, dict[str, str]] | None]


def canonical_dialect(spec: V.MetricSpec, labels: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    return spec.name, labels


def engine_dialect(engine: str) -> Dialect:
    """Canonical series spelled as ``engine`` exposes them, from its adapter's mapping rows (the
    first source name of each row; canonical labels and values mapped back to the engine's own)."""
    rows: dict[V.MetricSpec, Row] = {}
    for row in builtin_registry().get(engine).rows:
        rows.setdefault(row.metric, row)

    def spell(spec: V.MetricSpec, labels: dict[str, str]) -> tuple[str, dict[str, str]] | None:
        row = rows.get(spec)
        if row is None:
            return None
        source = {canonical: raw for raw, canonical in row.labels.items()}
        out = {}
        for label, value in labels.items():
            raw = V.LABEL_LE if label == V.LABEL_LE else source.get(label)
            if raw is None:
                continue  # a label the exporter adds itself (engine)
            values = row.values.get(raw)
            out[raw] = next(r for r, c in values.items() if c == value) if values else value
        return row.sources[0], out

    return spell


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def exposition(replica: Replica, spec: SLOFile, vocabulary: V.Vocabulary, dialect: Dialect, n: float) -> str:
    """The page of ``replica`` after ``n`` requests."""
    base = {V.LABEL_ENGINE: V.ENGINE_VLLM, V.LABEL_MODEL: replica.model, V.LABEL_DP_RANK: "0"}
    out: list[str] = []

    def family(metric: V.MetricSpec, samples: list[tuple[str, dict[str, str], float]]) -> None:
        spelled = [(dialect(metric, {**base, **extra}), suffix, value) for suffix, extra, value in samples]
        first = spelled[0][0]
        if first is None:
            return
        out.append(f"# TYPE {first[0]} {metric.kind.value}")
        for named, suffix, value in spelled:
            assert named is not None
            out.append(f"{named[0]}{suffix}{_labels(named[1])} {V.format_value(value)}")

    thresholds: dict[str, dict[float, float]] = {}
    errors = 0.0
    for slo in spec.slos:
        if slo.indicator.latency:
            lat = slo.indicator.latency
            thresholds.setdefault(lat.metric, {})[lat.threshold_seconds] = 1 - share(replica, slo)
        else:
            errors = share(replica, slo)
    for key, anchors in thresholds.items():
        metric = V.metric_by_key(key)
        cdf = cumulative(vocabulary.buckets(metric), anchors)
        samples = [
            ("_bucket", {V.LABEL_LE: le}, n * c) for le, c in zip(vocabulary.le_strings(metric), cdf, strict=True)
        ]
        samples += [("_sum", {}, n * min(anchors) / 2), ("_count", {}, n)]
        family(metric, samples)
    family(
        V.REQUESTS,
        [
            ("", {V.LABEL_OUTCOME: V.OUTCOME_STOP}, n * (1 - errors)),
            ("", {V.LABEL_OUTCOME: V.OUTCOME_ERROR}, n * errors),
        ],
    )
    family(V.PROMPT_TOKENS, [("", {}, 200 * n)])
    family(V.GENERATION_TOKENS, [("", {}, 100 * n)])
    family(V.PREEMPTIONS, [("", {}, 0.0)])
    family(V.REQUESTS_RUNNING, [("", {}, 4.0)])
    family(V.REQUESTS_WAITING, [("", {}, 0.0)])
    family(V.KV_CACHE_USAGE, [("", {}, 0.5)])
    if dialect is canonical_dialect:  # what an exporter says about itself
        out.append(f"# TYPE {V.EXPORTER_UP.name} gauge")
        up = {V.LABEL_TARGET: replica.name, V.LABEL_ENGINE: V.ENGINE_VLLM}
        out.append(f"{V.EXPORTER_UP.name}{_labels(up)} 1.0")
    return "\n".join(out) + "\n"


def read_by_slos(spec: SLOFile) -> Callable[[str, dict[str, str]], bool]:
    """Whether a canonical sample is one the SLOs read: a latency histogram's count and its bucket at
    the threshold, the requests by outcome."""
    names, buckets = set(), set()
    for slo in spec.slos:
        lat = slo.indicator.latency
        if lat is None:
            names.add(V.REQUESTS.name)
            continue
        metric = V.metric_by_key(lat.metric)
        names.add(f"{metric.name}_count")
        buckets.add((f"{metric.name}_bucket", V.format_le(lat.threshold_seconds)))
    return lambda name, labels: name in names or (name, labels.get(V.LABEL_LE)) in buckets


SAMPLE = re.compile(r"^([^{\s]+)\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def history(
    targets: dict[str, Replica],
    spec: SLOFile,
    vocabulary: V.Vocabulary,
    t0: float,
    times: list[float],
    extra: Callable[[str], dict[str, str]],
    openmetrics: bool,
) -> str:
    """The samples the SLOs read of every target at ``times``, labelled as its scraper stores them
    (``job``, ``instance`` and ``extra(instance)``): OpenMetrics (seconds) for promtool, else the
    Prometheus text format with milliseconds for VictoriaMetrics."""
    wanted = read_by_slos(spec)
    out: list[str] = []
    for address, replica in targets.items():
        page = exposition(replica, spec, vocabulary, canonical_dialect, 1.0)  # values per request served
        for line in page.splitlines():
            m = SAMPLE.match(line)
            if not m:
                continue
            name, per_request = m.group(1), float(m.group(3))
            labels = dict(LABEL.findall(m.group(2)))
            if not wanted(name, labels):
                continue
            series = name + _labels({"job": EXPORTERS_JOB, "instance": address, **extra(address), **labels})
            for t in times:
                value = V.format_value(per_request * replica.rate * (t - t0))
                out.append(f"{series} {value} {t:.3f}" if openmetrics else f"{series} {value} {round(t * 1000)}")
    if openmetrics:
        out.append("# EOF")
    return "\n".join(out) + "\n"


@contextmanager
def serving(render: Callable[[], str]) -> Iterator[str]:
    """``render()`` at ``/metrics`` (and a version at ``/version``) on 127.0.0.1; yields ``host:port``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, kind, status = render().encode(), "text/plain; version=0.0.4; charset=utf-8", 200
            elif path == "/version":
                body, kind, status = b'{"version": "0.0.0+synthetic"}', "application/json", 200
            else:
                body, kind, status = b"not found\n", "text/plain", 404
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a scraper stopping mid-answer
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving_http(Handler) as address:
        yield address


# --- the rules, read from rules.yml ---------------------------------------------------------------
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    return sum(int(n) * SECONDS[unit] for n, unit in DURATION.findall(duration))


@dataclass(frozen=True)
class Recording:
    name: str
    labels: Key
    expr: str
    group: str
    interval_s: float
    """of its group (the evaluation interval, 1 s here, when the group has none)."""
    depth: int = 0
    """how many recordings of its own group it is built on, one on top of the other (0: none)."""

    def owns(self, key: Key) -> bool:
        labels = dict(key)
        return labels.get("__name__") == self.name and all(labels.get(k) == v for k, v in self.labels)

    @property
    def kind(self) -> str:
        """``ratio`` (scale-free: the operation part of the name says so), ``rate`` (has a range), or ``constant``."""
        if "ratio" in self.name.rsplit(":", 1)[-1]:
            return "ratio"
        return "rate" if self.windows else "constant"

    @property
    def windows(self) -> list[float]:
        return [seconds(w) for w in re.findall(r"\[([0-9smhdwy]+)\]", self.expr)]

    @property
    def label(self) -> str:
        return self.name + _labels(dict(self.labels))


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def recordings_of_rules() -> list[Recording]:
    """Every recording rule of rules.yml, with its depth: vmalert reads a rule's inputs from the
    datasource, where the recordings of the same evaluation have not arrived yet, so a recording
    built on another of its group gets a value one evaluation later (Prometheus: the same one)."""
    out = []
    for g in rule_groups():
        depths: dict[str, int] = {}
        for r in (r for r in g["rules"] if "record" in r):
            inputs = [d for name, d in depths.items() if re.search(re.escape(name) + r"(?![\w:])", r["expr"])]
            labels = tuple(sorted(r.get("labels", {}).items()))
            depth = 1 + max(inputs) if inputs else 0
            out.append(Recording(r["record"], labels, r["expr"], g["name"], seconds(g.get("interval", "1s")), depth))
            depths[r["record"]] = max(depth, depths.get(r["record"], 0))
    return out


def recording_of(key: Key, rules: list[Recording]) -> Recording:
    return next(r for r in rules if r.owns(key))


def fast(rules: list[Recording]) -> list[Recording]:
    """The recordings of groups evaluated at least every ``FAST_GROUP_S``."""
    return [r for r in rules if r.interval_s <= FAST_GROUP_S]


def recordings_timeout(rules: list[Recording]) -> float:
    """How long vmalert may take to record all of ``fast(rules)``: its first evaluation of a group
    comes up to one interval after it starts, then one more evaluation per level of depth."""
    return max((r.depth + 2) * r.interval_s for r in fast(rules)) + 15.0


# --- processes ------------------------------------------------------------------------------------
def eventually(check: Callable[[], T | None], timeout: float, what: Callable[[], str], every: float = 0.5) -> T:
    """The first truthy answer of ``check()`` within ``timeout`` seconds; else fail saying ``what()``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except httpx.HTTPError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what()}")
        time.sleep(every)


def alert_key(labels: dict[str, str]) -> Key:
    """An alert's identity across Prometheus and vmalert: its labels without vmalert's ``alertgroup``."""
    return tuple(sorted((k, v) for k, v in labels.items() if k != "alertgroup"))


@dataclass
class Arrivals:
    """When each alert was first seen at Alertmanager, by who sent it (a watcher thread polls its API)."""

    alertmanager: str
    vmalert: str
    seen: dict[tuple[str, Key], tuple[float, dict[str, Any]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def source(self, alert: dict[str, Any]) -> str:
        return VMALERT if str(alert.get("generatorURL", "")).startswith(self.vmalert) else "prometheus"

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                alerts = httpx.get(f"{self.alertmanager}/api/v2/alerts", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                continue
            now = time.time()
            with self.lock:
                for alert in alerts:
                    self.seen.setdefault((self.source(alert), alert_key(alert["labels"])), (now, alert))

    def of(self, source: str) -> dict[Key, tuple[float, dict[str, Any]]]:
        with self.lock:
            return {key: v for (src, key), v in self.seen.items() if src == source}


@dataclass
class Scale:
    procs: Processes
    prometheus: str
    vm_prometheus: str
    """the VictoriaMetrics Prometheus remote-writes to."""
    vm: str
    """the VictoriaMetrics the vmagents and vmalert write to, and vmalert reads."""
    vmagents: list[str]
    vmalert: str
    alertmanager: str
    sink: Sink
    targets: dict[str, Replica]
    """scrape address (``instance``) -> replica."""
    owners: dict[str, str]
    """scrape address -> the vmagent (its number) scraping it, as the vmagents said at start."""
    scraping: float
    """wall-clock time by which every scraper had scraped every target."""
    started: dict[str, float]
    """wall-clock time when Prometheus and vmalert were started."""
    arrivals: Arrivals
    spec: SLOFile
    figures: dict[str, Any]

    def logs(self, *names: str) -> str:
        return "\n".join(f"--- {n} ---\n{self.procs.log(n)}" for n in names)


def vmagent_targets(url: str) -> set[str]:
    active = httpx.get(f"{url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    return {t["labels"]["instance"] for t in active if t["labels"].get("job") == EXPORTERS_JOB}


@pytest.fixture(scope="module")
def scale(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scale]:
    prometheus_bin, promtool = require_tool("prometheus"), require_tool("promtool")
    alertmanager_bin = require_tool("prometheus-alertmanager")
    vm_bin, vmagent_bin, vmalert_bin = (require_binary(n) for n in (VICTORIA_METRICS, VMAGENT, VMALERT))
    tmp = tmp_path_factory.mktemp("scale")
    vocabulary = V.Vocabulary()
    spec = load(SLO_FILE, vocabulary)
    t0 = time.time() - ENGINE_UPTIME_S
    procs = Processes(tmp / "logs", cwd=ROOT)
    figures: dict[str, Any] = {"commands": {}}
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(running_sink())
        stack.callback(procs.close)  # after the watcher and the pages stop, before the sink goes
        targets: dict[str, Replica] = {}
        for replica in FLEET:
            dialect = canonical_dialect if replica.dialect == CANONICAL else engine_dialect(replica.dialect)

            def render(r: Replica = replica, d: Dialect = dialect) -> str:
                return exposition(r, spec, vocabulary, d, r.rate * (time.time() - t0))

            page = stack.enter_context(serving(render))
            if replica.dialect == CANONICAL:
                targets[page] = replica
                continue
            address = f"127.0.0.1:{free_port()}"
            procs.spawn(f"exporter-{replica.name}", exporter_cmd(replica.dialect, f"http://{page}", address))
            targets[address] = replica

        vm_prometheus, vm = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        for name, url in (("vm-prometheus", vm_prometheus), ("vm", vm)):
            cmd = victoria_metrics_cmd(vm_bin, tmp / name, int(url.rsplit(":", 1)[1]))
            procs.spawn(name, cmd)
            figures["commands"]["victoria-metrics"] = _shown(cmd, tmp)

        am_port = free_port()
        alertmanager = f"http://127.0.0.1:{am_port}"
        routed = spec.alerts.model_copy(update={"webhook_url": sink.url + WEBHOOK_PATH, **ROUTE_TIMINGS})
        am_config = tmp / "alertmanager.yml"
        am_config.write_text(
            generate_alerts(spec.model_copy(update={"alerts": routed}), vocabulary)["alertmanager.yml"]
        )
        procs.spawn("alertmanager", alertmanager_cmd(alertmanager_bin, am_config, tmp / "alertmanager", am_port))

        prom_port = free_port()
        prometheus = f"http://127.0.0.1:{prom_port}"
        layout = Layout(
            exporters=tuple(Exporter(address) for address in targets),
            prometheus=f"127.0.0.1:{prom_port}",
            alertmanager=f"127.0.0.1:{am_port}",
            collector=f"127.0.0.1:{free_port()}",  # no collector here: that target is down
            scrape_interval="1s",
            evaluation_interval="1s",
            remote_write=vm_prometheus + WRITE_PATH,
        )
        config_dir = tmp / "prometheus"
        (config_dir / "targets").mkdir(parents=True)
        config = config_dir / "prometheus.yml"
        generated = prometheus_config(layout)
        del generated["alerting"]  # Alertmanager hears vmalert only
        config.write_text(yaml.safe_dump(generated, sort_keys=False))
        (config_dir / "targets" / "exporters.yml").write_text(yaml.safe_dump(exporter_targets(layout)))
        shutil.copyfile(RULES, config_dir / "rules.yml")

        for name, url in (("vm-prometheus", vm_prometheus), ("vm", vm)):
            procs.wait_http(name, url + HEALTH_PATH, READY_TIMEOUT_S)
        procs.wait_http("alertmanager", f"{alertmanager}/-/ready", READY_TIMEOUT_S)
        for address, replica in targets.items():
            if replica.dialect != CANONICAL:
                procs.wait_http(f"exporter-{replica.name}", f"http://{address}/metrics", READY_TIMEOUT_S)

        # history, part 1: into Prometheus' storage before it starts
        end = float(int(time.time()))
        times = [end - HISTORY_S + i for i in range(HISTORY_S)]
        openmetrics = tmp / "history.om"
        openmetrics.write_text(history(targets, spec, vocabulary, t0, times, lambda _: {}, openmetrics=True))
        data = tmp / "prometheus-data"
        created = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert created.returncode == 0, created.stdout + created.stderr

        # on SIGTERM Prometheus waits up to --storage.remote.flush-deadline (1 min) for VictoriaMetrics,
        # which is stopping too
        prom_cmd = [*prometheus_cmd(prometheus_bin, config, data, prom_port), "--storage.remote.flush-deadline=2s"]
        procs.spawn("prometheus", prom_cmd)
        started = {"prometheus": time.time()}
        figures["commands"]["prometheus"] = _shown(prom_cmd, tmp)
        vmagents = []
        for member in range(SCRAPERS):
            port = free_port()
            vmagents.append(f"http://127.0.0.1:{port}")
            cmd = vmagent_cmd(
                vmagent_bin,
                config,
                tmp / f"vmagent-{member}",
                port,
                vm + WRITE_PATH,
                members=SCRAPERS,
                member=member,
                labels={SHARD_LABEL: str(member)},
            )
            procs.spawn(f"vmagent-{member}", cmd)
            figures["commands"][f"vmagent-{member}"] = _shown(cmd, tmp)
        procs.wait_http("prometheus", f"{prometheus}/-/ready", READY_TIMEOUT_S)
        for member, url in enumerate(vmagents):
            procs.wait_http(f"vmagent-{member}", url + HEALTH_PATH, READY_TIMEOUT_S)

        # history, part 2: into VictoriaMetrics, labelled with the vmagent that scrapes each target
        def assigned() -> dict[str, str] | None:
            owners = {address: str(m) for m, url in enumerate(vmagents) for address in vmagent_targets(url)}
            return owners if set(owners) == set(targets) else None

        owners = eventually(assigned, READY_TIMEOUT_S, lambda: "the vmagents do not list every target")
        text = history(targets, spec, vocabulary, t0, times, lambda a: {SHARD_LABEL: owners[a]}, openmetrics=False)
        import_prometheus(vm, text)
        written = len(text.splitlines()) // HISTORY_S
        eventually(
            lambda: _count(vm, f'{{job="{EXPORTERS_JOB}"}}', end - 1) == written,
            READY_TIMEOUT_S,
            lambda: f"the history ({written} series) is not searchable in VictoriaMetrics",
        )
        figures["history"] = {"seconds": HISTORY_S, "series": written, "samples": written * HISTORY_S}

        vmalert_port = free_port()
        vmalert = f"http://127.0.0.1:{vmalert_port}"
        cmd = vmalert_cmd(vmalert_bin, [RULES], vmalert_port, datasource=vm, remote_write=vm, notifier=alertmanager)
        procs.spawn("vmalert", cmd)
        started[VMALERT] = time.time()
        figures["commands"]["vmalert"] = _shown(cmd, tmp)
        procs.wait_http("vmalert", vmalert + HEALTH_PATH, READY_TIMEOUT_S)

        def scraped() -> bool:
            up = f'up{{job="{EXPORTERS_JOB}"}} == 1'
            return len(query(prometheus, up)) == len(targets) and len(query(vm, up)) == len(targets)

        eventually(scraped, READY_TIMEOUT_S, lambda: procs.log("prometheus") + procs.log("vm"))
        figures["setup_s"] = round(time.monotonic() - began, 1)
        arrivals = Arrivals(alertmanager, vmalert)
        watcher = threading.Thread(target=arrivals.run, daemon=True)
        watcher.start()
        stack.callback(watcher.join, 5)
        stack.callback(arrivals.stop.set)

        yield Scale(
            procs=procs,
            prometheus=prometheus,
            vm_prometheus=vm_prometheus,
            vm=vm,
            vmagents=vmagents,
            vmalert=vmalert,
            alertmanager=alertmanager,
            sink=sink,
            targets=targets,
            owners=owners,
            scraping=time.time(),
            started=started,
            arrivals=arrivals,
            spec=spec,
            figures=figures,
        )
        _keep(figures)


def _count(base: str, selector: str, at: float) -> int:
    result = query(base, f"count({selector})", at)
    return int(float(result[0]["value"][1])) if result else 0


def _shown(cmd: list[str], tmp: Path) -> str:
    """A command line as documentation: no paths of this machine."""
    out = []
    for arg in cmd:
        arg = arg.replace(str(tmp) + "/", "").replace(str(ROOT) + "/", "")
        out.append(os.path.basename(arg) if arg.startswith("/") else arg)
    return " ".join(out)


def _keep(figures: dict[str, Any]) -> None:
    text = json.dumps(figures, indent=2, sort_keys=True)
    print(f"\nscale-metrics figures:\n{text}")
    artifacts = os.environ.get(ARTIFACTS_ENV)
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        (Path(artifacts) / "scale-metrics.json").write_text(text + "\n")


# --- the tests ------------------------------------------------------------------------------------
def test_vmalert_accepts_the_generated_rules(tmp_path: Path) -> None:
    """``vmalert -dryRun`` parses every expression of rules.yml with MetricsQL and every template."""
    vmalert = require_binary(VMALERT)
    result = vmalert_check_rules(vmalert, [RULES])
    assert result.returncode == 0, result.stdout + result.stderr
    # the check is real: a broken expression and an unknown template function are refused
    rules = [r for g in rule_groups() for r in g["rules"]]
    record = next(r for r in rules if "record" in r)
    alert = next(r for r in rules if "alert" in r)
    broken = {
        "bad-expr.yml": {**record, "expr": record["expr"] + " by"},
        "bad-template.yml": {**alert, "annotations": {"summary": "{{ $value | nosuch }}"}},
    }
    for name, rule in broken.items():
        (tmp_path / name).write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
        refused = vmalert_check_rules(vmalert, [tmp_path / name])
        assert refused.returncode != 0, f"{name} was accepted:\n{refused.stdout}{refused.stderr}"


def exporter_series(base: str) -> dict[Key, float]:
    """Per instance of the exporters' job, how many series it has (without the scrapers' ``up``/``scrape_*``)."""
    expr = f'count by (instance) ({{job="{EXPORTERS_JOB}", __name__!~"up|scrape_.+"}})'
    return labelled_values(query(base, expr))


def test_prometheus_remote_writes_the_fleet_to_victoria_metrics(scale: Scale) -> None:
    state: dict[str, Any] = {}

    def same() -> dict[Key, float] | None:
        state["prometheus"], state["victoria"] = exporter_series(scale.prometheus), exporter_series(scale.vm_prometheus)
        ok = len(state["prometheus"]) == len(scale.targets) and state["prometheus"] == state["victoria"]
        return state["prometheus"] if ok else None

    per_instance = eventually(
        same, READY_TIMEOUT_S, lambda: f"{state}\n{scale.logs('prometheus', 'vm-prometheus')}", every=1.0
    )
    assert {dict(k)["instance"] for k in per_instance} == set(scale.targets)
    scale.figures["prometheus_remote_write"] = {"targets": len(per_instance), "series": int(sum(per_instance.values()))}


def test_each_target_is_scraped_by_exactly_one_vmagent(scale: Scale) -> None:
    job = f'job="{EXPORTERS_JOB}"'
    state: dict[str, Any] = {}

    def members() -> dict[str, set[str]] | None:
        got = query(scale.vm, f"count by (instance, {SHARD_LABEL}) (up{{{job}}} == 1)")
        by_instance: dict[str, set[str]] = {}
        for s in got:
            by_instance.setdefault(s["metric"]["instance"], set()).add(s["metric"][SHARD_LABEL])
        state["members"] = by_instance
        return by_instance if set(by_instance) == set(scale.targets) else None

    names = [f"vmagent-{i}" for i in range(SCRAPERS)]
    by_instance = eventually(members, READY_TIMEOUT_S, lambda: f"{state}\n{scale.logs('vm', *names)}")
    assert all(len(m) == 1 for m in by_instance.values()), f"a target scraped by several vmagents: {by_instance}"
    owner = {instance: next(iter(m)) for instance, m in by_instance.items()}
    assert owner == scale.owners  # the members' own lists of targets, at start
    for member, url in enumerate(scale.vmagents):  # and now
        assert vmagent_targets(url) == {i for i, m in owner.items() if m == str(member)}, member

    # nothing was lost: the sharded store holds every series Prometheus holds, per target
    def complete() -> dict[Key, float] | None:
        state["prometheus"], state["victoria"] = exporter_series(scale.prometheus), exporter_series(scale.vm)
        return state["victoria"] if state["victoria"] == state["prometheus"] else None

    per_instance = eventually(complete, READY_TIMEOUT_S, lambda: str(state))
    series = labelled_values(query(scale.vm, f"count by ({SHARD_LABEL}) ({{{job}}})"))
    scale.figures["sharding"] = {
        "scrapers": SCRAPERS,
        "targets": len(owner),
        "targets_per_member": {m: sum(1 for o in owner.values() if o == m) for m in sorted(set(owner.values()))},
        "series_per_member": {dict(k)[SHARD_LABEL]: int(v) for k, v in sorted(series.items())},
        "series_per_target": sorted({int(v) for v in per_instance.values()}),
    }


Samples = dict[Key, list[tuple[float, float]]]


def recorded(base: str, at: float, rules: list[Recording], window: str = "2m") -> Samples:
    """The raw samples of every recording of ``rules`` in the ``window`` up to ``at``."""
    names = sorted({r.name for r in rules})
    selector = '{__name__=~"' + "|".join(re.escape(n) for n in names) + '"}[' + window + "]"
    r = httpx.get(f"{base}/api/v1/query", params={"query": selector, "time": f"{at:.3f}"}, timeout=30)
    body = r.json()
    assert body.get("status") == "success", body
    return {
        tuple(sorted(s["metric"].items())): [(float(t), float(v)) for t, v in s["values"]]
        for s in body["data"]["result"]
    }


def incomplete(samples: Samples, rules: list[Recording], fresh_after: float) -> list[str]:
    """Why ``samples`` lack a recording of ``rules`` (for every model where it is per model) from an
    evaluation after ``fresh_after``: nothing when they are complete."""
    models: dict[Recording, set[str | None]] = {}
    stale = []
    for key, values in samples.items():
        rule = recording_of(key, rules)
        if values[-1][0] < fresh_after:
            stale.append(f"{dict(key)} evaluated {fresh_after - values[-1][0]:.1f} s too early")
        models.setdefault(rule, set()).add(dict(key).get(V.LABEL_MODEL))
    missing = [f"no {r.label}" for r in rules if r not in models]
    partial = [f"{r.label} for {sorted(map(str, m))}" for r, m in models.items() if m not in ({None}, set(MODELS))]
    return missing + partial + stale


def lag_by_depth(samples: Samples, rules: list[Recording]) -> dict[str, float]:
    """Per depth, how long after the first recording of its group a recording first had a value."""
    first: dict[Key, float] = {key: values[0][0] for key, values in samples.items()}
    start: dict[str, float] = {}
    for key, t in first.items():
        rule = recording_of(key, rules)
        if rule.depth == 0:
            start[rule.group] = min(t, start.get(rule.group, t))
    out: dict[str, float] = {}
    for key, t in first.items():
        rule = recording_of(key, rules)
        if rule.group in start and rule.interval_s <= FAST_GROUP_S:
            out[str(rule.depth)] = round(max(t - start[rule.group], out.get(str(rule.depth), 0.0)), 1)
    return dict(sorted(out.items()))


def relative(a: float, b: float) -> float:
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


def tolerance(rule: Recording, model: str | None) -> float | None:
    """The relative tolerance for ``rule`` on ``model`` (see the module's docstring); None: not comparable."""
    if rule.kind == "rate":
        return RATE_TOLERANCE if max(rule.windows) <= HISTORY_S - 30 else None
    if model is not None and model not in EXACT_MODELS:
        return MIXED_TOLERANCE
    return CHAINED_TOLERANCE if rule.depth else EXACT_TOLERANCE


def test_recording_rules_agree(scale: Scale) -> None:
    rules = recordings_of_rules()
    quick = fast(rules)
    # Prometheus' evaluations must have live samples within a scrape interval of them (before its first
    # scrape it would extrapolate from the end of the history); VictoriaMetrics' slopes need no such thing
    fresh_after = {"prometheus": scale.scraping, "victoria": 0.0}
    state: dict[str, Any] = {}

    def lacking(side: str) -> list[str]:
        got = {k: v for k, v in state.get(side, {}).items() if recording_of(k, rules) in quick}
        return incomplete(got, quick, fresh_after[side])

    def ready() -> tuple[Samples, Samples, float] | None:
        at = time.time()
        state["prometheus"], state["victoria"] = recorded(scale.prometheus, at, rules), recorded(scale.vm, at, rules)
        ok = not lacking("prometheus") and not lacking("victoria")
        return (state["prometheus"], state["victoria"], at) if ok else None

    def missing() -> str:
        lines = []
        for side in ("prometheus", "victoria"):
            found = lacking(side)
            lines += [f"{side}: {len(state.get(side, {}))} series; {len(found)} problems:", *found[:20]]
        return "\n".join(lines) + "\n" + scale.logs("vmalert", "vm")

    prom, vm, at = eventually(ready, recordings_timeout(rules), missing, every=1.0)
    fast_keys = {k for k in set(prom) | set(vm) if recording_of(k, rules) in quick}
    assert fast_keys <= set(prom) & set(vm), (
        f"only Prometheus: {sorted(fast_keys - set(vm))}\nonly vmalert: {sorted(fast_keys - set(prom))}"
    )

    slos = {slo.name: slo for slo in scale.spec.slos}
    error_ratios = {V.SLO_PERIOD_ERROR_RATIO_RECORD, *(V.slo_error_ratio(w) for w in V.SLO_WINDOWS)}
    worst: dict[str, dict[str, float]] = {}
    problems, skipped = [], set()
    for key in sorted(set(prom) & set(vm)):
        labels = dict(key)
        rule, model = recording_of(key, rules), labels.get(V.LABEL_MODEL)
        p, v = prom[key][-1][1], vm[key][-1][1]
        allowed = tolerance(rule, model)
        if allowed is None:
            skipped.add(rule.name)
            continue
        diff = relative(p, v)
        group = f"{rule.kind}, {'mixed' if model == 'mixed' else 'depth ' + str(rule.depth)}"
        worst.setdefault(rule.name, {})[group] = max(worst.get(rule.name, {}).get(group, 0.0), diff)
        if not math.isfinite(p) or diff > allowed:
            problems.append(f"{labels}: Prometheus {p!r}, vmalert {v!r} (relative difference {diff:.3g})")
        if rule.name in error_ratios and model in EXACT_MODELS:
            designed = share(next(r for r in FLEET if r.model == model), slos[labels[V.SLO_LABEL]])
            for who, got in (("Prometheus", p), ("vmalert", v)):
                if relative(got, designed) > allowed:
                    problems.append(f"{labels}: {who} {got!r}, the fleet was built for {designed!r}")
    assert not problems, "\n".join(problems)

    # Prometheus' own recordings reached VictoriaMetrics through remote_write unchanged
    def forwarded() -> Samples | None:
        got = recorded(scale.vm_prometheus, at, rules)
        return got if set(got) >= {k for k in prom if k in fast_keys} else None

    copy = eventually(forwarded, READY_TIMEOUT_S, lambda: "Prometheus' recordings are missing in VictoriaMetrics")
    forwarding = 0.0
    for key, values in copy.items():
        mine = dict(prom.get(key, []))
        for t, value in values:
            if t in mine:
                forwarding = max(forwarding, relative(value, mine[t]))
            else:
                assert t < at - 110 or not mine, f"{dict(key)}: a sample at {t} that Prometheus does not have"
    assert forwarding <= FORWARDING_TOLERANCE, forwarding

    compared = set(prom) & set(vm)
    scale.figures["parity"] = {
        "recordings_in_rules": len(rules),
        "series_compared": len(compared) - sum(1 for k in compared if recording_of(k, rules).name in skipped),
        "not_evaluated_during_test": sorted(
            {r.label for r in rules if r not in quick} - {recording_of(k, rules).label for k in compared}
        ),
        "not_compared_window_longer_than_history": sorted(skipped),
        "first_value_after_group_start_s_by_depth": {
            side: lag_by_depth(recorded(base, at, rules, "10m"), rules)
            for side, base in (("prometheus", scale.prometheus), ("vmalert", scale.vm))
        },
        "max_depth": max(r.depth for r in quick),
        "max_evaluation_gap_s": round(max(abs(prom[k][-1][0] - vm[k][-1][0]) for k in compared), 3),
        "max_relative_difference": {n: {k: float(f"{d:.3g}") for k, d in w.items()} for n, w in sorted(worst.items())},
        "remote_write_max_relative_difference": forwarding,
        "tolerance": {
            "exact": EXACT_TOLERANCE,
            "chained": CHAINED_TOLERANCE,
            "mixed": MIXED_TOLERANCE,
            "rate": RATE_TOLERANCE,
        },
    }


def expected_alerts(spec: SLOFile) -> set[Key]:
    """The burn-rate alerts the fleet must fire: per burn rule of rules.yml, each model all of whose
    replicas burn that SLO's budget faster than the rule's factor."""
    slos = {s.name: s for s in spec.slos}
    pairs = {(p.long, p.short): p for p in BURN_PAIRS}
    out = set()
    for rule in (r for g in rule_groups() for r in g["rules"] if r.get("alert") == V.ALERT_SLO_BURN):
        labels = rule["labels"]
        slo = slos[labels[V.SLO_LABEL]]
        factor = float(burn_factor(pairs[(labels[V.LONG_WINDOW_LABEL], labels[V.SHORT_WINDOW_LABEL])], slo))
        for model in MODELS:
            burns = [r.latency_burn if slo.indicator.latency else r.error_burn for r in FLEET if r.model == model]
            assert min(burns) > factor or max(burns) < factor, (slo.name, model, factor)  # no borderline case
            if min(burns) > factor:
                out.add(alert_key({"alertname": rule["alert"], **labels, V.LABEL_MODEL: model}))
    return out


def firing(url: str) -> dict[Key, dict[str, Any]]:
    """The firing alerts of a Prometheus or vmalert rules API."""
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return {alert_key(a["labels"]): a for a in alerts if a["state"] == "firing"}


def parse_time(text: str) -> float:
    """RFC 3339 with up to nanoseconds (Go's format) as epoch seconds."""
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()


def test_a_burn_alert_from_vmalert_reaches_alertmanager(scale: Scale) -> None:
    expected = expected_alerts(scale.spec)
    assert len(expected) == len(BURN_PAIRS), expected  # the availability SLO of the burning model, every pair
    ours = scale.arrivals

    def arrived() -> dict[Key, tuple[float, dict[str, Any]]] | None:
        got = ours.of(VMALERT)
        return got if set(got) >= expected else None

    timeout = recordings_timeout(recordings_of_rules())
    at_am = eventually(arrived, timeout, lambda: f"{ours.of(VMALERT)}\n{scale.logs('vmalert')}")
    assert set(at_am) == expected
    assert all(a["labels"].get("alertgroup") for _, a in at_am.values())  # vmalert names its group

    vmalert_firing = firing(scale.vmalert)
    assert set(vmalert_firing) == expected

    def prometheus_fires() -> dict[Key, dict[str, Any]] | None:
        got = firing(scale.prometheus)
        return got if set(got) >= expected else None

    prom_firing = eventually(prometheus_fires, timeout, lambda: str(firing(scale.prometheus)))
    assert set(prom_firing) == expected, "Prometheus and vmalert fire different alerts"

    # the pages go on to the webhook (the tickets of the same SLO and model are inhibited by them)
    def notified() -> tuple[float, dict[str, Any]] | None:
        for got in list(scale.sink.received):
            for alert in got.body.get("alerts", []) if isinstance(got.body, dict) else []:
                if str(alert.get("generatorURL", "")).startswith(scale.vmalert):
                    return got.at, alert
        return None

    webhook_at, notified_alert = eventually(notified, READY_TIMEOUT_S, lambda: str(scale.sink.received))
    assert notified_alert["labels"][V.SEVERITY_LABEL] == V.SEVERITY_PAGE

    assert not ours.of("prometheus"), "Alertmanager got alerts from something else than vmalert"

    active = {k: parse_time(a["activeAt"]) for k, a in vmalert_firing.items()}
    first_at_am = min(t for t, _ in at_am.values())
    scale.figures["alert"] = {
        "alerts": sorted(f"{dict(k)[V.LONG_WINDOW_LABEL]}/{dict(k)[V.SHORT_WINDOW_LABEL]}" for k in expected),
        "prometheus_start_to_firing_s": round(
            min(parse_time(a["activeAt"]) for a in prom_firing.values()) - scale.started["prometheus"], 1
        ),
        "vmalert_start_to_firing_s": round(min(active.values()) - scale.started[VMALERT], 1),
        "start_to_firing_s_by_window_pair": {
            f"{dict(k)[V.LONG_WINDOW_LABEL]}/{dict(k)[V.SHORT_WINDOW_LABEL]}": {
                "prometheus": round(parse_time(prom_firing[k]["activeAt"]) - scale.started["prometheus"], 1),
                VMALERT: round(active[k] - scale.started[VMALERT], 1),
            }
            for k in sorted(expected)
        },
        "vmalert_firing_to_alertmanager_s": round(max(at_am[k][0] - active[k] for k in expected), 2),
        "vmalert_start_to_alertmanager_s": round(first_at_am - scale.started[VMALERT], 1),
        "alertmanager_to_webhook_s": round(webhook_at - first_at_am, 2),
    }
