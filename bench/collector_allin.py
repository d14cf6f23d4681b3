"""bench/collector.py's all-in accounting: the CPU of every process (and the rollup job) involved, the rollup
watermark read from the store, the time the maintenance spent folding after the last row was stored, and the
checks that every row was stored and folded (the rollups and the value blocks cover every stored row).

The maintenance is the collector's own rollup job (:class:`inferwatch.collector.stats.rollup.RollupJob`): a
process of each ``inferwatch collector serve`` (:mod:`inferwatch.collector.stats.rollup_process`), a pass every
``INTERVAL_S`` seconds, on PostgreSQL folding a row only ``GRACE_S`` to 2 x ``GRACE_S`` + ``INTERVAL_S`` seconds
after it was stored. Those waits are latency by design, not work: the clock of a burst counts the time the job
spent *folding* after the last row was stored (each pass from its start, ``rollup_state.updated_at``, to its
last watermark move seen), not its sleeps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
from sqlalchemy import Engine, func, select

from inferwatch.collector.stats import rollup, values
from inferwatch.collector.store import db
from inferwatch.collector.store.tables import REQUEST_TABLE, ROLLUP_STATE_TABLE, ROLLUP_TABLE, VALUES_TABLE
from inferwatch.core import vocabulary as V
from inferwatch.demo import free_ports

ROOT = Path(__file__).resolve().parent.parent

TICK = os.sysconf("SC_CLK_TCK")


def _stat(path: Path) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a ``/proc/.../stat``; None when it is gone."""
    try:
        fields = path.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of ``pid`` and each of its live descendants, by pid (Linux ``/proc``)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(entry / "stat")) is not None:
            stats[int(entry.name)] = st
    tree, todo = {}, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            tree[p] = stats[p][1]
            todo += [c for c, (parent, _) in stats.items() if parent == p]
    return tree


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def thread_cpu(pid: int, name: str) -> float:
    """CPU seconds of the threads of ``pid`` the OS knows by ``name`` (``/proc/<pid>/task/*/comm``)."""
    total = 0.0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            if (task / "comm").read_text().strip() != name:
                continue
        except OSError:
            continue
        if (st := _stat(task / "stat")) is not None:
            total += st[1]
    return total


@dataclass
class CpuSnapshot:
    """The CPU seconds of collector processes: their main processes (a rollup thread apart), their worker
    processes, their rollup job (the process ``collector serve`` runs it in, or a thread of an older collector's,
    both named ``iw-rollups``)."""

    main: float = 0.0
    workers: float = 0.0
    rollups: float = 0.0

    @classmethod
    def take(cls, pids: list[int]) -> CpuSnapshot:
        snap = cls()
        for pid in pids:
            tree = tree_cpu(pid)
            roll = thread_cpu(pid, rollup.THREAD_NAME)
            jobs = {p for p in tree if p != pid and _comm(p) == rollup.THREAD_NAME}
            snap.rollups += roll + sum(tree[p] for p in jobs)
            snap.main += tree.get(pid, 0.0) - roll
            snap.workers += sum(cpu for p, cpu in tree.items() if p != pid and p not in jobs)
        return snap

    def minus(self, before: CpuSnapshot) -> CpuSnapshot:
        # a worker process that ended in between takes its CPU with it: clipped at 0 (the collector's are long-lived)
        return CpuSnapshot(
            max(0.0, self.main - before.main),
            max(0.0, self.workers - before.workers),
            max(0.0, self.rollups - before.rollups),
        )

    @property
    def total(self) -> float:
        return self.main + self.workers + self.rollups


class Probe:
    """The store read directly (one connection): its newest row id and the rollups' watermark."""

    def __init__(self, url: str) -> None:
        self.engine: Engine = db.make_engine(url)
        self.conn = self.engine.connect()

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()

    def state(self) -> tuple[int, int, datetime | None]:
        """(newest row id, folded id, start of the pass that last moved the watermark or recorded what it saw)."""
        s = ROLLUP_STATE_TABLE
        newest = self.conn.execute(select(func.max(REQUEST_TABLE.c.id))).scalar_one_or_none() or 0
        row = self.conn.execute(select(s.c.folded_id, s.c.updated_at).where(s.c.name == rollup.STATE_NAME)).first()
        self.conn.rollback()  # a fresh snapshot at the next read
        if row is None:
            return int(newest), 0, None
        return int(newest), int(row.folded_id), row.updated_at


@dataclass
class Tail:
    """The rollup passes seen moving the watermark after the last row was stored: per pass (its start,
    ``rollup_state.updated_at``, as a ``time.time()``), the ``time.time()`` of the last move seen."""

    stored_at: float
    passes: dict[float, float] = field(default_factory=dict)

    def moved(self, pass_start: datetime | None, seen_at: float) -> None:
        if pass_start is not None:
            self.passes[pass_start.timestamp()] = seen_at

    def busy(self) -> float:
        """Seconds the job spent folding after ``stored_at``: each pass from its start (or ``stored_at``) to its
        last move seen (the reads are at most a poll apart from the moves)."""
        return sum(max(0.0, last - max(start, self.stored_at)) for start, last in self.passes.items())


