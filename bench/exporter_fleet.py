"""Benchmark: one exporter process in front of a large fleet — 100 vLLM engines x 8 data-parallel ranks.

Every engine is the real vLLM 0.32.0 capture replicated over 8 ranks, served over HTTP on 127.0.0.1
by a stand-in engine that counts the requests it answers. The exporter runs as its own process
(``inferwatch exporter serve --config``) so that its CPU time is its own (read from /proc).

Measured per scrape of the exporter's /metrics: wall time, the exporter's CPU time, the canonical
series and bytes it serves. Baseline, in the same run: prometheus_client's parser over the same 100
engine pages (what a plain Prometheus-client exporter would spend only reading them). Target: the
exporter's CPU per scrape at most 0.5x the baseline.

Coalescing: 8 and then 32 scrapes sent at the same moment (from a process of their own, so that
nothing in this one delays them), ``--runs`` times each (10). Every run is one scrape interval; each
engine should answer one request per run (8 or 32 without coalescing). Target: at most 1.1 requests
per engine in the worst run, and every engine asked at least once in every run.

Checked, not only timed: the page served is the canonical page, sample for sample (each engine's page
through ``inferwatch exporter translate`` with its target's labels; only the scrape-duration gauge is
left out of the comparison); every concurrent scrape answers 200 with that same page. Prints the
figures; exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import re
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.exporter import CAPTURE
from inferwatch.core import vocabulary as V
from tests.conftest import free_port
from tests.support.replay import ReplayServer
from tests.support.synth import replicate

TARGET_RATIO = 0.5
CONCURRENCY = (8, 32)
MAX_PER_INTERVAL = 1.1
"""engine requests per engine in one scrape interval (one run of concurrent scrapes), worst run."""
SCRAPE_TIMEOUT_S = 300.0
ROOT = Path(__file__).resolve().parent.parent
DURATION = re.compile(rb"(?m)^" + re.escape(V.EXPORTER_SCRAPE_DURATION.name.encode()) + rb"\{[^\n]*\n")
"""the one gauge that differs between two scrapes of the same pages: left out of every comparison."""


VERSION = b'{"version": "0.32.0"}'
"""what the engines answer at vLLM's info endpoint (/version)."""


class CountingEngine:
    """The fleet's engines: fixed pages at ``/e<i>/metrics`` and vLLM's ``/version``, and how often each
    page was asked (with a backlog as deep as a real engine's, so that the exporter's 100 connections at
    once are not dropped and retried a second later)."""

    def __init__(self, page: bytes, engines: int) -> None:
        self.paths = [f"/e{i}/metrics" for i in range(engines)]
        routes = {p: ("text/plain; version=0.0.4; charset=utf-8", page) for p in self.paths}
        routes["/version"] = ("application/json", VERSION)
        self.server = ReplayServer(routes, backlog=1024)
        self.url = self.server.start()

    def hits(self) -> list[int]:
        """Requests for each engine's metrics page so far."""
        return self.server.count(self.paths)

    def stop(self) -> None:
        self.server.stop()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parse_all(pages: list[str]) -> int:
    return sum(len(f.samples) for page in pages for f in text_string_to_metric_families(page))


def without_duration(body: bytes) -> bytes:
    return DURATION.sub(b"", body)


def digest(body: bytes) -> str:
    return hashlib.sha256(without_duration(body)).hexdigest()


def expected_page(page: str, engines: int, tmp: Path) -> list[str]:
    """The canonical fleet page, sorted line by line (scrape durations left out): ``inferwatch exporter
    translate`` of the engine page (and its /version) as target ``e0``, relabelled for each engine."""
    capture, info = tmp / "e0", tmp / "version.json"
    capture.write_text(page)
    info.write_bytes(VERSION)
    cmd = [sys.executable, "-m", "inferwatch", "exporter", "translate", "--engine", "vllm", "--info", str(info)]
    cmd += ["--label", "replica=e0", str(capture)]
    one = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    one = without_duration(one.encode()).decode()
    lines = [line for line in one.splitlines() if line and not line.startswith("#")]
    comments = sorted({line for line in one.splitlines() if line.startswith("#")})
    return comments + sorted(line.replace('="e0"', f'="e{i}"') for i in range(engines) for line in lines)


def page_lines(body: str) -> list[str]:
    """``body`` as :func:`expected_page` lays it out: its distinct comment lines, then its samples sorted."""
    body = without_duration(body.encode()).decode()
    comments = sorted({line for line in body.splitlines() if line.startswith("#")})
    return comments + sorted(line for line in body.splitlines() if line and not line.startswith("#"))


