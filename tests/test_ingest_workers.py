"""The collector's ingest worker processes outlive signals meant for the collector's process group.

A SIGTERM or Ctrl-C reaches every process of the group (``make demo`` stopping its children, a terminal, a
supervisor). Before, each worker died of it under the collector: the pool broke, the collector logged "an
ingest worker process died" and started new workers in the middle of its own shutdown, which outlived it
by a moment. The collector stops its workers itself.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from inferwatch.collector.ingest.otlp import PROTOBUF
from inferwatch.collector.ingest.pipeline import CollectorMetrics, Ingestor
from inferwatch.collector.store import db
from inferwatch.collector.store.writer import Writer

DIED = "an ingest worker process died"


def _ignores_sigterm(pid: int) -> bool:
    """Whether the worker has run its initializer (Linux: the SigIgn mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    mask = int(status.split("SigIgn:")[1].split()[0], 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_workers_ignore_the_groups_sigterm_and_sigint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = Writer(db.make_engine(db.default_url(tmp_path)), tmp_path / "spool.jsonl")
    ingestor = Ingestor(writer, CollectorMetrics(), processes=2)
    body = ExportTraceServiceRequest().SerializeToString()
    try:
        ingestor.prepare(body, PROTOBUF, None).result(timeout=60)  # the pool is up and has served
        pool = ingestor._pool
        assert pool is not None
        workers = list(pool._processes)  # the pool's worker pids
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        deadline = time.monotonic() + 30  # each worker runs its initializer as it starts
        while not all(_ignores_sigterm(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert all(_ignores_sigterm(pid) for pid in workers)
        with caplog.at_level(logging.ERROR, logger="inferwatch.collector"):
            for pid in workers:
                os.kill(pid, signal.SIGTERM)
                os.kill(pid, signal.SIGINT)
            time.sleep(0.5)
            assert all(_alive(pid) for pid in workers), "a worker died of a signal meant for the collector"
            ingestor.prepare(body, PROTOBUF, None).result(timeout=30)
            assert ingestor._pool is pool  # still the same pool: nothing broke
        assert DIED not in caplog.text
    finally:
        ingestor.close()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers), "close() leaves no worker behind"


def test_an_export_arriving_during_close_is_not_a_dead_worker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = Writer(db.make_engine(db.default_url(tmp_path)), tmp_path / "spool.jsonl")
    ingestor = Ingestor(writer, CollectorMetrics(), processes=1)
    body = ExportTraceServiceRequest().SerializeToString()
    ingestor.prepare(body, PROTOBUF, None).result(timeout=60)
    pool = ingestor._pool  # an export that took the pool just before close()
    assert pool is not None
    ingestor.close()
    with caplog.at_level(logging.ERROR, logger="inferwatch.collector"):
        ingestor._broken(pool)  # what prepare() does when the pool refuses the work
    assert DIED not in caplog.text
