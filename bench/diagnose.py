"""Benchmark: the fleet-wide diagnosis against a naive per-target one, on a real Prometheus.

For 10 and 100 targets (each an engine, model and instance; vLLM, TGI, TensorRT-LLM and Triton mixed),
one hour of synthetic canonical series, a sample every 15 s ending a few seconds ago, is written as
OpenMetrics and backfilled with ``promtool tsdb create-blocks-from openmetrics``; Debian's Prometheus
then serves those blocks on 127.0.0.1 (no scrape job). A few targets are in trouble (preempting, a
queue backlog, errors) so the diagnosis has findings to make.

Measured: ``prometheus.read_fleet`` + ``evaluate.diagnose`` over a 10-minute window (the fixed set of
fleet-wide queries, aggregated by engine, model and instance). Baseline, in the same run and on the
same Prometheus: the naive per-target diagnosis, the same queries issued once per target with that
target's label matchers (N x the queries; the target list is given, not discovered), all targets
concurrently. Runs are interleaved; the min and median of each are printed.

Targets (exit 1 when one is missed): the number of upstream queries is the same for 10 and 100
targets; both diagnoses find exactly N targets; at 100 targets the fleet-wide diagnosis takes at
most 0.5x the per-target baseline (medians). Sanity checks (also exit 1): the troubled targets, and
only they, get their finding, and both approaches agree. Absolute times are for information.
Exit 2 when ``prometheus`` or ``promtool`` is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.diagnose_fleet import EXPECTED, STEP_S, Target, make_targets, write_openmetrics
from inferwatch.collector.diagnosis import prometheus
from inferwatch.collector.diagnosis.evaluate import diagnose
from inferwatch.collector.diagnosis.report import Diagnosis
from inferwatch.collector.diagnosis.signals import Filters, Fleet, TargetKey
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.symptoms import Status
from inferwatch.demo import free_ports
from tests.support.stack import Processes, prometheus_cmd, write_prometheus_config

ROOT = Path(__file__).resolve().parent.parent
SIZES = (10, 100)
TARGET_RATIO = 0.5
WINDOW = "10m"
HISTORY_S = 3600
END_LAG_S = 5
QUERY_TIMEOUT_S = 120.0
RETENTION = "3650d"
RUNS = 11
QUICK_RUNS = 5


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


def start_prometheus(procs: Processes, work: Path, n: int) -> Backfilled:
    """Write ``n`` targets' hour as OpenMetrics, backfill it into a fresh TSDB, serve it on loopback."""
    promtool, prometheus_bin = tool("promtool"), tool("prometheus")
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
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(data)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")
    t2 = time.perf_counter()
    config = work / "prometheus.yml"
    write_prometheus_config(config, {}, [])
    port = free_ports(1, 0)[0]
    cmd = [*prometheus_cmd(prometheus_bin, config, data, port), f"--storage.tsdb.retention.time={RETENTION}"]
    name = f"prometheus-{n}"
    procs.spawn(name, cmd)
    base = f"http://127.0.0.1:{port}"
    procs.wait_http(name, f"{base}/-/ready")
    return Backfilled(base, targets, samples, float(end), t1 - t0, t2 - t1)


# --- the two diagnoses ---------------------------------------------------------------------------


@dataclass
class Outcome:
    diagnosis: Diagnosis
    queries: int
    targets: int


async def fleet_wide(client: httpx.AsyncClient, base: str) -> Outcome:
    fleet = await prometheus.read_fleet(client, base, window=WINDOW, filters=Filters(), timeout=QUERY_TIMEOUT_S)
    result = diagnose(fleet, builtin_profiles())
    return Outcome(result, fleet.upstream_queries, len(fleet.targets))


async def per_target(client: httpx.AsyncClient, base: str, keys: Sequence[TargetKey]) -> Outcome:
    """The naive way: each target diagnosed on its own, its queries narrowed by its label matchers."""

    async def one(key: TargetKey) -> Fleet:
        only = Filters(engine=key.engine, model=key.model, instance=key.instance)
        return await prometheus.read_fleet(client, base, window=WINDOW, filters=only, timeout=QUERY_TIMEOUT_S)

    fleets = await asyncio.gather(*(one(k) for k in keys))
    merged = Fleet("prometheus", WINDOW, prometheus.window_seconds(WINDOW), upstream=base)
    for f in fleets:
        merged.targets.update(f.targets)
        merged.upstream_queries += f.upstream_queries
    result = diagnose(merged, builtin_profiles())
    return Outcome(result, merged.upstream_queries, len(merged.targets))


@dataclass
class Timing:
    times: list[float] = field(default_factory=list)
    last: Outcome | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)


async def measure(base: str, keys: Sequence[TargetKey], runs: int) -> tuple[Timing, Timing]:
    fleet, naive = Timing(), Timing()
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(limits=limits) as client:
        await fleet_wide(client, base)  # warm-up: Prometheus maps the blocks' chunks and index
        await per_target(client, base, keys)
        for _ in range(runs):
            t = time.perf_counter()
            fleet.last = await fleet_wide(client, base)
            fleet.times.append(time.perf_counter() - t)
            t = time.perf_counter()
            naive.last = await per_target(client, base, keys)
            naive.times.append(time.perf_counter() - t)
    return fleet, naive


