"""Benchmark: inferwatch's diagnosis against what a careful user would write, on a real Prometheus.

For 10 and 100 targets (each an engine, model and instance; vLLM, TGI, TensorRT-LLM and Triton mixed),
one hour of synthetic canonical series, a sample every 15 s ending a few seconds ago, is written as
OpenMetrics and backfilled with ``promtool tsdb create-blocks-from openmetrics``; Debian's Prometheus
then serves those blocks on 127.0.0.1 (no scrape job). A few targets are in trouble (preempting, a
queue backlog, errors) so the diagnosis has findings to make. Every approach reads a 10-minute window.

- inferwatch: ``prometheus.read_fleet`` + ``evaluate.diagnose``, its fixed set of fleet-wide queries
  (aggregated by engine, model and instance) and the whole report, findings with their evidence.
- careful, the baseline (``bench/diagnose_careful.py``): one plain fleet-wide query per signal of the
  diagnosis, sent at once, and the catalogue's thresholds and gates applied in a few lines of Python.
- recorded, for information: the careful user's queries kept as recording rules (backfilled over the
  last minutes with ``promtool tsdb create-blocks-from rules``), one instant read of each recorded series,
  the same thresholding.
- naive, for information: inferwatch's queries sent once per target with its label matchers (N x the
  queries; the target list given, not discovered), all targets at once.

Each time is all-in: the queries, reading the answers and judging the symptoms (both phases are shown).
The target is set against the careful user's ad-hoc queries, not the recorded ones: like inferwatch,
they compute from the raw series when asked. Recording rules do the same work in Prometheus at every
evaluation interval (15 s here), whether anyone looks or not, and that cost is invisible to a read,
which then measures 32 lookups; the recorded line shows that floor. The careful user writes no proxy
fallback and no GPU cause analysis, and this fleet has neither proxy nor GPU series, so the comparison
is between equal answers (checked).

The careful user, inferwatch and the recorded read run interleaved, a different one first each run;
the naive one after them (its thousands of queries would disturb their next run). Each run's
inferwatch time is divided by the careful time next to it; the target is on the median of those
ratios, steadier than a ratio of medians on a machine whose load moves.

Targets (exit 1 when one is missed): inferwatch's number of queries is the same for 10 and 100
targets and no more than the careful user's plus one per thing inferwatch does that they do not
(:data:`BEYOND_CAREFUL`: the speculative-decoding counters its tuning advice reads); every approach
finds the N targets and flags exactly
the troubled ones; at 10 and at 100 targets inferwatch takes at most 1.5x the careful user's time.
Sanity checks (also exit 1): each troubled target, and no other, gets its finding, and every approach
gives the same findings (instance, symptom, severity) in every run. Absolute times are for
information. Exit 2 when ``prometheus`` or ``promtool`` is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import diagnose_careful
from bench.diagnose_careful import Finding
from bench.diagnose_fleet import EXPECTED, STEP_S, Target, make_targets, write_openmetrics
from inferwatch.collector.diagnosis import prometheus
from inferwatch.collector.diagnosis.evaluate import diagnose
from inferwatch.collector.diagnosis.report import Diagnosis
from inferwatch.collector.diagnosis.signals import Filters, Fleet, TargetKey
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.symptoms import Signal
from inferwatch.demo import free_ports
from tests.support.stack import Processes, prometheus_cmd, write_prometheus_config

ROOT = Path(__file__).resolve().parent.parent
SIZES = (10, 100)
TARGET_RATIO = 1.5
INFERWATCH, CAREFUL, RECORDED, NAIVE = "inferwatch", "careful", "recorded", "naive"
BEYOND_CAREFUL: tuple[str, ...] = (prometheus.SPEC_DECODE_QUERY,)
"""inferwatch's queries for what the careful user does not do: the tuning advice on speculative decoding."""
WINDOW = "10m"
HISTORY_S = 3600
END_LAG_S = 5
QUERY_TIMEOUT_S = 120.0
RETENTION = "3650d"
RULES_HISTORY_S = 120
"""the recording rules are backfilled over the last minutes only: a read needs the newest sample."""
RUNS = 31
QUICK_RUNS = 11
NAIVE_RUNS = 5
"""the naive line is for information, and takes seconds a run at 100 targets."""


class MissingTool(RuntimeError):
    pass


# --- Prometheus with the backfilled blocks -------------------------------------------------------


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise MissingTool(f"{name} not found: install Debian's package 'prometheus' (`make system-deps`)")
    return path


@dataclass
class Backfilled:
    base_url: str
    targets: list[Target]
    samples: int
    data_end: float
    generate_s: float
    backfill_s: float
    rules_s: float


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")