def scrape_together(port: int, n: int) -> list[tuple[int, str, int]]:
    """``n`` scrapes of the exporter sent at the same moment: ``n`` connections opened, then one request
    written on each in a row; (status, :func:`digest` of the body, body bytes) of each answer. Runs in a
    process of its own: no thread of the benchmark (the engines) slows the row of writes."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=SCRAPE_TIMEOUT_S) for _ in range(n)]
    request = f"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    for s in socks:
        s.sendall(request)
    sel = selectors.DefaultSelector()
    answers: dict[socket.socket, bytearray] = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        answers[s] = bytearray()
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    open_ = len(socks)
    while open_ and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1.0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            chunk = sock.recv(1 << 20)
            if chunk:
                answers[sock] += chunk
            else:
                sel.unregister(sock)
                sock.close()
                open_ -= 1
    out = []
    for s in socks:
        raw = bytes(answers[s])
        head, _, body = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
        out.append((status, digest(body), len(body)))
        s.close()
    return out


def judge(n: int, per_run: list[list[int]]) -> tuple[str, list[str]]:
    """``n`` scrapes at once, the requests each engine answered in each run: the line to print, and the misses
    (a run over :data:`MAX_PER_INTERVAL` requests per engine on average; an engine not asked in a run)."""
    means = [sum(asked) / len(asked) for asked in per_run]
    most = max(max(asked) for asked in per_run)
    least = min(min(asked) for asked in per_run)
    line = (
        f"  {n:>4} at once: worst run {max(means):.2f}, median {statistics.median(means):.2f}; "
        f"one engine: at most {most}, at least {least}"
    )
    misses = []
    if max(means) > MAX_PER_INTERVAL:
        misses.append(f"{n} concurrent scrapes: {max(means):.2f} engine requests per engine in one run")
    if least < 1:
        misses.append(f"{n} concurrent scrapes: an engine was not asked at all in a run ({least} requests)")
    return line, misses


def _wait_up(client: httpx.Client, url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            client.get(url)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the exporter did not start") from None
            time.sleep(0.2)


@dataclass
class Sequential:
    """Scrapes one at a time, interleaved with the baseline (noise hits both sides alike)."""

    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    bases: list[float] = field(default_factory=list)
    body: str = ""


def _sequential(
    client: httpx.Client, url: str, pid: int, engine: CountingEngine, page: str, n: int, rounds: int
) -> tuple[Sequential, list[str]]:
    out, failures = Sequential(), []
    for _ in range(rounds):
        t0 = time.perf_counter()
        parse_all([page] * n)
        out.bases.append(time.perf_counter() - t0)
        before = engine.hits()
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        response = client.get(url)
        out.walls.append(time.perf_counter() - t0)
        out.cpus.append(cpu_seconds(pid) - c0)
        asked = [b - a for a, b in zip(before, engine.hits(), strict=True)]
        if response.status_code != 200 or set(asked) != {1}:
            failures.append(
                f"a scrape alone: status {response.status_code}, engines asked {sorted(set(asked))} "
                "times (not once each)"
            )
        out.body = response.text
    return out, failures


def _concurrent(
    clients: Any, port: int, engine: CountingEngine, reference: str, runs_each: int
) -> tuple[dict[int, list[list[int]]], list[str]]:
    runs: dict[int, list[list[int]]] = {}
    failures = []
    for n in CONCURRENCY:
        runs[n] = []
        for _ in range(runs_each):
            before = engine.hits()
            answers = clients.apply(scrape_together, (port, n))
            runs[n].append([b - a for a, b in zip(before, engine.hits(), strict=True)])
            bad = [a for a in answers if a[0] != 200 or a[1] != reference]
            if bad:
                failures.append(
                    f"{n} concurrent scrapes: {len(bad)} answered other than 200 with the canonical page "
                    f"(statuses {sorted({a[0] for a in bad})}, {min(a[2] for a in bad):,} bytes or more)"
                )
    return runs, failures


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="sequential scrapes timed against the baseline")
    parser.add_argument("--runs", type=int, default=10, help="runs of each count of concurrent scrapes")
    args = parser.parse_args()

    page = replicate(CAPTURE.read_text(), args.ranks, ["llama"])
    engine = CountingEngine(page.encode(), args.engines)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        expected = expected_page(page, args.engines, Path(tmp))
        config = Path(tmp) / "exporter.yaml"
        targets = [
            {"url": f"{engine.url}/e{i}/metrics", "engine": "vllm", "name": f"e{i}", "labels": {"replica": f"e{i}"}}
            for i in range(args.engines)
        ]
        config.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{port}", "targets": targets}))
        cmd = [sys.executable, "-m", "inferwatch", "exporter", "serve", "--config", str(config), "--log-level", "error"]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        clients = multiprocessing.get_context("spawn").Pool(1)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            with httpx.Client(timeout=60) as client:
                _wait_up(client, url, proc)
                seq, failures = _sequential(client, url, proc.pid, engine, page, args.engines, args.rounds)
            body = seq.body
            canonical = page_lines(body) == expected
            if not canonical:
                failures.append("the page served is not the canonical page of the engines")
            runs, more = _concurrent(clients, port, engine, digest(body.encode()), args.runs)
            failures += more
        finally:
            clients.terminate()
            clients.join()
            _stop(proc)
            engine.stop()
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    sample_lines = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
    base, cpu, wall = min(seq.bases), min(seq.cpus), min(seq.walls)
    ratio = cpu / base
    print(
        f"fleet: {args.engines} engines x {args.ranks} ranks, {sample_lines} sample lines each "
        f"({args.engines * sample_lines} in all, {args.engines * len(page) / 1e6:.1f} MB read per scrape)"
    )
    print(f"  served: {series} canonical series, {len(body) / 1e6:.2f} MB per scrape")
    print(f"  the page served is the canonical page: {'yes' if canonical else 'NO'}")
    print(f"  baseline, prometheus_client parsing the {args.engines} pages: {base * 1000:8.1f} ms")
    print(f"  exporter CPU per scrape:                        {cpu * 1000:8.1f} ms (wall {wall * 1000:.1f} ms)")
    print(f"  ratio: {ratio:.3f} (target <= {TARGET_RATIO})")
    print(f"  scrapes sent at once, {args.runs} runs each: engine requests per engine in one run")
    print(f"  (target <= {MAX_PER_INTERVAL} in the worst run; without coalescing: the count of scrapes)")
    for n, per_run in runs.items():
        line, misses = judge(n, per_run)
        print(line)
        failures += misses
    if ratio > TARGET_RATIO:
        failures.append(f"CPU ratio {ratio:.3f} > {TARGET_RATIO}")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    if failures:
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
