"""The span spool on small hand-computed scenarios (``mutation/spool.toml``): marks, segment roll-over,
reads across segments, commits, ``finish`` and a reopen after a crash.

Every record written here has the same JSON length, so each mark is a whole number of lines: with ``n``
the bytes of one line (its newline included), the k-th line of a segment ends at ``k * n``. Segments are
``spool.jsonl`` (number 0), then ``spool.jsonl.1``, ... (the :class:`Spool` docstring)."""

from __future__ import annotations

import faulthandler
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.rows import record_to_json
from inferwatch.collector.store.spool import Spool, append_lines

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def line(i: int) -> str:
    """Record ``i`` (0-999) as a spool line; every one is as long as the others."""
    record = RequestRecord(
        trace_id=f"{7:032x}",
        span_id=f"{i + 1:016x}",
        engine="vllm",
        start_time=T0 + timedelta(seconds=i % 10),
        end_time=T0 + timedelta(seconds=i % 10 + 1),
        request_id=f"req-{i:03d}",
    )
    return record_to_json(record)


N = len(line(0)) + 1
"""the bytes of one spooled line."""


def ids(records: list[RequestRecord]) -> list[int]:
    return [int(r.span_id, 16) - 1 for r in records]


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    # each test takes milliseconds: one still running after 15 s is an endless loop (a read that never
    # reaches its end, a sync that never sees its write durable), so the process ends instead of hanging
    faulthandler.dump_traceback_later(15, exit=True)
    yield tmp_path / "spool.jsonl"
    faulthandler.cancel_dump_traceback_later()


def test_all_lines_have_one_length() -> None:
    assert {len(line(i)) for i in range(0, 1000, 37)} == {N - 1}


def test_writes_give_marks_and_sequence_numbers(path: Path) -> None:
    s = Spool(path)
    assert s.write([line(0), line(1)]) == ((0, 2 * N), 1)
    seen: list[tuple[int, int]] = []
    assert s.write([line(2)], then=seen.append) == ((0, 3 * N), 2)
    assert seen == [(0, 3 * N)]
    s.sync(2)
    assert path.read_text() == "".join(line(i) + "\n" for i in range(3))
    assert s.size() == 3 * N
    s.close()


def test_a_segment_closes_when_it_reaches_its_size(path: Path) -> None:
    s = Spool(path, segment_bytes=2 * N)
    assert s.append_lines([line(0)]) == (0, N)
    assert s.append_lines([line(1)]) == (0, 2 * N)  # reaches 2n: closed, the next write starts segment 1
    assert s.append_lines([line(2)]) == (1, N)
    assert s.append_lines([line(3), line(4)]) == (1, 3 * N)  # past 2n: closed too
    assert s.append_lines([line(5)]) == (2, N)
    assert path.stat().st_size == 2 * N
    assert path.with_name("spool.jsonl.1").stat().st_size == 3 * N
    assert path.with_name("spool.jsonl.2").stat().st_size == N
    assert s.size() == 6 * N
    s.close()


def test_reads_cross_segments_in_order_and_stop_at_the_limit(path: Path) -> None:
    s = Spool(path, segment_bytes=2 * N)
    for i in range(5):
        s.append_lines([line(i)])  # segments: 0 = [0, 1], 1 = [2, 3], 2 = [4]
    records, mark = s.read(2)
    assert ids(records) == [0, 1]
    assert mark == (1, 0)  # the end of closed segment 0 is the start of segment 1
    records, mark = s.read(2)
    assert (ids(records), mark) == ([2, 3], (2, 0))
    records, mark = s.read(10)
    assert (ids(records), mark) == ([4], (2, N))
    assert s.read(10) == ([], (2, N))
    s.close()


def test_a_read_limit_of_one_in_the_middle_of_a_segment(path: Path) -> None:
    s = Spool(path)
    s.append_lines([line(0), line(1), line(2)])
    assert [(ids(r), m) for r, m in (s.read(1), s.read(1), s.read(1))] == [
        ([0], (0, N)),
        ([1], (0, 2 * N)),
        ([2], (0, 3 * N)),
    ]
    s.close()