def _serve(procs: Processes, name: str, work: Path, port: int) -> str:
    config = work / "prometheus.yml"
    write_prometheus_config(config, {}, [])
    cmd = [
        *prometheus_cmd(tool("prometheus"), config, work / "data", port),
        f"--storage.tsdb.retention.time={RETENTION}",
    ]
    procs.spawn(name, cmd)
    base = f"http://127.0.0.1:{port}"
    procs.wait_http(name, f"{base}/-/ready")
    return base


def start_prometheus(procs: Processes, work: Path, n: int) -> Backfilled:
    """Write ``n`` targets' hour as OpenMetrics, backfill it into a fresh TSDB, serve it on loopback; then
    backfill the careful user's recording rules over the last minutes and serve both."""
    promtool = tool("promtool")
    work.mkdir(parents=True, exist_ok=True)
    steps = HISTORY_S // STEP_S
    t0 = time.perf_counter()
    end = int(time.time()) - END_LAG_S
    stamps = [end - (steps - 1 - k) * STEP_S for k in range(steps)]
    targets = make_targets(n, steps)
    source = work / "fleet.om.txt"
    with source.open("w") as f:
        samples = write_openmetrics(f, targets, stamps)
    t1 = time.perf_counter()
    data = work / "data"
    _run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(data)], "promtool backfill"
    )
    t2 = time.perf_counter()
    name, port = f"prometheus-{n}", free_ports(1, 0)[0]
    base = _serve(procs, name, work, port)
    rules, recorded = work / "careful-rules.yml", work / "recorded"
    rules.write_text(diagnose_careful.rules_yaml(WINDOW))
    _run(
        [
            *(promtool, "tsdb", "create-blocks-from", "rules", "--quiet", f"--url={base}"),
            *(f"--start={end - RULES_HISTORY_S}", f"--end={end}", f"--output-dir={recorded}", str(rules)),
        ],
        "promtool rules backfill",
    )
    t3 = time.perf_counter()
    procs.stop(name)
    for block in recorded.iterdir():
        block.rename(data / block.name)
    base = _serve(procs, name, work, port)
    return Backfilled(base, targets, samples, float(end), t1 - t0, t2 - t1, t3 - t2)


# --- the three diagnoses ------------------------------------------------------------------------


@dataclass
class Outcome:
    findings: set[Finding]
    queries: int
    targets: int
    read_s: float
    """sending the queries and reading the answers onto the targets."""
    judge_s: float
    """judging the symptoms (inferwatch: the whole report, findings with their evidence)."""


def findings(result: Diagnosis) -> set[Finding]:
    return {(f.instance, f.symptom.value, f.severity) for f in result.findings}


async def inferwatch(client: httpx.AsyncClient, base: str) -> Outcome:
    t0 = time.perf_counter()
    fleet = await prometheus.read_fleet(client, base, window=WINDOW, filters=Filters(), timeout=QUERY_TIMEOUT_S)
    t1 = time.perf_counter()
    result = diagnose(fleet, builtin_profiles())
    t2 = time.perf_counter()
    return Outcome(findings(result), fleet.upstream_queries, len(fleet.targets), t1 - t0, t2 - t1)


async def careful(client: httpx.AsyncClient, base: str, recorded: bool = False) -> Outcome:
    done = await diagnose_careful.diagnose(client, base, WINDOW, QUERY_TIMEOUT_S, recorded=recorded)
    return Outcome(done.findings, done.queries, done.targets, done.query_s, done.judge_s)


async def naive(client: httpx.AsyncClient, base: str, keys: Sequence[TargetKey]) -> Outcome:
    """Each target diagnosed on its own: inferwatch's queries narrowed by its label matchers, all at once."""

    async def one(key: TargetKey) -> Fleet:
        only = Filters(engine=key.engine, model=key.model, instance=key.instance)
        return await prometheus.read_fleet(client, base, window=WINDOW, filters=only, timeout=QUERY_TIMEOUT_S)

    t0 = time.perf_counter()
    fleets = await asyncio.gather(*(one(k) for k in keys))
    merged = Fleet("prometheus", WINDOW, prometheus.window_seconds(WINDOW), upstream=base)
    for f in fleets:
        merged.targets.update(f.targets)
        merged.upstream_queries += f.upstream_queries
    t1 = time.perf_counter()
    result = diagnose(merged, builtin_profiles())
    t2 = time.perf_counter()
    return Outcome(findings(result), merged.upstream_queries, len(merged.targets), t1 - t0, t2 - t1)


