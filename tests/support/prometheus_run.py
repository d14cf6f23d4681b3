"""A real Prometheus for a test: on a free 127.0.0.1 port, over a backfilled history or scraping pages every
second, stopped when the test is done (``tests/support/stack.py`` holds the command and configuration)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from inferwatch.core import vocabulary as V
from tests.conftest import ROOT, free_port, require_tool
from tests.support.stack import Processes, prometheus_cmd, write_prometheus_config


def backfill(tmp: Path, openmetrics: str) -> Path:
    """``openmetrics`` (ending ``# EOF``) as TSDB blocks with ``promtool tsdb create-blocks-from openmetrics``."""
    promtool = require_tool("promtool")
    (tmp / "history.om").write_text(openmetrics)
    made = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"), str(tmp / "data")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    return tmp / "data"


@contextmanager
def running(tmp: Path, jobs: dict[str, list[str]] | None = None, data: Path | None = None) -> Iterator[str]:
    """Prometheus scraping ``jobs`` every second over ``data`` (default: an empty store under ``tmp``); yields
    its base URL once ready."""
    binary = require_tool("prometheus")
    procs = Processes(tmp / "logs", cwd=ROOT)
    try:
        port = free_port()
        write_prometheus_config(tmp / "prometheus.yml", jobs or {}, [])
        procs.spawn("prometheus", prometheus_cmd(binary, tmp / "prometheus.yml", data or tmp / "data", port))
        base = f"http://127.0.0.1:{port}"
        procs.wait_http("prometheus", f"{base}/-/ready")
        yield base
    finally:
        procs.close()


def wait_scraped(base: str, targets: int, times: int = 4, timeout: float = 30.0) -> bool:
    """Whether, within ``timeout``, Prometheus holds ``times`` scrapes of each of ``targets`` engine pages
    (rates over a minute's window then exist)."""
    deadline = time.monotonic() + timeout
    query = f"count(count_over_time({V.REQUESTS_RUNNING.name}[1m]) >= {times})"
    while time.monotonic() < deadline:
        result = httpx.get(f"{base}/api/v1/query", params={"query": query}, timeout=5).json()["data"]["result"]
        if result and float(result[0]["value"][1]) == targets:
            return True
        time.sleep(0.5)
    return False
