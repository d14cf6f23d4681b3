"""The spool against a model: every record it acknowledged comes back, exactly once, in order, at any size.

A hypothesis state machine drives one :class:`~inferwatch.collector.store.spool.Spool` with small segments
(a few records each, so segments close all the time) through the calls the writer makes, in any
order: append (write + fsync), read back from the cursor, commit a mark read before, ``finish`` (empty
the spool once all of it is committed), ``rewind`` (replay from the last commit after a failed write),
and a crash (the object dropped without ``close``, a new one opened on the same files, and everything
it holds replayed as the writer does at start).

The model is the sequence of acknowledged records. It says what each read must return: the records
from the cursor on, exactly once and in order; after a crash, every record not committed must come
back exactly once, and only records already committed (in the database, so harmless: inserts are
idempotent) may come back a second time, as a contiguous run just before them.

Found by this model before the fix: a segment emptied by ``finish`` and then filled past its size was
read from byte 0 of its logical start, skipping the first records, and the read then looped forever.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.rows import record_to_json
from inferwatch.collector.store.spool import Mark, Spool

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
READ_DEADLINE_S = 10.0
"""A read that has not returned by then is taken for the endless loop the bug caused."""


def line(i: int, pad: int) -> str:
    record = RequestRecord(
        trace_id=f"{1:032x}",
        span_id=f"{i + 1:016x}",
        engine="vllm",
        start_time=T0 + timedelta(milliseconds=i),
        end_time=T0 + timedelta(milliseconds=i, seconds=1),
        request_id=f"req-{i}-" + "x" * pad,
    )
    return record_to_json(record)


def number(record: RequestRecord) -> int:
    return int(record.span_id, 16) - 1


def bounded_read(spool: Spool, limit: int) -> tuple[list[RequestRecord], Mark]:
    """``spool.read(limit)`` in a thread: a read that never returns fails the test instead of hanging it."""
    out: list[tuple[list[RequestRecord], Mark]] = []
    thread = threading.Thread(target=lambda: out.append(spool.read(limit)), daemon=True)
    thread.start()
    thread.join(READ_DEADLINE_S)
    assert out, f"spool.read({limit}) did not return within {READ_DEADLINE_S} s (an endless loop)"
    return out[0]


class SpoolModel(RuleBasedStateMachine):
    """One spool in a fresh directory; ``acked`` is every record appended (each append is fsync'd)."""

    def __init__(self) -> None:
        super().__init__()
        self.dir: Path | None = None
        self.spool: Spool | None = None
        self.segment_bytes = 0
        self.acked: list[int] = []
        self.cursor = 0
        """position in ``acked`` of the next record a read must return."""
        self.committed = 0
        """position up to which the spool believes its records are committed."""
        self.in_db = 0
        """position up to which records were ever committed (in the database): only these may come back twice."""
        self.finished_at = 0
        """position of the last ``finish`` that succeeded: nothing before it can ever come back."""
        self.marks: list[tuple[Mark, int]] = []
        """marks returned by reads since the last crash, rewind or finish, with the position they stand for."""
        self.crashes = 0
        self.segments_closed = 0

    @initialize(tmp=st.integers(0, 10**9), segment_bytes=st.integers(600, 4000))
    def open(self, tmp: int, segment_bytes: int) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix=f"spool-{tmp}-"))
        self.segment_bytes = segment_bytes
        self.spool = Spool(self.dir / "spool.jsonl", segment_bytes)

    def teardown(self) -> None:
        import shutil

        if self.spool is not None:
            self.spool.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def s(self) -> Spool:
        assert self.spool is not None
        return self.spool

    # --- the writer's calls ---

    @rule(count=st.integers(1, 12), pad=st.integers(0, 300))
    def append(self, count: int, pad: int) -> None:
        first = len(self.acked)
        before = len(self.s._segments)
        self.s.append_lines([line(first + k, (pad * (k + 1)) % 301) for k in range(count)])
        self.acked.extend(range(first, first + count))
        self.segments_closed += max(0, len(self.s._segments) - before)

    @rule(limit=st.integers(1, 40))
    def read(self, limit: int) -> None:
        records, mark = bounded_read(self.s, limit)
        got = [number(r) for r in records]
        want = self.acked[self.cursor : self.cursor + limit]
        assert got == want, f"read({limit}) from position {self.cursor}: got {got}, the model says {want}"
        self.cursor += len(got)
        self.marks.append((mark, self.cursor))

    @precondition(lambda self: bool(self.marks))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        self.commit_mark(*data.draw(st.sampled_from(self.marks)))

    def commit_mark(self, mark: Mark, position: int) -> None:
        self.s.commit(mark)
        self.committed = max(self.committed, position)
        self.in_db = max(self.in_db, position)

    @rule(sync=st.booleans())
    def finish(self, sync: bool) -> None:
        done = self.s.finish(sync=sync)
        assert done == (self.committed == len(self.acked)), (
            f"finish() said {done} with {self.committed} of {len(self.acked)} records committed"
        )
        if done:
            self.cursor = self.committed = self.finished_at = len(self.acked)
            self.marks.clear()
            assert len(self.s._segments) == 1 and self.s.size() == 0

    @rule()
    def rewind(self) -> None:
        self.s.rewind()
        self.cursor = self.committed
        self.marks = [(m, p) for m, p in self.marks if p <= self.committed]

    @rule(limit=st.integers(1, 50), commit_replay=st.booleans())
    def crash_and_replay(self, limit: int, commit_replay: bool) -> None:
        """Drop the spool (its descriptor closed, nothing else: what a killed process leaves), open the files
        again and read all of them back, as the writer does at start; then commit that replay or not."""
        self.s.close()
        self.spool = Spool(self.s.path, self.segment_bytes)
        self.crashes += 1
        got: list[int] = []
        marks: list[tuple[Mark, int]] = []
        while True:
            records, mark = bounded_read(self.s, limit)
            if not records:
                break
            got.extend(number(r) for r in records)
            marks.append((mark, len(got)))
        if not got:
            assert self.committed == len(self.acked), "an acknowledged, uncommitted record did not come back"
            start = len(self.acked)
        else:
            start = got[0]
            assert got == self.acked[start:], f"the replay is not one run to the end: {got[:20]}..."
            assert self.finished_at <= start <= self.committed, (
                f"the replay starts at {start}: records before {self.finished_at} were emptied and must not "
                f"come back, records from {self.committed} on were not committed and must all come back"
            )
        self.marks = [(mark, start + n) for mark, n in marks]
        self.cursor = len(self.acked)
        self.committed = start
        if commit_replay and self.marks:
            self.commit_mark(*self.marks[-1])

    # --- always ---

    @invariant()
    def pending_is_what_is_not_committed(self) -> None:
        if self.spool is not None:
            assert self.s.pending() == (self.committed < len(self.acked))


def test_the_spool_returns_every_acknowledged_record_exactly_once() -> None:
    SpoolModel.TestCase.settings = settings(
        max_examples=150,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    SpoolModel.TestCase().runTest()


def test_a_segment_emptied_then_filled_past_its_size_reads_back_whole(tmp_path: Path) -> None:
    """The case the model found, spelled out: write 5 lines, commit, finish, append 60 lines (several
    segments of 2,000 bytes), rewind, read everything."""
    spool = Spool(tmp_path / "spool.jsonl", segment_bytes=2000)
    spool.append_lines([line(i, 40) for i in range(5)])
    records, mark = bounded_read(spool, 100)
    spool.commit(mark)
    assert spool.finish()
    for first in range(100, 160, 10):
        spool.append_lines([line(i, 40) for i in range(first, first + 10)])
    assert len(spool._segments) > 2
    spool.rewind()
    got: list[int] = []
    while records := bounded_read(spool, 7)[0]:
        got.extend(number(r) for r in records)
    assert got == list(range(100, 160))
    assert spool.corrupt == 0
    spool.close()