@dataclass
class Timing:
    name: str
    times: list[float] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def last(self) -> Outcome:
        return self.outcomes[-1]

    def phase(self, read: bool) -> float:
        return statistics.median(o.read_s if read else o.judge_s for o in self.outcomes)


async def _timed(timing: Timing, run: Callable[[], Awaitable[Outcome]]) -> None:
    t = time.perf_counter()
    outcome = await run()
    timing.times.append(time.perf_counter() - t)
    timing.outcomes.append(outcome)


async def measure(base: str, keys: Sequence[TargetKey], runs: int, with_naive: bool) -> list[Timing]:
    """inferwatch, the careful user and the careful user's recording rules interleaved, a different one
    first each run; then the naive one (its thousands of queries would disturb the next run of the others)."""
    timings = [Timing(INFERWATCH), Timing(CAREFUL), Timing(RECORDED)]
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(limits=limits) as client:

        def ours() -> Awaitable[Outcome]:
            return inferwatch(client, base)

        def theirs() -> Awaitable[Outcome]:
            return careful(client, base)

        def recorded() -> Awaitable[Outcome]:
            return careful(client, base, recorded=True)

        def per_target() -> Awaitable[Outcome]:
            return naive(client, base, keys)

        runners: list[tuple[Timing, Callable[[], Awaitable[Outcome]]]] = [
            *zip(timings, (ours, theirs, recorded), strict=True)
        ]
        for _, run in runners:  # warm-up: Prometheus maps the blocks' chunks and index
            await run()
        for i in range(runs):
            turn = i % len(runners)
            for timing, run in runners[turn:] + runners[:turn]:
                await _timed(timing, run)
        if with_naive:
            timings.append(Timing(NAIVE))
            await per_target()
            for _ in range(min(runs, NAIVE_RUNS)):
                await _timed(timings[-1], per_target)
    return timings


def sanity(targets: Sequence[Target], timings: Sequence[Timing]) -> list[str]:
    """The troubled targets, and only they, get their finding; every approach finds the same, every run."""
    problems = []
    found = timings[0].last.findings
    for t in targets:
        mine = {symptom for instance, symptom, _ in found if instance == t.instance}
        if t.trouble is None and mine:
            problems.append(f"healthy target {t.instance} ({t.engine}) has findings {sorted(mine)}")
        if t.trouble is not None and EXPECTED[t.trouble].value not in mine:
            problems.append(f"{t.trouble} target {t.instance} ({t.engine}) lacks {EXPECTED[t.trouble].value}: {mine}")
    unknown = {instance for instance, _, _ in found} - {t.instance for t in targets}
    if unknown:
        problems.append(f"findings for unknown instances {sorted(unknown)}")
    for timing in timings:
        for o in timing.outcomes:
            if o.findings != found:
                problems.append(
                    f"{timing.name} disagrees with {INFERWATCH}: only {INFERWATCH} {sorted(found - o.findings)}, "
                    f"only {timing.name} {sorted(o.findings - found)}"
                )
                break
    return problems


@dataclass
class Row:
    n: int
    timings: list[Timing]
    troubled: set[str]
    """the instances put in trouble."""

    def of(self, name: str) -> Timing:
        return next(t for t in self.timings if t.name == name)

    @property
    def ratio(self) -> float:
        """The median of the per-run ratios: the two ran back to back, under the same load of the machine."""
        pairs = zip(self.of(INFERWATCH).times, self.of(CAREFUL).times, strict=True)
        return statistics.median(ours / theirs for ours, theirs in pairs)


def run_size(procs: Processes, work: Path, n: int, runs: int, with_naive: bool) -> tuple[Row, list[str]]:
    served = start_prometheus(procs, work / f"n{n}", n)
    print(
        f"  {n} targets: {served.samples:,} samples written in {served.generate_s:.1f} s, "
        f"backfilled in {served.backfill_s:.1f} s, recording rules in {served.rules_s:.1f} s",
        flush=True,
    )
    timings = asyncio.run(measure(served.base_url, [t.key for t in served.targets], runs, with_naive))
    procs.stop(f"prometheus-{n}")
    age = time.time() - served.data_end
    row = Row(n, timings, {t.instance for t in served.targets if t.trouble is not None})
    counts = Counter(f"{symptom} ({severity.value})" for _, symptom, severity in row.of(INFERWATCH).last.findings)
    listed = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"
    print(textwrap.fill(f"{n} targets: findings {listed}", 80, initial_indent="  ", subsequent_indent="    "))
    problems = [f"{n} targets: {p}" for p in sanity(served.targets, timings)]
    if age > prometheus.window_seconds(WINDOW):
        problems.append(f"{n} targets: the last sample is {age:.0f} s old, older than the {WINDOW} window")
    return row, problems