def wait_folded(probe: Probe, stored_wall: float, timeout: float, poll: float) -> tuple[float, Tail]:
    """Polls the watermark until it covers the newest stored row; returns (the ``time.time()`` it was seen
    caught up, the passes of the tail). Raises when ``timeout`` seconds pass first."""
    tail = Tail(stored_wall)
    deadline = time.monotonic() + timeout
    last = -1
    while True:
        newest, folded, pass_start = probe.state()
        now = time.time()
        if folded != last:
            if last >= 0:
                tail.moved(pass_start, now)
            last = folded
        if folded >= newest > 0:
            return now, tail
        if time.monotonic() > deadline:
            raise RuntimeError(f"the rollups did not catch up in {timeout:.0f} s: folded {folded} of {newest}")
        time.sleep(poll)


def coverage(url: str, n: int) -> list[str]:
    """What is wrong with the store after ``n`` spans were sent and folded (empty: nothing): every span stored
    once, the watermark over every row, the minute, hour and day rollups and the minute value blocks counting
    every row."""
    problems: list[str] = []
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            t = REQUEST_TABLE
            count, newest = conn.execute(select(func.count(), func.max(t.c.id))).one()
            if count != n:
                problems.append(f"{count} rows stored of {n} spans sent")
            folded = rollup.watermark(conn)
            if folded < (newest or 0):
                problems.append(f"watermark {folded} below the newest row {newest}")
            r = ROLLUP_TABLE
            for period in rollup.PERIODS:
                got = conn.execute(select(func.sum(r.c.requests)).where(r.c.period_seconds == period)).scalar_one()
                if (got or 0) != count:
                    problems.append(f"rollups of {period} s count {got} requests of {count} rows")
            v = VALUES_TABLE
            blocks = conn.execute(select(v.c.series, v.c.counts, v.c.vals).where(v.c.period_seconds == 60)).all()
            in_blocks = 0
            for series, counts_b, vals_b in blocks:
                keys = values.keys_of(series)
                counts, vals = values.arrays(counts_b, vals_b)
                in_blocks += sum(counts[: len(keys)])  # the first total: requests, one per series
                if sum(counts[values.NT * len(keys) :]) != len(vals):
                    problems.append("a value block's counts disagree with its values")
            if in_blocks != count:
                problems.append(f"minute value blocks count {in_blocks} requests of {count} rows")
    finally:
        engine.dispose()
    return problems


LOGGED = ("WARNING", "ERROR", "CRITICAL", "Traceback")
"""What :meth:`Collectors.logged` shows of a collector's stderr."""


class Collectors:
    """``replicas`` collector processes on one store, each with a data directory of its own."""

    def __init__(
        self, url: str, data_dir: Path, replicas: int = 1, processes: int | None = None, root: Path | None = None
    ) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.bases: list[str] = []
        self.logs: list[Path] = []
        """Each collector's stderr (a file: a pipe nobody reads would stall its logging once full)."""
        env = dict(os.environ)
        if processes is not None:
            env["INFERWATCH_COLLECTOR_INGEST_PROCESSES"] = str(processes)
        if root is not None:
            env["PYTHONPATH"] = str(root)
        for i in range(replicas):
            port, grpc_port = free_ports(2, 0)
            cmd = [sys.executable, "-m", "inferwatch", "collector", "serve", "--data-dir", str(data_dir / f"c{i}")]
            cmd += ["--listen", f"127.0.0.1:{port}", "--grpc-listen", f"127.0.0.1:{grpc_port}"]
            cmd += ["--log-level", "warning", "--database-url", url]
            log = data_dir / f"c{i}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            self.logs.append(log)
            with log.open("wb") as err:
                self.procs.append(
                    subprocess.Popen(cmd, cwd=root or ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
                )
            self.bases.append(f"http://127.0.0.1:{port}")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        for proc, base in zip(self.procs, self.bases, strict=True):
            while True:
                try:
                    if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("collector did not start: " + "\n".join(self.logged()))
                time.sleep(0.2)

    def logged(self, most: int = 5) -> list[str]:
        """The first ``most`` warnings, errors and tracebacks the collectors logged (not the start-up banner)."""
        lines: list[str] = []
        for log in self.logs:
            if log.exists():
                text = log.read_text(errors="replace").splitlines()
                lines += [f"{log.stem}: {line}" for line in text if any(w in line for w in LOGGED)]
        return lines[:most]

    def stored(self, client: httpx.Client) -> int:
        return sum(stored_rows(client, base) for base in self.bases)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def stored_rows(client: httpx.Client, base: str) -> int:
    """The collector's own count of stored rows (its self-metrics: cheaper than a COUNT over the table)."""
    for line in client.get(base + "/metrics").text.splitlines():
        if line.startswith(V.COLLECTOR_REQUESTS_STORED.name + " "):
            return int(float(line.split()[1]))
    return 0


def write_bodies(path: Path, bodies: list[bytes]) -> None:
    with path.open("wb") as f:
        for b in bodies:
            f.write(len(b).to_bytes(4, "big") + b)


def read_bodies(path: Path) -> list[bytes]:
    data = path.read_bytes()
    bodies, i = [], 0
    while i < len(data):
        size = int.from_bytes(data[i : i + 4], "big")
        bodies.append(data[i + 4 : i + 4 + size])
        i += 4 + size
    return bodies


@contextmanager
def sender(cmd: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """The sender process (``python -m bench.collector --send …``), started and ready: its start (imports,
    the bodies read) is not timed, it says ``ready`` and waits for :func:`go`. Killed on the way out if it
    still runs."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline() != b"ready\n":
            raise RuntimeError("sender did not start")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def go(proc: subprocess.Popen[bytes]) -> None:
    """Tell a ready sender to start sending."""
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
