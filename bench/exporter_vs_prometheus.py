"""Benchmark: the exporter's CPU per scrape against Prometheus's own, real processes side by side.

For each engine page (vLLM with 8 data-parallel ranks, TGI, trtllm-serve, Triton), a tiny HTTP server in
this process serves the page (and the engine's info endpoint) three times over, its values moving from
request to request as under load (every sample line's value differs from the last scrape's; the values
stop moving for the checks at the end), and four real processes run: Prometheus scraping the raw page
(*direct*); Prometheus scraping it with ``metric_relabel_configs`` that rename the engine's families and
labels to the canonical ones (the user's alternative to a sidecar, *relabel*); the exporter
(``inferwatch exporter serve``) in front of the page; and Prometheus scraping the exporter. Every
Prometheus scrapes each second. The pages are measured at once, each with its own page servers and
processes, so that each is measured for the whole run (300 s; 120 s with ``--quick``): at one scrape a
second, a Prometheus's CPU per scrape moved by a third between runs of 20 s (as its periodic work
fell in the window or not), and a page after another left 20 s to each in a 3-minute run.

Measured over the run, after a warm-up: each process's CPU time, divided by the scrapes it served or
made (the page servers count the requests). The CPU time is the sum of the process's threads'
scheduler run time (``/proc/PID/task/*/schedstat``, nanoseconds): utime + stime count 10 ms ticks,
0.4 ms per scrape over a 20 s run, coarser than a small page's scrape. Target: the exporter's CPU
per scrape at most 1.0x the relabel Prometheus's. The work is checked as well: every Prometheus
scraped (``up`` is 1), the exporter served canonical series (its own ``up`` is 1), and for each
canonical family that both the relabel side and the exporter side store with the same number of
series, the sum of their values (histograms: ``_count`` and ``_sum``) is the same on both sides.
Exits 1 when a target or a check is missed. ``--quick`` runs a short form (under 3 minutes).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.exporter_fleet import cpu_seconds
from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import EngineAdapter, Row
from tests.conftest import free_port
from tests.support.replay import JSON, TEXT, ReplayServer
from tests.support.stack import INFERWATCH, Processes, prometheus_cmd
from tests.support.synth import replicate

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "engines"
TARGET_RATIO = 1.0
SETTLE_SECONDS = 0.3
"""after a side's page was requested, how long until its scrape is surely over (scrapes are 1 s apart)."""
SIDES = ("direct", "relabel", "exporter")
"""the page servers: one per process that reads the engine page."""


@dataclass(frozen=True)
class Page:
    """One engine page and what its engine serves beside it."""

    label: str
    engine: str
    path: str
    routes: dict[str, tuple[str, bytes]]
    options: dict[str, str]

    @property
    def body(self) -> bytes:
        return self.routes[self.path][1]

    @property
    def samples(self) -> int:
        return sum(1 for ln in self.body.decode().splitlines() if ln and not ln.startswith("#"))


def _version(value: str) -> tuple[str, bytes]:
    return JSON, json.dumps({"version": value}).encode()