def report(rows: Sequence[Row]) -> list[str]:
    print()
    print(
        f"{'targets':>7}  {'approach':<10}  {'queries':>7}  {'median s':>8}  {'min s':>6}  {'read s':>6}  "
        f"{'judge s':>7}  {'found':>5}  {'findings':>8}"
    )
    for r in rows:
        for t in r.timings:
            o = t.last
            print(
                f"{r.n:>7}  {t.name:<10}  {o.queries:>7}  {t.median:>8.4f}  {t.best:>6.4f}  {t.phase(True):>6.4f}  "
                f"{t.phase(False):>7.4f}  {o.targets:>5}  {len(o.findings):>8}"
            )
    print(f"(all-in runs' median and min; read, judge: the phases' medians; {NAIVE}: {NAIVE_RUNS} runs)")
    print()
    failures = []

    def check(ok: bool, text: str, failure: str) -> None:
        print(f"{'OK' if ok else 'MISSED'}: {text}")
        if not ok:
            failures.append(failure)

    ours = [r.of(INFERWATCH).last.queries for r in rows]
    sizes = " and ".join(str(r.n) for r in rows)
    check(
        len(set(ours)) == 1,
        f"{INFERWATCH} sends {' and '.join(map(str, ours))} queries for {sizes} targets (must not grow)",
        "its queries grow with the targets",
    )
    theirs = max(r.of(CAREFUL).last.queries for r in rows)
    allowed = theirs + len(BEYOND_CAREFUL)
    check(
        max(ours) <= allowed,
        f"{INFERWATCH} sends {max(ours)} queries, the {CAREFUL} user {theirs} + {len(BEYOND_CAREFUL)} for what "
        f"they do not do ({', '.join(BEYOND_CAREFUL)}) (target: no more)",
        f"{max(ours)} queries > the {CAREFUL} user's {theirs} + {len(BEYOND_CAREFUL)}",
    )
    missing = [f"{r.n}: {t.name} found {t.last.targets}" for r in rows for t in r.timings if t.last.targets != r.n]
    check(not missing, "every approach finds the N targets", "; ".join(missing))
    wrong = [
        f"{r.n}: {t.name} flags {len(flagged)}"
        for r in rows
        for t in r.timings
        if (flagged := {instance for instance, _, _ in t.last.findings}) != r.troubled
    ]
    troubled = " and ".join(str(len(r.troubled)) for r in rows)
    check(not wrong, f"every approach flags exactly the {troubled} troubled targets", "; ".join(wrong))
    for r in rows:
        check(
            r.ratio <= TARGET_RATIO,
            f"{r.n} targets: {INFERWATCH} takes {r.ratio:.2f}x the {CAREFUL} user's time (target <= {TARGET_RATIO}x)",
            f"{r.ratio:.2f}x > {TARGET_RATIO}x at {r.n} targets",
        )
    print(f"(x: the median of the runs' ratios, {INFERWATCH} / {CAREFUL}, the two run back to back)")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs per side instead of {RUNS}")
    parser.add_argument("--runs", type=int, help="runs per side (at least 5)")
    parser.add_argument("--no-naive", action="store_true", help="leave out the naive per-target line (slow)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (data, logs) and say where")
    args = parser.parse_args()
    runs = args.runs or (QUICK_RUNS if args.quick else RUNS)
    if runs < 5:
        parser.error("--runs must be at least 5")
    try:
        tool("promtool")
        tool("prometheus")
    except MissingTool as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    uncovered = set(Signal) - set(diagnose_careful.careful_queries(WINDOW))
    if uncovered:  # a new signal: the baseline must ask for it too, or its count of queries flatters it
        print(f"error: the careful baseline has no query for {sorted(uncovered)}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="inferwatch-bench-diagnose-"))
    procs = Processes(work / "logs", cwd=ROOT)
    rows, problems = [], []
    print(
        f"diagnosis over a {WINDOW} window, {runs} runs per side, {HISTORY_S // 60} min of samples every {STEP_S} s "
        "backfilled into Prometheus",
        flush=True,
    )
    try:
        for n in SIZES:
            row, found = run_size(procs, work, n, runs, not args.no_naive)
            rows.append(row)
            problems += found
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        procs.close()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    failures = report(rows)
    for p in problems:
        print(f"SANITY: {p}", file=sys.stderr)
    if failures or problems:
        print("FAIL: " + "; ".join(failures or ["sanity checks"]), file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
