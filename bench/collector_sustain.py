"""bench/collector.py's sustained form (``--sustain SECONDS``): spans sent at a fixed rate for that long to a
collector that runs its rollup job as in production, the maintenance backlog sampled every second.

The sender cycles through a pool of prepared bodies; before each send it gives every span a trace id of its own
(the first 4 bytes of the pool's random id: the send's cycle) and moves its times so that the body's last span
ends now: the rows land in the current minute, as a live fleet's do, and every row is new (the insert is
idempotent on (trace id, span id): a resent span would not be stored again). The patching is done on the bytes
(the ids and the ``fixed64`` times have fixed offsets): about a microsecond per span, in the sender's CPU.

**Backlog**: rows stored but not yet folded into the rollups and the value blocks (the newest row id less the
watermark ``rollup_state.folded_id``; the ids are dense). By design it is a sawtooth, not zero: the job runs a
pass every ``INTERVAL_S`` seconds, and on PostgreSQL folds a row only ``GRACE_S`` after it saw it stored, so a
fold of the whole backlog follows every ~``GRACE_S + INTERVAL_S`` seconds. Its troughs (the rows that came in
while the job folded the rest, or waited out the grace) stay level while the job keeps up, and rise when it
folds slower than rows arrive. **Fails** when the trough of the last minute exceeds the trough of the minute
before by more than ``rate x (INTERVAL_S + PASS_BUDGET_S)`` rows: a pass's schedule moves its trough by up to
one interval, and one pass's budget of rows, from one minute to the next; more than that in a minute is a job
short of the rate by over a tenth, whose backlog grows without bound. A minute holds at least one trough on both
back ends (a cycle lasts at most ~45 s on PostgreSQL). Also fails when the rows stored over the last minute fall
short of 0.9 x the rate (ingest did not keep up), when the rollups do not cover every row after the sending
stops, or when the store is wrong (:func:`bench.collector_allin.coverage`).

**The store's own pace.** The rate is the target ratio of the driver's fast path on a *fresh* store, but the
driver itself slows as the table grows (its unique and covering indexes take random keys): on SQLite from 47 to
52 us of CPU per row between 100k and 600k rows with the collector's page cache, and from 51 to 81 without it.
So after the run the driver inserts :data:`bench.collector.END_LIMIT_SPANS` rows into the store as the run left
it (:attr:`Sustained.end_limit`). When the target ratio of that is below the rate, the rate was beyond what the
store takes at that size: the last minute must then store at least the target ratio of the driver's pace there,
and the sender is allowed to fall behind (the collector's back-pressure); the backlog's trend is judged as ever.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.collector_allin import Collectors, CpuSnapshot, Probe, coverage, go, sender, wait_folded, write_bodies
from inferwatch.collector.stats import rollup

SAMPLE_S = 1.0
"""Between two samples of the backlog."""
WINDOW_S = 60.0
"""The trend compares the troughs of the last two windows of this length."""
WARMUP_S = {"sqlite": rollup.INTERVAL_S + rollup.PASS_BUDGET_S, "postgresql": 2 * rollup.GRACE_S + rollup.INTERVAL_S}
"""The first fold cycle, per back end: left out of the trend."""
MIN_SECONDS = 2 * WINDOW_S + 2 * rollup.GRACE_S + rollup.INTERVAL_S
"""The shortest sustained run judged on both back ends: the warm-up, then at least a whole minute before the last."""
START_TAG = b"\x39"  # field 7 (start_time_unix_nano), fixed64
END_TAG = b"\x41"  # field 8 (end_time_unix_nano), fixed64


class Pool:
    """Prepared bodies whose spans' trace ids and times are rewritten per send (see the module)."""

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies
        self.spans = 0
        self.offsets: list[list[tuple[int, int, int]]] = []  # per body, per span: trace id, start, end
        self.last_end: list[int] = []
        for body in bodies:
            req = ExportTraceServiceRequest.FromString(body)
            spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
            found = []
            for s in spans:
                tid = _unique(body, s.trace_id)
                start = _unique(body, START_TAG + s.start_time_unix_nano.to_bytes(8, "little")) + 1
                end = _unique(body, END_TAG + s.end_time_unix_nano.to_bytes(8, "little")) + 1
                found.append((tid, start, end))
            self.offsets.append(found)
            self.last_end.append(max(s.end_time_unix_nano for s in spans))
            self.spans += len(spans)

    def body(self, index: int, now_ns: int) -> tuple[bytes, int]:
        """Send ``index`` (from 0): the pool's body ``index mod size``, with trace ids of its cycle and its last
        span ending at ``now_ns``; and its number of spans."""
        k = index % len(self.bodies)
        cycle = (index // len(self.bodies) + 1).to_bytes(4, "big")
        out = bytearray(self.bodies[k])
        shift = now_ns - self.last_end[k]
        for tid, start, end in self.offsets[k]:
            out[tid : tid + 4] = cycle
            for at in (start, end):
                t = int.from_bytes(out[at : at + 8], "little") + shift
                out[at : at + 8] = t.to_bytes(8, "little")
        return bytes(out), len(self.offsets[k])


def _unique(body: bytes, needle: bytes) -> int:
    at = body.find(needle)
    if at < 0 or body.find(needle, at + 1) >= 0:
        raise RuntimeError("a span's id or time is not found once in its body: cannot rewrite it")
    return at


@dataclass
class Sample:
    t: float
    """Seconds since the first send."""
    newest: int
    folded: int

    @property
    def backlog(self) -> int:
        return self.newest - self.folded


@dataclass
class Sustained:
    """What a sustained run measured and found."""

    rate: float
    seconds: float
    warmup: float = 0.0
    """Seconds from the start that the trend leaves out (:data:`WARMUP_S`)."""
    sent: int = 0
    samples: list[Sample] = field(default_factory=list)
    drained_s: float = 0.0
    cpu: CpuSnapshot = field(default_factory=CpuSnapshot)
    sender_cpu: float = 0.0
    problems: list[str] = field(default_factory=list)
    target: float = 0.0
    """The ratio to the driver's fast path that ingest must reach (bench/collector.py's target)."""
    end_limit: float = 0.0
    """The driver's fast path on the store as the run left it, rows/s (0: not measured)."""

    @property
    def beyond_store(self) -> bool:
        """The rate asked more than the target ratio of what the driver itself inserts into a store of the size
        the run reached: the table's growth, not ingest, set the pace at the end."""
        return self.end_limit > 0 and self.target * self.end_limit < self.rate

    @property
    def last_minute(self) -> float | None:
        """Rows stored per second over the last minute of the sending."""
        ends = [s for s in self.samples if self.seconds - WINDOW_S <= s.t <= self.seconds]
        return (ends[-1].newest - ends[0].newest) / (ends[-1].t - ends[0].t) if len(ends) >= 2 else None

    def trough(self, lo: float, hi: float) -> int | None:
        window = [s.backlog for s in self.samples if lo <= s.t < hi]
        return min(window) if window else None

    def judge(self) -> None:
        """Adds the failures of the criteria of the module's docstring to :attr:`problems`."""
        # the minute before starts after the warm-up: the backlog rises from 0 to its sawtooth in the first
        # fold cycle (PostgreSQL: up to 2 x GRACE_S + INTERVAL_S), whose trough 0 is no baseline
        last = self.trough(self.seconds - WINDOW_S, self.seconds)
        before = self.trough(max(self.warmup, self.seconds - 2 * WINDOW_S), self.seconds - WINDOW_S)
        bound = self.rate * (rollup.INTERVAL_S + rollup.PASS_BUDGET_S)
        if last is None or before is None:
            self.problems.append("too few backlog samples to judge the trend")
        elif last - before > bound:
            self.problems.append(
                f"the backlog grows: trough {last:,} rows in the last minute, {before:,} in the one before "
                f"(bound +{bound:,.0f})"
            )
        stored_rate = self.last_minute
        if stored_rate is not None:
            floor = self.target * self.end_limit if self.beyond_store else 0.9 * self.rate
            if stored_rate < floor:
                self.problems.append(
                    f"ingest fell behind: {stored_rate:,.0f} rows/s stored in the last minute (floor {floor:,.0f})"
                )
        achieved = self.sent / self.seconds
        if achieved < 0.95 * self.rate and not self.beyond_store:
            self.problems.append(f"the sender reached {achieved:,.0f} spans/s of {self.rate:,.0f}")

    def summary(self) -> str:
        troughs = []
        t = 0.0
        while t + WINDOW_S <= self.seconds + 1e-6:
            troughs.append(self.trough(t, t + WINDOW_S))
            t += WINDOW_S
        peaks = [max((s.backlog for s in self.samples if a <= s.t < a + WINDOW_S), default=0)
                 for a in range(0, int(self.seconds), int(WINDOW_S))]  # fmt: skip
        return (
            f"troughs per minute {', '.join(f'{x:,}' if x is not None else '-' for x in troughs)} rows; "
            f"peaks per minute {', '.join(f'{x:,}' for x in peaks)} rows"
        )


def sample_until(probe: Probe, t0: float, seconds: float, into: list[Sample]) -> None:
    """Backlog samples every :data:`SAMPLE_S` from ``t0`` (``time.perf_counter()``) for ``seconds``."""
    k = 0
    while True:
        at = t0 + k * SAMPLE_S
        if at > t0 + seconds:
            return
        delay = at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        newest, folded, _ = probe.state()
        into.append(Sample(time.perf_counter() - t0, newest, folded))
        k += 1


def drain(probe: Probe, result: Sustained, t0: float) -> None:
    """After the sending: wait (sampling) until the rollups cover every stored row."""
    end_wall = time.time()
    timeout = 2 * rollup.GRACE_S + rollup.INTERVAL_S + 300
    caught, _ = wait_folded(probe, end_wall, timeout, SAMPLE_S / 4)
    result.drained_s = caught - end_wall
    newest, folded, _ = probe.state()
    result.samples.append(Sample(time.perf_counter() - t0, newest, folded))


def describe(name: str, r: Sustained) -> str:
    n = max(r.sent, 1)
    c = r.cpu
    every = [s for s in r.samples if s.t <= r.seconds]
    step = max(1, len(every) // 30)
    shown = ", ".join(f"{s.t:.0f}s:{s.backlog:,}" for s in every[::step])
    return (
        f"{name} sustained {r.seconds:.0f} s at {r.rate:,.0f} spans/s: sent {r.sent:,} "
        f"({r.sent / r.seconds:,.0f}/s; stored {r.last_minute or 0:,.0f}/s in the last minute); "
        f"caught up {r.drained_s:.1f} s after the last send; "
        f"CPU per span all-in {c.total / n * 1e6:.1f} us = collector process {c.main / n * 1e6:.1f} + worker processes "
        f"{c.workers / n * 1e6:.1f} + rollup job {c.rollups / n * 1e6:.1f}; sender {r.sender_cpu / n * 1e6:.1f} us\n"
        f"  backlog {r.summary()}\n  samples (s:rows) {shown}"
        + (
            f"\n  driver's fast path on the store as the run left it ({max(s.newest for s in r.samples):,} rows): "
            f"{r.end_limit:,.0f} rows/s; {r.target:g}x of it {'is below' if r.beyond_store else 'reaches'} the rate"
            if r.end_limit
            else ""
        )
    )


def sustained_run(
    url: str, data_dir: Path, pool: list[bytes], rate: float, seconds: float, senders: int, root: Path | None = None
) -> Sustained:
    """A collector on a fresh store (``url``), fed at ``rate`` spans/s for ``seconds`` from a sender process,
    sampled, drained and its store checked (see the module); :meth:`Sustained.judge` is the caller's, once it
    has measured :attr:`Sustained.end_limit`."""
    result = Sustained(rate, seconds, WARMUP_S["postgresql" if url.startswith("postgresql") else "sqlite"])
    collectors = Collectors(url, data_dir, root=root)
    probe = Probe(url)
    try:
        collectors.wait_ready()
        body_file = data_dir / "pool.bin"
        write_bodies(body_file, pool)
        cmd = [sys.executable, "-m", "bench.collector", "--send", collectors.bases[0] + "/v1/traces"]
        cmd += ["--bodies", str(body_file), "--senders", str(senders), "--rate", str(rate), "--seconds", str(seconds)]
        pids = [p.pid for p in collectors.procs]
        with sender(cmd) as proc:
            before = CpuSnapshot.take(pids)
            t0 = time.perf_counter()
            go(proc)
            sample_until(probe, t0, seconds, result.samples)
            said = dict(line.split() for line in proc.communicate(timeout=120)[0].decode().splitlines())
            if proc.returncode != 0:
                raise RuntimeError("sender failed")
            result.sender_cpu, result.sent = float(said["cpu"]), int(said["sent"])
            drain(probe, result, t0)
            result.cpu = CpuSnapshot.take(pids).minus(before)
    finally:
        probe.close()
        collectors.stop()
        for line in collectors.logged():  # the collector's warnings say what went wrong
            print(f"  {line}")
    result.problems += coverage(url, result.sent)
    return result