def findings(result: Diagnosis) -> set[tuple[str, str, Status]]:
    return {(f.instance, f.symptom.value, f.severity) for f in result.findings}


def sanity(targets: Sequence[Target], fleet: Outcome, naive: Outcome) -> list[str]:
    problems = []
    by_instance = {t.instance: t for t in targets}
    found = findings(fleet.diagnosis)
    for t in targets:
        mine = {symptom for instance, symptom, _ in found if instance == t.instance}
        if t.trouble is None and mine:
            problems.append(f"healthy target {t.instance} ({t.engine}) has findings {sorted(mine)}")
        if t.trouble is not None and EXPECTED[t.trouble].value not in mine:
            problems.append(f"{t.trouble} target {t.instance} ({t.engine}) lacks {EXPECTED[t.trouble].value}: {mine}")
    unknown = {instance for instance, _, _ in found} - set(by_instance)
    if unknown:
        problems.append(f"findings for unknown instances {sorted(unknown)}")
    if found != findings(naive.diagnosis):
        problems.append(
            "the per-target diagnosis disagrees: "
            f"only fleet-wide {sorted(found - findings(naive.diagnosis))}, "
            f"only per-target {sorted(findings(naive.diagnosis) - found)}"
        )
    return problems


@dataclass
class Row:
    n: int
    fleet: Timing
    naive: Timing
    samples: int

    @property
    def fleet_outcome(self) -> Outcome:
        assert self.fleet.last is not None
        return self.fleet.last

    @property
    def naive_outcome(self) -> Outcome:
        assert self.naive.last is not None
        return self.naive.last

    @property
    def ratio(self) -> float:
        return self.fleet.median / self.naive.median


def run_size(procs: Processes, work: Path, n: int, runs: int) -> tuple[Row, list[str]]:
    served = start_prometheus(procs, work / f"n{n}", n)
    print(
        f"  {n} targets: {served.samples:,} samples written in {served.generate_s:.1f} s, "
        f"backfilled in {served.backfill_s:.1f} s",
        flush=True,
    )
    fleet, naive = asyncio.run(measure(served.base_url, [t.key for t in served.targets], runs))
    procs.stop(f"prometheus-{n}")
    age = time.time() - served.data_end
    row = Row(n, fleet, naive, served.samples)
    counts = Counter(f"{f.symptom.value} ({f.severity.value})" for f in row.fleet_outcome.diagnosis.findings)
    print(f"  {n} targets: findings {', '.join(f'{k} x{v}' for k, v in sorted(counts.items())) or 'none'}")
    problems = [f"{n} targets: {p}" for p in sanity(served.targets, row.fleet_outcome, row.naive_outcome)]
    if age > prometheus.window_seconds(WINDOW):
        problems.append(f"{n} targets: the last sample is {age:.0f} s old, older than the {WINDOW} window")
    return row, problems


def report(rows: Sequence[Row]) -> list[str]:
    print()
    print(
        f"{'targets':>7}  {'fleet queries':>13}  {'fleet median s':>14}  {'fleet min s':>11}  "
        f"{'per-target queries':>18}  {'per-target median s':>19}  {'per-target min s':>16}  {'ratio':>6}  "
        f"{'found':>11}  {'findings':>8}"
    )
    for r in rows:
        f, b = r.fleet_outcome, r.naive_outcome
        print(
            f"{r.n:>7}  {f.queries:>13}  {r.fleet.median:>14.4f}  {r.fleet.best:>11.4f}  "
            f"{b.queries:>18}  {r.naive.median:>19.4f}  {r.naive.best:>16.4f}  {r.ratio:>6.3f}  "
            f"{f.targets:>5}/{b.targets:<5}  {len(f.diagnosis.findings):>8}"
        )
    print("(ratio = fleet-wide median / per-target median; found = fleet-wide / per-target)")
    print()
    failures = []
    queries = {r.fleet_outcome.queries for r in rows}
    verdict = "OK" if len(queries) == 1 else "MISSED"
    print(
        f"{verdict}: upstream queries {' and '.join(str(r.fleet_outcome.queries) for r in rows)} for "
        f"{' and '.join(str(r.n) for r in rows)} targets (must not grow)"
    )
    if len(queries) != 1:
        failures.append("the number of upstream queries grows with the targets")
    for r in rows:
        if r.fleet_outcome.targets != r.n or r.naive_outcome.targets != r.n:
            failures.append(
                f"{r.n} targets: found {r.fleet_outcome.targets} fleet-wide, {r.naive_outcome.targets} per-target"
            )
    print(f"{'OK' if not failures else 'MISSED'}: targets found == N")
    largest = max(rows, key=lambda r: r.n)
    ok = largest.ratio <= TARGET_RATIO
    print(
        f"{'OK' if ok else 'MISSED'}: at {largest.n} targets the fleet-wide diagnosis takes {largest.ratio:.3f}x "
        f"the per-target baseline (target <= {TARGET_RATIO}x)"
    )
    if not ok:
        failures.append(f"ratio {largest.ratio:.3f} > {TARGET_RATIO} at {largest.n} targets")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs per side instead of {RUNS} (CI)")
    parser.add_argument("--runs", type=int, help="runs per side (at least 5)")
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
            row, found = run_size(procs, work, n, runs)
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