def pages() -> list[Page]:
    """The pages of issue 35: vLLM's real 0.32.0 capture over 8 ranks, and the TGI, trtllm-serve and
    Triton fixtures as they are."""
    vllm = replicate((FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-final.txt").read_text(), 8, ["tiny-llama"])
    tgi = FIXTURES / "tgi" / "3.3.7"
    return [
        Page(
            "vLLM, 8 ranks",
            V.ENGINE_VLLM,
            "/metrics",
            {"/metrics": (TEXT, vllm.encode()), "/version": _version("0.32.0")},
            {},
        ),
        Page(
            "TGI 3.3.7",
            "tgi",
            "/metrics",
            {"/metrics": (TEXT, (tgi / "metrics.txt").read_bytes()), "/info": (JSON, (tgi / "info.json").read_bytes())},
            {"max_batch_total_tokens": "16384"},
        ),
        Page(
            "trtllm-serve (gen C)",
            "trtllm",
            "/prometheus/metrics",
            {
                "/prometheus/metrics": (TEXT, (FIXTURES / "trtllm" / "gen-c" / "prometheus.txt").read_bytes()),
                # the JSON iteration stats, drained by the exporter; empty between iterations
                "/metrics": (JSON, b"[]"),
                "/version": _version("1.2.0"),
            },
            {},
        ),
        Page(
            "Triton 25.03 TRT-LLM",
            "triton",
            "/metrics",
            {
                "/metrics": (TEXT, (FIXTURES / "triton" / "25.03-trtllm" / "metrics.txt").read_bytes()),
                "/v2": _version("2.56.0"),
            },
            {},
        ),
    ]


VARIANTS = 16
"""pages a page server cycles through: the engine's values move between scrapes, as under load."""


def moving(body: bytes, step: int) -> bytes:
    """``body`` with every finite sample value raised by ``step`` (a histogram's buckets all alike, so
    they stay cumulative): the page of an engine ``step`` moments later, every line's value new."""
    out = []
    for line in body.decode().split("\n"):
        head, _, value = line.rpartition(" ")
        if head and line[0] != "#":
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if math.isfinite(number):
                line = f"{head} {number + step!r}"
        out.append(line)
    return "\n".join(out).encode()


class PageServer(ReplayServer):
    """An engine's routes with HTTP/1.1 keep-alive (a scraper reuses its connection). The engine page's
    values move from request to request (:data:`VARIANTS` pages in turn) until :meth:`hold`, from
    when it serves the page as it is (so that every side's last scrape reads the same values)."""

    def __init__(self, routes: dict[str, tuple[str, bytes]], page_path: str | None = None) -> None:
        super().__init__(routes, keep_alive=True)
        self.page_path = page_path
        self.variants = [] if page_path is None else [moving(routes[page_path][1], s) for s in range(1, VARIANTS + 1)]
        self.held = False

    def hold(self) -> None:
        self.held = True

    def answer(self, path: str, hit: int) -> tuple[str, bytes] | None:
        found = self.routes.get(path)
        if found is not None and path == self.page_path and self.variants and not self.held:
            return found[0], self.variants[hit % VARIANTS]
        return found


# -- the relabel side: what a user writes to get canonical names without a sidecar -------------------
def _spec_regex(spec: V.MetricSpec) -> str:
    return f"{re.escape(spec.name)}_(?:bucket|sum|count)" if spec.kind is V.Kind.HISTOGRAM else re.escape(spec.name)


def _renamable(row: Row) -> bool:
    """Rows a rename can express: no unit change, no pivot on a label, no sum-only histogram."""
    return row.divisor == 1.0 and not row.match and not row.const and not row.sum_only


def relabel_rules(adapter: EngineAdapter) -> list[dict[str, Any]]:
    """``metric_relabel_configs`` renaming ``adapter``'s families, labels and label values to the
    canonical ones where a rename can (one rule per canonical family, per label and per value), and
    setting the canonical ``engine`` label on the renamed series."""
    rules: list[dict[str, Any]] = []
    moves: dict[tuple[str, str], list[str]] = {}
    values: list[dict[str, Any]] = []
    renamed: list[str] = []
    for row in adapter.rows:
        if not _renamable(row):
            continue
        names = [n for s in row.sources for n in (s, *(adapter.aliases(s) if adapter.aliases else ()))]
        sources = "|".join(re.escape(n) for n in names)
        if row.metric.kind is V.Kind.HISTOGRAM:
            rule = {"regex": f"({sources})_(bucket|sum|count)", "replacement": f"{row.metric.name}_${{2}}"}
        else:
            rule = {"regex": f"({sources})", "replacement": row.metric.name}
        rules.append({"source_labels": ["__name__"], "target_label": "__name__", **rule})
        name_re = _spec_regex(row.metric)
        renamed.append(name_re)
        for src, canon in row.labels.items():
            if src != canon and src not in row.values:
                moves.setdefault((src, canon), []).append(name_re)
        for src, vmap in row.values.items():
            target = row.labels.get(src, src)
            for raw, canon_value in vmap.items():
                if canon_value is not None and raw != "*":
                    values.append(
                        {
                            "source_labels": ["__name__", src],
                            "regex": f"(?:{name_re});{re.escape(raw)}",
                            "target_label": target,
                            "replacement": canon_value,
                        }
                    )
    for (src, canon), name_res in sorted(moves.items()):
        rules.append(
            {
                "source_labels": ["__name__", src],
                "regex": f"(?:{'|'.join(name_res)});(.+)",
                "target_label": canon,
                "replacement": "${1}",
            }
        )
    rules.extend(values)
    if renamed:
        rules.append(
            {
                "source_labels": ["__name__"],
                "regex": "|".join(renamed),
                "target_label": V.LABEL_ENGINE,
                "replacement": adapter.name,
            }
        )
    return rules


def write_config(path: Path, job: str, target: str, metrics_path: str, rules: list[dict[str, Any]]) -> None:
    scrape: dict[str, Any] = {"job_name": job, "metrics_path": metrics_path, "static_configs": [{"targets": [target]}]}
    if rules:
        scrape["metric_relabel_configs"] = rules
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": [scrape]}
    path.write_text(yaml.safe_dump(config, sort_keys=False))


# -- one run ------------------------------------------------------------------------------------------
@dataclass
class Figures:
    """CPU milliseconds per scrape of each process, the scrapes counted, and the checks' outcome."""

    page: Page
    direct: float
    relabel: float
    via: float
    exporter: float
    scrapes: int
    compared: int
    problems: list[str]

    @property
    def ratio(self) -> float:
        return self.exporter / self.relabel


@dataclass(frozen=True)
class CpuReading:
    """A process's CPU time two ways: its threads' scheduler run time (``/proc/PID/task/*/schedstat``,
    nanoseconds) and utime + stime (``/proc/PID/stat``, 10 ms ticks, including threads that ended)."""

    ticks: float
    threads: dict[int, int]

    @classmethod
    def of(cls, pid: int) -> CpuReading:
        threads = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                threads[int(task.name)] = int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
        return cls(cpu_seconds(pid), threads)

    def since(self, before: CpuReading) -> float:
        """CPU seconds from ``before`` to this reading: the threads' exact run time, unless a thread
        ended in between (its time is then only in the ticks), which the ticks tell."""
        exact = sum(ns - before.threads.get(tid, 0) for tid, ns in self.threads.items()) / 1e9
        ticks = self.ticks - before.ticks
        gone = set(before.threads) - set(self.threads)
        return ticks if gone or ticks > exact * 1.05 + 0.03 else exact


class _Side:
    """A process reading one page server: its CPU and the requests it made, at settled moments."""

    def __init__(self, server: PageServer, path: str, pid: int) -> None:
        self.server, self.path, self.pid = server, path, pid

    def hits(self) -> int:
        return self.server.hits.get(self.path, 0)

    def settled(self) -> Reading:
        """CPU time and requests just after a scrape ended (so that none is half counted)."""
        before = self.hits()
        deadline = time.monotonic() + 5
        while self.hits() == before and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(SETTLE_SECONDS)
        return CpuReading.of(self.pid), self.hits()


@dataclass
class Running:
    """One page's page servers and processes, started (see :func:`start`)."""

    page: Page
    adapter: EngineAdapter
    servers: dict[str, PageServer]
    procs: Processes
    proms: dict[str, tuple[int, int]]
    """each Prometheus's process id and port."""
    sides: dict[str, _Side]

    def close(self) -> None:
        try:
            self.procs.close()
        finally:
            for server in self.servers.values():
                server.stop()


def start(page: Page, prometheus: str, tmp: Path) -> Running:
    """Start ``page``'s page servers, the exporter in front of one, and the three Prometheus servers."""
    adapter = builtin_registry().get(page.engine)
    procs = Processes(tmp / "logs", cwd=ROOT)
    servers = {side: PageServer(page.routes, page.path) for side in SIDES}
    running = Running(page, adapter, servers, procs, {}, {})
    try:
        for server in servers.values():
            server.start()
        exporter_port = free_port()
        cmd = [*INFERWATCH, "exporter", "serve", "--engine", page.engine, "--listen", f"127.0.0.1:{exporter_port}"]
        cmd += ["--target", servers["exporter"].url + page.path, "--log-level", "error"]
        for name, value in page.options.items():
            cmd += ["--engine-option", f"{name}={value}"]
        exporter = procs.spawn("exporter", cmd)
        procs.wait_http("exporter", f"http://127.0.0.1:{exporter_port}/healthz")
        jobs = {
            "direct": (servers["direct"].url, page.path, []),
            "relabel": (servers["relabel"].url, page.path, relabel_rules(adapter)),
            "via": (f"http://127.0.0.1:{exporter_port}", "/metrics", []),
        }
        for name, (url, path, rules) in jobs.items():
            port = free_port()
            write_config(tmp / f"{name}.yml", name, url.removeprefix("http://"), path, rules)
            proc = procs.spawn(name, prometheus_cmd(prometheus, tmp / f"{name}.yml", tmp / f"data-{name}", port))
            procs.wait_http(name, f"http://127.0.0.1:{port}/-/ready")
            running.proms[name] = (proc.pid, port)
        running.sides = {
            "direct": _Side(servers["direct"], page.path, running.proms["direct"][0]),
            "relabel": _Side(servers["relabel"], page.path, running.proms["relabel"][0]),
            "via": _Side(servers["exporter"], page.path, running.proms["via"][0]),
            "exporter": _Side(servers["exporter"], page.path, exporter.pid),
        }
    except BaseException:
        running.close()
        raise
    return running


Reading = tuple[CpuReading, int]


def figures(running: Running, start: dict[str, Reading], end: dict[str, Reading], seconds: float) -> Figures:
    """CPU per scrape of each process of ``running`` between its two settled readings, and the checks."""
    per_scrape = {}
    counted = {}
    for name in running.sides:
        counted[name] = end[name][1] - start[name][1]
        per_scrape[name] = end[name][0].since(start[name][0]) / max(1, counted[name]) * 1000
    problems = [f"{name}: {n} scrapes counted" for name, n in counted.items() if n < seconds / 2]
    compared = check(running.adapter, {name: port for name, (_, port) in running.proms.items()}, problems)
    return Figures(
        running.page,
        per_scrape["direct"],
        per_scrape["relabel"],
        per_scrape["via"],
        per_scrape["exporter"],
        min(counted.values()),
        compared,
        problems,
    )


def _readings(running: Running) -> dict[str, Reading]:
    """Every side of ``running`` read just after one of its scrapes ended (the sides waited for at once)."""
    with ThreadPoolExecutor(max_workers=len(running.sides)) as pool:
        return dict(zip(running.sides, pool.map(_Side.settled, running.sides.values()), strict=True))


def run(chosen: list[Page], prometheus: str, warmup: float, seconds: float, tmp: Path) -> list[Figures]:
    """Start every page's processes (the pages at once: see the module docstring), measure ``seconds``
    after ``warmup``, check, stop."""
    runs: list[Running] = []
    with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
        started = [pool.submit(start, page, prometheus, tmp / f"page-{i}") for i, page in enumerate(chosen)]
        try:
            failure: BaseException | None = None
            for future in started:
                try:
                    runs.append(future.result())
                except BaseException as exc:  # the others are stopped below, then this is raised
                    failure = failure or exc
            if failure is not None:
                raise failure
            time.sleep(warmup)
            # each side's reading just after one of its scrapes ended, every page's sides at once
            first = list(pool.map(_readings, runs))
            time.sleep(seconds)
            last = list(pool.map(_readings, runs))
            for r in runs:  # the values stop moving: every side's last scrape reads them
                for server in r.servers.values():
                    server.hold()
            time.sleep(2.5)
            return [figures(r, a, b, seconds) for r, a, b in zip(runs, first, last, strict=True)]
        finally:
            list(pool.map(Running.close, runs))


def _query(port: int, promql: str) -> dict[str, float]:
    """``promql``'s instant vector, by metric name (or ``""`` when the result has no name)."""
    answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": promql}, timeout=10).json()
    return {r["metric"].get("__name__", ""): float(r["value"][1]) for r in answer["data"]["result"]}


def check(adapter: EngineAdapter, ports: dict[str, int], problems: list[str]) -> int:
    """Whether the work happened and is right; appends what is wrong to ``problems``. Returns how many
    canonical series names were compared between the relabel side and the exporter side."""
    for name, port in ports.items():
        if _query(port, "min(up)").get("") != 1.0:
            problems.append(f"{name}: Prometheus's scrape is not up")
    if _query(ports["via"], f"min({V.EXPORTER_UP.name})").get("") != 1.0:
        problems.append("the exporter's own up gauge is not 1")
    specs = {r.metric for r in (*adapter.rows, *adapter.hook_rows)} | set(adapter.hook_metrics)
    names = []
    for spec in specs:
        names.extend([f"{spec.name}_count", f"{spec.name}_sum"] if spec.kind is V.Kind.HISTOGRAM else [spec.name])
    pattern = json.dumps("|".join(re.escape(n) for n in sorted(names)))
    selector = f"{{__name__=~{pattern}}}"
    served = _query(ports["via"], f"count by (__name__) ({selector})")
    if not served:
        problems.append("the exporter served no canonical series")
    counts = _query(ports["relabel"], f"count by (__name__) ({selector})")
    if not counts:
        problems.append("the relabel side stored no canonical series")
    sums = {side: _query(ports[side], f"sum by (__name__) ({selector})") for side in ("relabel", "via")}
    compared = 0
    for name, n in sorted(counts.items()):
        if served.get(name) != n:
            continue  # the exporter merged or dropped series here: not comparable by sum
        want, got = sums["relabel"].get(name, math.nan), sums["via"].get(name, math.nan)
        if math.isnan(want) and math.isnan(got):
            continue
        compared += 1
        if not math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-12):
            problems.append(f"{name}: the relabel side sums to {want!r}, the exporter's to {got!r}")
    if not compared:
        problems.append("no canonical series name could be compared between the two sides")
    return compared


# -- the report ---------------------------------------------------------------------------------------
HEADER = f"{'page':<21}{'samples':>8}{'KB':>5}{'direct':>8}{'relabel':>8}{'via exp':>8}{'exporter':>9}{'ratio':>7}"
"""80 columns at most, ``ms`` of CPU per scrape for each process, ``ratio`` = exporter / relabel."""


def row(f: Figures) -> str:
    verdict = "ok" if f.ratio <= TARGET_RATIO and not f.problems else "MISS"
    return (
        f"{f.page.label:<21}{f.page.samples:>8}{len(f.page.body) // 1000:>5}{f.direct:>8.2f}{f.relabel:>8.2f}"
        f"{f.via:>8.2f}{f.exporter:>9.2f}{f.ratio:>7.2f}  {verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="120 s measured instead of 300 (under 3 minutes)")
    parser.add_argument("--seconds", type=float, help="measured seconds (default 300, 120 with --quick)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring (default 3)")
    parser.add_argument("--only", help="run the pages whose label contains this text")
    args = parser.parse_args()
    seconds = args.seconds or (120.0 if args.quick else 300.0)
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("FAIL: prometheus not found (Debian package 'prometheus'; `make install` installs it)", file=sys.stderr)
        return 1
    chosen = [p for p in pages() if args.only is None or args.only.lower() in p.label.lower()]
    print(f"CPU ms per scrape, the pages at once for {seconds:g} s, one scrape a second; ratio = exporter / relabel")
    with tempfile.TemporaryDirectory() as tmp:
        results = run(chosen, prometheus, args.warmup, seconds, Path(tmp))
    print(HEADER)
    for figures_of_page in results:
        print(row(figures_of_page))
    failed = False
    for f in results:
        print(f"  {f.page.label}: {f.scrapes} scrapes each, {f.compared} canonical names compared")
        for problem in f.problems:
            print(f"    problem: {problem}")
        failed |= f.ratio > TARGET_RATIO or bool(f.problems)
    print(f"target: exporter <= {TARGET_RATIO:g}x the relabel Prometheus's CPU per scrape, on every page")
    print("FAIL: target or check missed" if failed else "OK", file=sys.stderr if failed else sys.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
