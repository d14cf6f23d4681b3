"""The rollup job's own process (inferwatch.collector.stats.rollup_process): it folds, stops when asked, and
ends when its collector is killed without stopping it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from inferwatch.collector.stats import rollup
from inferwatch.collector.store import db, inserts
from inferwatch.collector.store.tables import ROLLUP_STATE_TABLE
from tests.conftest import ROOT
from tests.test_stats_rollups import make_rows


def gone(pid: int) -> bool:
    """The process has ended (or is a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].startswith("Z")


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "unwatched"])
def test_the_process_folds_and_stops_when_asked(tmp_path: Path, watched: bool) -> None:
    """With a watch or without, it ignores SIGTERM and SIGINT (the collector's to act on) and ends when asked."""
    from inferwatch.collector.ingest.prepare import exit_with
    from inferwatch.collector.stats.rollup_process import RollupProcess

    url = db.default_url(tmp_path)
    engine = db.make_engine(url)
    db.ensure_schema(engine)
    inserts.insert_records(engine, make_rows(300))
    job = RollupProcess(url, db.DbTimeouts(), interval=0.05, watch=exit_with if watched else None)
    job.start()
    try:
        pid = job._process.pid
        assert pid != os.getpid()
        deadline = time.monotonic() + 30
        folded = 0
        while folded < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
            with engine.connect() as conn:
                folded = conn.execute(select(func.max(ROLLUP_STATE_TABLE.c.folded_id))).scalar_one() or 0
        assert folded == 300
        for sig in (signal.SIGTERM, signal.SIGINT):  # ignored: the group's signal must not end it under the collector
            os.kill(pid, sig)
        time.sleep(0.3)
        assert not gone(pid)
    finally:
        started = time.monotonic()
        job.stop()
    assert gone(pid) and time.monotonic() - started < 5  # asked, it ends after its pass, not at the grace's end
    engine.dispose()


def test_the_process_ends_with_its_collector(tmp_path: Path) -> None:
    """A collector killed -9 (no stop) leaves no rollup process behind."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from inferwatch.collector.ingest.prepare import exit_with
        from inferwatch.collector.stats.rollup_process import RollupProcess
        from inferwatch.collector.store import db
        url = db.default_url(Path({str(tmp_path)!r}))
        db.ensure_schema(db.make_engine(url))
        job = RollupProcess(url, db.DbTimeouts(), interval=0.05, watch=exit_with)
        job.start()
        print(job._process.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 30  # named once it has started its job
        while Path(f"/proc/{child}/comm").read_text().strip() != rollup.THREAD_NAME:
            assert time.monotonic() < deadline and not gone(child)
            time.sleep(0.05)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(child)
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