def test_commit_deletes_the_segments_before_its_mark(path: Path) -> None:
    s = Spool(path, segment_bytes=2 * N)
    for i in range(5):
        s.append_lines([line(i)])
    seg1, seg2 = path.with_name("spool.jsonl.1"), path.with_name("spool.jsonl.2")
    assert s.pending()
    s.commit((0, N))  # inside segment 0: nothing deleted
    assert path.exists() and s.size() == 5 * N
    s.commit((0, 2 * N))  # the end of segment 0 is the start of segment 1: segment 0 goes
    assert not path.exists() and seg1.exists()
    assert s.size() == 3 * N
    s.commit((1, 0))  # the same place again: nothing more
    assert seg1.exists()
    records, _ = s.read(10)  # the cursor moved to the commit: reads go on from there
    assert ids(records) == [2, 3, 4]
    s.commit((2, N))
    assert not seg1.exists() and seg2.exists()
    assert not s.pending()
    s.commit((1, N))  # before the last commit: ignored
    assert not s.pending()
    s.close()


def test_rewind_reads_again_from_the_last_commit(path: Path) -> None:
    s = Spool(path)
    s.append_lines([line(i) for i in range(4)])
    _, mark = s.read(1)
    s.commit(mark)
    assert ids(s.read(2)[0]) == [1, 2]
    s.rewind()
    assert ids(s.read(10)[0]) == [1, 2, 3]
    s.close()


def test_pending_is_anything_written_after_the_commit(path: Path) -> None:
    s = Spool(path)
    assert not s.pending()
    s.append_lines([line(0)])
    assert s.pending()
    s.commit((0, N))
    assert not s.pending()
    s.append_lines([line(1)])
    assert s.pending()
    s.close()


def test_finish_empties_a_spool_whose_records_are_all_committed(path: Path) -> None:
    s = Spool(path, segment_bytes=2 * N)
    for i in range(3):
        s.append_lines([line(i)])  # segment 0 = [0, 1], segment 1 = [2]
    assert s.finish() is False  # nothing committed yet
    records, mark = s.read(10)
    assert mark == (1, N)
    s.commit((1, 0))
    assert s.finish() is False  # record 2 is not committed
    s.commit(mark)
    called = []
    assert s.finish(then=lambda: called.append(True)) is True
    assert called == [True]
    assert path.with_name("spool.jsonl.1").stat().st_size == 0 and not path.exists()
    assert s.size() == 0 and not s.pending()
    # marks go on from the logical end: a mark taken before finish never points at later bytes
    assert s.append_lines([line(3)]) == (1, 2 * N)
    assert s.pending()
    records, mark = s.read(10)
    assert (ids(records), mark) == ([3], (1, 2 * N))
    s.close()


def test_a_segment_emptied_then_filled_past_its_size_keeps_its_logical_start(path: Path) -> None:
    s = Spool(path, segment_bytes=2 * N)
    s.append_lines([line(0)])
    _, mark = s.read(10)
    s.commit(mark)
    assert s.finish(sync=False)
    assert s.append_lines([line(1)]) == (0, 2 * N)  # segment 0 again, from logical offset n
    assert s.append_lines([line(2)]) == (0, 3 * N)  # 2n bytes in it: closed
    assert s.append_lines([line(3)]) == (1, N)
    records, mark = s.read(10)
    assert (ids(records), mark) == ([1, 2, 3], (1, N))
    records, mark = s.read(10)
    assert (records, mark) == ([], (1, N))
    s.commit((1, 0))
    assert not path.exists()
    s.close()


def test_a_reopened_spool_replays_every_segment_from_the_start(path: Path) -> None:
    s = Spool(path, segment_bytes=2 * N)
    for i in range(5):
        s.append_lines([line(i)])
    path.with_name("spool.jsonl.rejected").write_text("not a segment\n")
    # a crash: the object is dropped without close, a new one opens the same files
    again = Spool(path, segment_bytes=2 * N)
    assert again.size() == 5 * N
    assert again.pending()
    records, mark = again.read(10)
    assert (ids(records), mark) == ([0, 1, 2, 3, 4], (2, N))
    assert again.append_lines([line(5)]) == (2, 2 * N)  # appends go on in the newest segment
    again.commit((2, 0))
    assert not path.exists() and not path.with_name("spool.jsonl.1").exists()
    s.close()
    again.close()


