"""What the durability and fault tests check a collector with: the spans its database holds, the lines of its spool,
one of its metrics, and a deadline to wait for any of them."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
from sqlalchemy import Engine, func, select

from inferwatch.collector.store.tables import REQUEST_TABLE
from tests.helpers import value

PB = "application/x-protobuf"


def stored_span_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {r[0] for r in conn.execute(select(REQUEST_TABLE.c.span_id))}


def row_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(REQUEST_TABLE)).scalar_one())


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``predicate`` held (polling); AssertionError after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def spool_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line] if path.exists() else []


def metric(http: httpx.Client, name: str) -> float:
    return value(http.get("/metrics").text, name)
