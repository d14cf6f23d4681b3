"""Benchmark: one exporter process in front of a large fleet — 100 vLLM engines x 8 data-parallel ranks.

Every engine is the real vLLM 0.32.0 capture replicated over 8 ranks, replayed over HTTP on
127.0.0.1. The exporter runs as its own process (``inferwatch exporter serve --config``) so that
its CPU time is its own (read from /proc). Measured per scrape of the exporter's /metrics: wall
time, the exporter's CPU time, the canonical series and bytes it serves; and with 8 concurrent
scrapes, how many requests reach each engine (coalescing: one).

Baseline, in the same run: prometheus_client's parser over the same 100 engine pages (what a plain
Prometheus-client exporter would spend only reading them). Target: the exporter's CPU per scrape at
most 0.5x the baseline, and 8 concurrent scrapes coalesced into fewer than 2 requests per engine
(8 without coalescing; a scrape that arrives after an engine's request ended starts the next one).
Prints the figures; exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.exporter import CAPTURE
from tests.conftest import free_port
from tests.support.replay import JSON, TEXT, ReplayServer
from tests.support.synth import replicate

TARGET_RATIO = 0.5
COALESCED = 2.0
ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parse_all(pages: list[str]) -> int:
    return sum(len(f.samples) for page in pages for f in text_string_to_metric_families(page))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    page = replicate(CAPTURE.read_text(), args.ranks, ["llama"])
    routes: dict[str, tuple[str, bytes]] = {}
    for i in range(args.engines):
        routes[f"/e{i}/metrics"] = (TEXT, page.encode())
        routes[f"/e{i}/version"] = (JSON, b'{"version": "0.32.0"}')
    replay = ReplayServer(routes)
    base_url = replay.start()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "exporter.yaml"
        targets = [
            {"url": f"{base_url}/e{i}/metrics", "engine": "vllm", "name": f"e{i}", "labels": {"replica": f"e{i}"}}
            for i in range(args.engines)
        ]
        config.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{port}", "targets": targets}))
        cmd = [sys.executable, "-m", "inferwatch", "exporter", "serve", "--config", str(config), "--log-level", "error"]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            with httpx.Client(timeout=60) as client:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        body = client.get(url).text
                        break
                    except httpx.TransportError:
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise SystemExit("the exporter did not start") from None
                        time.sleep(0.2)
                series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
                walls, cpus, bases = [], [], []
                for _ in range(args.rounds):  # interleaved: noise hits both sides alike
                    t0 = time.perf_counter()
                    parse_all([page] * args.engines)
                    bases.append(time.perf_counter() - t0)
                    c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
                    body = client.get(url).text
                    walls.append(time.perf_counter() - t0)
                    cpus.append(cpu_seconds(proc.pid) - c0)
                # 8 concurrent scrapes: each engine should see one request per round, not eight
                before = sum(v for k, v in replay.hits.items() if k.endswith("/metrics"))
                with concurrent.futures.ThreadPoolExecutor(8) as pool:
                    statuses = list(pool.map(lambda _: client.get(url).status_code, range(8)))
                hits = sum(v for k, v in replay.hits.items() if k.endswith("/metrics")) - before
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            replay.stop()
    page_lines = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
    base, cpu, wall = min(bases), min(cpus), min(walls)
    ratio = cpu / base
    per_engine = hits / args.engines
    print(
        f"fleet: {args.engines} engines x {args.ranks} ranks, {page_lines} sample lines each "
        f"({args.engines * page_lines} in all, {args.engines * len(page) / 1e6:.1f} MB read per scrape)"
    )
    print(f"  served: {series} canonical series, {len(body) / 1e6:.2f} MB per scrape")
    print(f"  baseline, prometheus_client parsing the {args.engines} pages: {base * 1000:8.1f} ms")
    print(f"  exporter CPU per scrape:                        {cpu * 1000:8.1f} ms (wall {wall * 1000:.1f} ms)")
    print(f"  ratio: {ratio:.3f} (target <= {TARGET_RATIO})")
    print(
        f"  8 concurrent scrapes: statuses {sorted(set(statuses))}, {per_engine:.2f} engine requests per engine "
        f"(target < {COALESCED}; 8 without coalescing)"
    )
    failed = ratio > TARGET_RATIO or per_engine >= COALESCED or set(statuses) != {200}
    print("FAIL: target missed" if failed else "OK", file=sys.stderr if failed else sys.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