def test_a_spool_reopened_after_its_only_segment_was_committed(path: Path) -> None:
    s = Spool(path, segment_bytes=2 * N)
    for i in range(3):
        s.append_lines([line(i)])
    s.commit((1, 0))
    s.close()
    again = Spool(path, segment_bytes=2 * N)  # only spool.jsonl.1 is left
    records, mark = again.read(10)
    assert (ids(records), mark) == ([2], (1, N))
    assert again.append_lines([line(3)]) == (1, 2 * N)
    assert again.append_lines([line(4)]) == (2, N)  # segment 1 reached 2n and closed
    again.close()


def test_a_torn_line_is_skipped_and_counted(path: Path) -> None:
    path.write_text(line(0) + "\n" + line(1)[:20])  # a crash in the middle of the second line
    s = Spool(path)
    assert s.append_lines([line(2)]) == (0, 2 * N + 20 + 1)  # the torn line is ended first
    records, _ = s.read(10)
    assert ids(records) == [0, 2]
    assert s.corrupt == 1
    s.close()


def test_blank_lines_are_not_records(path: Path) -> None:
    path.write_text(line(0) + "\n\n" + line(1) + "\n")
    s = Spool(path)
    records, mark = s.read(10)
    assert (ids(records), mark, s.corrupt) == ([0, 1], (0, 2 * N + 1), 0)
    s.close()


def test_append_lines_ends_a_torn_line_and_returns_the_size(tmp_path: Path) -> None:
    target = tmp_path / "spool.jsonl.rejected"
    assert append_lines(target, ["a", "bc"]) == 5
    with target.open("a") as f:
        f.write("torn")
    assert append_lines(target, ["d"]) == 5 + 4 + 1 + 2
    assert target.read_text() == "a\nbc\ntorn\nd\n"
    assert append_lines(target, []) == 12


def test_writes_are_made_durable(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync is called on the segment before a sync returns and when a segment closes, and on the folder when
    a segment is created (each call recorded, then the real one made)."""
    files: list[int] = []
    folders: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        st = os.fstat(fd)
        (folders if stat.S_ISDIR(st.st_mode) else files).append(st.st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    s = Spool(path, segment_bytes=2 * N)
    _, seq = s.write([line(0)])
    assert (files, len(folders)) == ([], 1)  # the new segment's folder entry
    s.sync(seq)
    assert files == [N]  # the segment, with the line in it
    s.sync(seq)  # already durable: no second fsync
    assert files == [N]
    _, seq = s.write([line(1)])  # closes segment 0: fsync'd as it closes
    assert files == [N, 2 * N]
    s.sync(seq)  # closed and fsync'd since: nothing more to do
    assert files == [N, 2 * N]
    s.write([line(2)])
    assert len(folders) == 2  # segment 1 created
    s.close()


def test_spool_files_are_the_owners_only(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        s = Spool(tmp_path / "spool.jsonl", segment_bytes=N)
        s.append_lines([line(0)])
        s.append_lines([line(1)])  # segment 1
        append_lines(tmp_path / "spool.jsonl.rejected", [line(2)])
        s.close()
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"spool.jsonl": 0o600, "spool.jsonl.1": 0o600, "spool.jsonl.rejected": 0o600}


def test_read_and_size_right_after_a_segment_closed(path: Path) -> None:
    s = Spool(path, segment_bytes=2 * N)
    s.append_lines([line(0), line(1)])  # segment 0 closes; segment 1 has no file yet
    assert not path.with_name("spool.jsonl.1").exists()
    assert s.size() == 2 * N
    records, mark = s.read(10)
    assert (ids(records), mark) == ([0, 1], (1, 0))
    assert s.pending()
    s.commit(mark)
    assert not s.pending() and not path.exists()
    assert s.finish() is True
    s.close()


def test_a_failed_fsync_is_retried_by_the_next_sync(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real_fsync = os.fsync

    def failing_once(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            calls.append(True)
            if len(calls) == 1:
                raise OSError(5, "I/O error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_once)
    s = Spool(path)
    _, seq = s.write([line(0)])
    with pytest.raises(OSError, match="I/O error"):
        s.sync(seq)
    s.sync(seq)  # not durable yet: fsync'd again
    assert len(calls) == 2
    s.sync(seq)
    assert len(calls) == 2
    s.close()


def test_finish_fsyncs_the_truncation_unless_told_not_to(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            files.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    s = Spool(path)
    for sync, expected in ((True, [N, 0]), (False, [N])):
        files.clear()
        s.commit(s.append_lines([line(0)]))
        assert s.finish(sync=sync) is True
        assert files == expected
    files.clear()
    s.commit(s.append_lines([line(0)]))
    assert s.finish() is True  # by default: durable
    assert files == [N, 0]
    s.close()


def test_append_lines_fsyncs_the_file_and_a_new_files_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    target = tmp_path / "spool.jsonl.rejected"
    append_lines(target, ["a"])
    assert synced == ["file", "folder"]
    append_lines(target, ["b"])
    assert synced == ["file", "folder", "file"]


def test_concurrent_syncs_share_one_fsync(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Group commit: a sync that starts while another's fsync runs waits for it, when that fsync covers its
    write, instead of making its own."""
    import threading

    entered, release = threading.Event(), threading.Event()
    files: list[int] = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            files.append(fd)
            if len(files) == 1:
                entered.set()
                release.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    s = Spool(path)
    s.write([line(0)])
    _, second = s.write([line(1)])  # both written before the first sync starts: its fsync covers both
    first = threading.Thread(target=s.sync, args=(1,))
    first.start()
    assert entered.wait(30)
    other = threading.Thread(target=s.sync, args=(second,))
    other.start()
    # the second caller either waits for the running fsync (group commit) or makes its own: see which
    waiters = s._sync_cond._waiters  # type: ignore[attr-defined]
    for _ in range(3000):
        if waiters or len(files) > 1:
            break
        threading.Event().wait(0.01)
    release.set()
    first.join(30)
    other.join(30)
    assert not first.is_alive() and not other.is_alive()
    assert len(files) == 1
    s.close()


def test_a_segment_cut_short_by_something_else_is_read_to_its_end(path: Path) -> None:
    s = Spool(path)
    s.append_lines([line(0), line(1)])
    os.truncate(path, N)  # the spool believes 2n bytes are there
    records, mark = s.read(10)
    assert (ids(records), mark) == ([0], (0, N))
    s.close()


def test_finishs_options_are_keywords(path: Path) -> None:
    s = Spool(path)
    with pytest.raises(TypeError):
        s.finish(False)  # type: ignore[call-arg]
    assert s.finish(sync=False) is True
    s.close()


def test_a_sync_whose_write_came_after_the_running_fsync_makes_its_own(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    entered, release = threading.Event(), threading.Event()
    sizes: list[int] = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            sizes.append(os.fstat(fd).st_size)
            if len(sizes) == 1:
                entered.set()
                release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    s = Spool(path)
    _, first_seq = s.write([line(0)])
    first = threading.Thread(target=s.sync, args=(first_seq,))
    first.start()
    assert entered.wait(10)  # the first fsync runs: it covers write 1 only
    _, second_seq = s.write([line(1)])
    done = threading.Event()

    def second() -> None:
        s.sync(second_seq)
        done.set()

    other = threading.Thread(target=second)
    other.start()
    waiters = s._sync_cond._waiters  # type: ignore[attr-defined]
    for _ in range(1000):  # until the second caller waits for the running fsync
        if waiters:
            break
        threading.Event().wait(0.01)
    release.set()
    first.join(10)
    other.join(10)
    assert done.is_set()
    assert sizes == [N, 2 * N]  # the second sync fsync'd again once the first was over: write 2 is durable
    s.close()


def test_finish_deletes_empty_closed_segments_found_at_open(path: Path) -> None:
    # left by a crash: segment 0 emptied, segment 1 the newest, both empty
    path.write_bytes(b"")
    path.with_name("spool.jsonl.1").write_bytes(b"")
    s = Spool(path)
    assert not s.pending()
    assert s.finish() is True
    assert not path.exists()
    assert path.with_name("spool.jsonl.1").exists()
    assert s.append_lines([line(0)]) == (1, N)
    s.close()
