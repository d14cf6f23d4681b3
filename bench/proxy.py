"""Benchmark: ``inferwatch proxy`` against a direct connection to the same engine and against its peers,
in one run.

The engine is simulated here, as lean as it can be so that it does not compete with what is measured:
an OpenAI ``/v1/completions`` SSE server (raw asyncio, its own process) that streams every stream at a
fixed rate (``--interval-ms``, default 20 ms: 50 tokens/s), each chunk stamped with the monotonic time
it was written. The client (this process) is raw asyncio as well. By default (``--cores split``) each
hop runs on a CPU of its own, as a sidecar given a one-core request would, and the engine and the
client share the others; with everything on two shared cores, a chunk that arrives while the proxy
waits for a core waits with it, and the p99 measures the scheduler (docs/proxy.md).

The hops, measured in the same interleaved rounds (``bench/proxy_sides.py``): inferwatch's proxy; haproxy
(HTTP mode, ``option http-no-delay``), the lean hop a user would put there instead; LiteLLM's proxy
with ``--litellm`` (a gateway that also counts; measured, not judged); and a bare TCP relay
(``--serve-relay``: copies bytes and nothing else), the floor any hop through a process has here.

1. **Added latency per chunk** at 64 concurrent streams: each stream is opened twice, once directly and
   once through the hop, and the engine writes each chunk to both connections at the same instant
   (in alternating order), so every chunk has a direct and a hopped arrival time. Reported: p50 and
   p99 of (arrival through the hop − arrival direct), each arrival the kernel's receive time of the
   chunk (``SO_TIMESTAMPNS``), so that the client's own scheduling stays out of it. The relay's p99
   swings between 0.5 and 2 ms from round to round here, the virtual machine's wake-up latency.
   **Target: the proxy's own p99, best round minus the relay's best round, < 1 ms**. The streams start
   at staggered phases (a real engine's batch emits its tokens together; see docs/proxy.md).
2. **Throughput** at 256 concurrent streams, closed loop for ``--duration`` seconds per side and round,
   direct first: streams/s and chunks/s. **Target: proxy ≥ 0.9x direct for both.** Each hop's CPU time
   (user + system, its process group's) per 1,000 chunks.
3. **Against haproxy** (issue 35; best rounds): throughput ≥ 0.95x haproxy's, CPU per chunk ≤ 1.5x
   haproxy's, added p99 within 0.5 ms of haproxy's. Missing haproxy skips these, except under ``CI``.
4. **Memory per open stream**: the proxy's resident memory with 256 slow streams open, minus its
   resident memory idle after the throughput phase, divided by 256.

``--quick``: CI-size phases. ``--proxy-cmd`` benchmarks another command in the proxy's place (``{listen}``,
``{upstream}`` substituted; how the stack was chosen, docs/proxy.md). Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shlex
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.proxy_peers import relay_main, upstream_main
from bench.proxy_sides import (
    MissingPeer,
    Side,
    SideFigures,
    find_haproxy,
    group_cpu_seconds,
    haproxy_cmd,
    judge_haproxy,
    litellm_cmd,
    litellm_exe,
    peer_table,
    placement,
    start,
    stop,
    wait_port,
)
from inferwatch.demo import free_ports

ROOT = Path(__file__).resolve().parent.parent
LATENCY_P99_TARGET_MS = 1.0
THROUGHPUT_TARGET = 0.9
PAIR_RUNS = itertools.count()


# -- the client ---------------------------------------------------------------------------------------
def completion_request(body: dict[str, object]) -> bytes:
    payload = json.dumps(body).encode()
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
    )


def record_event(out: Stream, event: bytes, arrived_ns: int) -> None:
    """The engine's write stamp of an SSE ``event`` (its ``"t"``), with the arrival, into ``out``."""
    at = event.find(b'"t":')
    if at >= 0:
        out.sent_ns.append(int(event[at + 4 : event.index(b"}", at)]))
        out.arrived_ns.append(arrived_ns)
    elif b'"text":' in event:  # re-serialized by the proxy (LiteLLM): no stamp; its finish-only events skipped
        out.sent_ns.append(-1)
        out.arrived_ns.append(arrived_ns)


@dataclass
class Stream:
    sent_ns: list[int] = field(default_factory=list)
    arrived_ns: list[int] = field(default_factory=list)


class Connection:
    """One keep-alive HTTP/1.1 connection that posts streaming completions and reads their SSE events."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, body: dict[str, object]) -> Stream:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
        assert self.reader is not None
        self.writer.write(completion_request(body))
        reader = self.reader
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            raise RuntimeError(f"status {status}: {head!r}")
        out = Stream()
        pending = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            data = await reader.readexactly(size + 2)
            now = time.perf_counter_ns()
            pending += data[:-2]
            while b"\n\n" in pending:
                event, pending = pending.split(b"\n\n", 1)
                record_event(out, event, now)
        return out

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


SO_TIMESTAMPNS = 35
"""Linux's socket option (asm-generic/socket.h; Python names none): each read comes with the kernel's
receive time of its data (on loopback, the moment the sender's ``send`` put it into the socket)."""


class StampedConnection:
    """One streaming completion whose chunks are timed by the kernel's receive time (``SO_TIMESTAMPNS``),
    not by when this process gets round to reading them: 128 connections share this client's loop,
    and a chunk that waits for the loop would add the client's scheduling to what the proxy adds. The
    time is CLOCK_REALTIME, for both connections of a pair alike; where the option is refused, the
    read's own time."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def request(self, body: dict[str, object]) -> Stream:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # refused: each read's own time stands
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        out = Stream()
        done: asyncio.Future[None] = loop.create_future()
        buf = bytearray()
        state = {"head": True, "size": -1}
        pending = bytearray()

        def feed(now: int) -> None:
            while True:
                if state["head"]:
                    end = buf.find(b"\r\n\r\n")
                    if end < 0:
                        return
                    status = int(bytes(buf[: buf.index(b"\r\n")]).split(b" ", 2)[1])
                    if status != 200:
                        raise RuntimeError(f"status {status}: {bytes(buf[:end])!r}")
                    del buf[: end + 4]
                    state["head"] = False
                if state["size"] < 0:
                    end = buf.find(b"\r\n")
                    if end < 0:
                        return
                    state["size"] = int(bytes(buf[:end]).split(b";")[0], 16)
                    del buf[: end + 2]
                size = state["size"]
                if len(buf) < size + 2:
                    return
                if size == 0:
                    done.set_result(None)
                    return
                pending.extend(buf[:size])
                del buf[: size + 2]
                state["size"] = -1
                while (end := pending.find(b"\n\n")) >= 0:
                    record_event(out, bytes(pending[:end]), now)
                    del pending[: end + 2]

        def readable() -> None:
            if done.done():
                return
            try:
                data, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                done.set_exception(e)
                return
            now = time.time_ns()
            for level, kind, raw in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                    sec, nsec = struct.unpack("qq", raw[:16])
                    now = sec * 1_000_000_000 + nsec
            if not data:
                done.set_exception(ConnectionError("closed before the stream ended"))
                return
            buf.extend(data)
            try:
                feed(now)
            except Exception as e:  # handed to the awaiting request
                done.set_exception(e)

        try:
            await loop.sock_connect(sock, ("127.0.0.1", self.port))
            await loop.sock_sendall(sock, completion_request(body))
            loop.add_reader(sock.fileno(), readable)
            try:
                await done
            finally:
                loop.remove_reader(sock.fileno())
        finally:
            sock.close()
        return out


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the phases ---------------------------------------------------------------------------------------
async def latency_phase(direct: int, proxied: int, streams: int, tokens: int, interval: float) -> list[float]:
    """Per-chunk (arrival through the proxy − arrival direct) in milliseconds."""
    rng = random.Random(1)
    run_id = next(PAIR_RUNS)

    async def one(k: int) -> list[float]:
        body: dict[str, object] = {
            "model": "bench",
            "prompt": "hi",
            "stream": True,
            "max_tokens": tokens,
            "pair": f"p{run_id}.{k}",
            "phase": rng.random() * interval,
        }
        a, b = StampedConnection(direct), StampedConnection(proxied)
        d, p = await asyncio.gather(a.request(body), b.request(body))
        if p.sent_ns and p.sent_ns[0] < 0:  # the stamps were dropped: the chunks in their order
            return [(arr - direct) / 1e6 for arr, direct in zip(p.arrived_ns, d.arrived_ns, strict=False)]
        by_sent = dict(zip(d.sent_ns, d.arrived_ns, strict=True))
        return [(arr - by_sent[s]) / 1e6 for s, arr in zip(p.sent_ns, p.arrived_ns, strict=True) if s in by_sent]

    results = await asyncio.gather(*(one(k) for k in range(streams)))
    return [x for r in results for x in r]


@dataclass
class Throughput:
    streams: int
    chunks: int
    seconds: float
    cpu: float | None = None

    @property
    def streams_per_s(self) -> float:
        return self.streams / self.seconds

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.seconds


async def throughput_phase(port: int, streams: int, tokens: int, duration: float, pid: int | None) -> Throughput:
    """``streams`` connections, each posting stream after stream until ``duration`` has passed."""
    deadline = time.monotonic() + duration
    rng = random.Random(2)
    done = [0, 0]

    async def worker() -> None:
        conn = Connection(port)
        try:
            while time.monotonic() < deadline:
                s = await conn.request(
                    {
                        "model": "bench",
                        "prompt": "hi",
                        "stream": True,
                        "max_tokens": tokens,
                        "phase": rng.random() * 0.02,
                    }
                )
                done[0] += 1
                done[1] += len(s.arrived_ns)
        finally:
            conn.close()

    cpu0 = group_cpu_seconds(pid) if pid else None
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(streams)))
    elapsed = time.monotonic() - t0
    cpu = group_cpu_seconds(pid) - cpu0 if pid and cpu0 is not None else None
    return Throughput(done[0], done[1], elapsed, cpu)


async def memory_phase(proxied: int, pid: int, streams: int, interval: float) -> tuple[int, int]:
    """(idle RSS, RSS with ``streams`` slow streams open) of the proxy."""
    idle = rss_bytes(pid)
    opened = 0
    all_open = asyncio.Event()

    async def one() -> None:
        nonlocal opened
        conn = Connection(proxied)
        try:
            # long and slow: open for the whole measurement
            task = asyncio.create_task(
                conn.request({"model": "bench", "prompt": "hi", "stream": True, "max_tokens": 3, "phase": 0.0})
            )
            opened += 1
            if opened == streams:
                all_open.set()
            await task
        finally:
            conn.close()

    tasks = [asyncio.create_task(one()) for _ in range(streams)]
    await all_open.wait()
    await asyncio.sleep(max(0.5, interval))  # every stream has its head and first chunk through the proxy
    busy = rss_bytes(pid)
    await asyncio.gather(*tasks)
    return idle, busy


async def latency_rounds(args: argparse.Namespace, sides: list[Side], up_port: int, interval: float) -> None:
    """The latency phase, ``args.rounds`` times over every side in turn; each side's p50 and p99 kept."""
    for r in range(args.rounds):
        for s in sides:
            try:
                added = await latency_phase(up_port, s.port, args.latency_streams, args.latency_tokens, interval)
            except (ConnectionError, RuntimeError, asyncio.IncompleteReadError) as e:
                if s.name != "litellm":  # a failed stream fails the judged sides, not the one that is only info
                    raise
                print(f"  round {r + 1}, {s.name}: a stream failed ({e})")
                continue
            if not added:
                print(f"  round {r + 1}, {s.name}: no chunk carried the engine's stamp through")
                continue
            p50, p99 = quantile(added, 0.5), quantile(added, 0.99)
            s.figures.p50.append(p50)
            s.figures.p99.append(p99)
            print(
                f"  round {r + 1}, {s.name + ':':<8} {p50 * 1000:7.0f} / {p99 * 1000:7.0f} / "
                f"{statistics.fmean(added) * 1000:7.0f}"
            )


async def throughput_rounds(
    args: argparse.Namespace, sides: list[Side], up_port: int
) -> tuple[SideFigures, list[Throughput]]:
    """The throughput phase, ``args.rounds`` times: direct, then every side in turn; returns the direct
    figures and the proxy's rounds."""
    direct = SideFigures("direct")
    proxied: list[Throughput] = []
    n, tokens = args.throughput_streams, args.throughput_tokens
    for _ in range(args.rounds):
        d = await throughput_phase(up_port, n, tokens, args.duration, None)
        direct.streams_per_s.append(d.streams_per_s)
        direct.chunks_per_s.append(d.chunks_per_s)
        for s in sides:
            t = await throughput_phase(s.port, n, tokens, args.duration, s.proc.pid)
            s.figures.streams_per_s.append(t.streams_per_s)
            s.figures.chunks_per_s.append(t.chunks_per_s)
            if t.cpu is not None and t.chunks:
                s.figures.cpu_ms_per_1000.append(t.cpu / t.chunks * 1e6)
            if s.name == "proxy":
                proxied.append(t)
    return direct, proxied


async def run(args: argparse.Namespace) -> int:
    up_port, proxy_port, relay_port, haproxy_port, litellm_port = free_ports(5, 0)
    interval = args.interval_ms / 1000
    near, far = placement(args.cores)
    if near is not None:
        os.sched_setaffinity(0, near)
    haproxy, litellm = find_haproxy(), litellm_exe(args.litellm)
    workdir = tempfile.TemporaryDirectory(prefix="bench-proxy-")
    upstream = start(
        [sys.executable, "-m", "bench.proxy", "--serve-upstream", str(up_port), "--interval-ms", str(args.interval_ms)],
        near,
    )
    slow = None
    listen, target = f"127.0.0.1:{proxy_port}", f"http://127.0.0.1:{up_port}"
    if args.proxy_cmd:
        cmd = shlex.split(args.proxy_cmd.format(listen=listen, upstream=target))
    else:
        cmd = [
            sys.executable,
            "-m",
            "inferwatch",
            "proxy",
            "--listen",
            listen,
            "--upstream",
            target,
            "--engine",
            "vllm",
        ]
    # every side on the proxy's CPU (--cores split): each has that core to itself while it is measured
    sides = [Side("proxy", proxy_port, start(cmd, far), SideFigures("proxy"))]
    if haproxy is not None:
        ha_cmd = haproxy_cmd(haproxy, Path(workdir.name), haproxy_port, up_port)
        sides.append(Side("haproxy", haproxy_port, start(ha_cmd, far), SideFigures("haproxy")))
    if litellm is not None:
        ll_cmd, ll_env = litellm_cmd(litellm, Path(workdir.name), litellm_port, up_port)
        sides.append(Side("litellm", litellm_port, start(ll_cmd, far, ll_env), SideFigures("litellm")))
    relay_cmd = [sys.executable, "-m", "bench.proxy", "--serve-relay", str(relay_port), str(up_port)]
    sides.append(Side("relay", relay_port, start(relay_cmd, far), SideFigures("relay")))
    by_name = {s.name: s for s in sides}
    proxy = sides[0].proc
    failed = False
    try:
        await wait_port(up_port, upstream)
        for s in sides:
            await wait_port(s.port, s.proc, timeout=180.0 if s.name == "litellm" else 30.0)
            # warm-up: connections, imports, allocator arenas
            await throughput_phase(s.port, 16, 5, 1.0, None)

        print(f"engine: fixed rate, one chunk every {args.interval_ms:g} ms per stream; proxy: {' '.join(cmd[1:4])}…")
        print(f"sides: {', '.join(s.name for s in sides)}, and direct (haproxy: {haproxy or 'not installed'})")
        if far is None:
            print("cores: shared by the engine, the client and the proxies")
        else:
            cpus = ",".join(map(str, sorted(near or ())))
            print(f"cores: the engine and the client on CPU {cpus}, each proxy (and the relay) on {min(far)}")
        # Each side is measured in several rounds, interleaved, and the best round is judged (as in
        # bench/exporter.py): the machine's scheduling noise lands on whichever process it hits.
        # The bare relay's rounds interleave with the proxies': every hop rides the same noise.
        print(
            f"added latency per chunk at {args.latency_streams} concurrent streams, {args.latency_tokens} chunks "
            f"each (p50 / p99 / mean, us):"
        )
        await latency_rounds(args, sides, up_port, interval)
        best = {s.name: s.figures.best()["p99"] for s in sides}
        over = best["proxy"] - best["relay"]
        print(
            f"  best p99: proxy {best['proxy'] * 1000:.0f} us, bare relay {best['relay'] * 1000:.0f} us; "
            f"the proxy's own: {over * 1000:.0f} us (target < {LATENCY_P99_TARGET_MS * 1000:.0f} us)"
        )
        failed |= over >= LATENCY_P99_TARGET_MS

        n, tokens = args.throughput_streams, args.throughput_tokens
        direct, proxied = await throughput_rounds(args, sides, up_port)
        d_best, p_best = direct.best(), by_name["proxy"].figures.best()
        rs = p_best["streams_per_s"] / d_best["streams_per_s"]
        rc = p_best["chunks_per_s"] / d_best["chunks_per_s"]
        print(f"throughput, {n} concurrent streams of {tokens} chunks (best of {args.rounds}):")
        print(f"  direct:      {d_best['streams_per_s']:8.1f} streams/s {d_best['chunks_per_s']:9.0f} chunks/s")
        print(f"  proxy:       {p_best['streams_per_s']:8.1f} streams/s {p_best['chunks_per_s']:9.0f} chunks/s")
        print(f"  ratio:       {rs:8.3f}           {rc:9.3f}           (target >= {THROUGHPUT_TARGET})")
        cpu = sum(t.cpu or 0.0 for t in proxied) / sum(t.chunks for t in proxied)
        print(f"  proxy CPU:   {cpu * 1000 * 1000:.1f} ms per 1,000 chunks (user + system, all rounds)")
        failed |= rs < THROUGHPUT_TARGET or rc < THROUGHPUT_TARGET
        peer_table([s.figures for s in sides], direct, n)
        ha = by_name.get("haproxy")
        failed |= judge_haproxy(by_name["proxy"].figures, ha.figures if ha else None)

        # slow streams for the memory figure: another engine, one chunk a second
        slow_port = free_ports(1, 0)[0]
        slow = start(
            [sys.executable, "-m", "bench.proxy", "--serve-upstream", str(slow_port), "--interval-ms", "1000"], near
        )
        await wait_port(slow_port, slow)
        stop(proxy)
        slow_target = f"http://127.0.0.1:{slow_port}"
        if args.proxy_cmd:
            cmd = shlex.split(args.proxy_cmd.format(listen=listen, upstream=slow_target))
        else:
            cmd[cmd.index(target)] = slow_target
        proxy = sides[0].proc = start(cmd, far)
        await wait_port(proxy_port, proxy)
        await throughput_phase(proxy_port, 32, 1, 2.5, None)  # warm-up at this rate
        idle, busy = await memory_phase(proxy_port, proxy.pid, args.memory_streams, 1.0)
        per = (busy - idle) / args.memory_streams
        print(
            f"memory: idle {idle / 2**20:.1f} MiB, {args.memory_streams} open streams {busy / 2**20:.1f} MiB: "
            f"{per / 1024:.1f} KiB per open stream"
        )
    finally:
        for s in sides:
            stop(s.proc)
        stop(upstream)
        if slow is not None:
            stop(slow)
        workdir.cleanup()
    if failed:
        print("FAIL: a target was missed", file=sys.stderr)
        return 1
    print("OK")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI-size phases")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="the engine's time between chunks")
    parser.add_argument("--latency-streams", type=int, default=64)
    parser.add_argument("--latency-tokens", type=int, default=200, help="chunks per stream (latency phase)")
    parser.add_argument("--throughput-streams", type=int, default=256)
    parser.add_argument("--throughput-tokens", type=int, default=50, help="chunks per stream (throughput)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per throughput side")
    parser.add_argument("--memory-streams", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5, help="rounds per side (the best is judged)")
    parser.add_argument("--proxy-cmd", help="benchmark this command instead ({listen}, {upstream})")
    parser.add_argument("--litellm", help="LiteLLM's litellm executable (its own venv): a side, measured, not judged")
    parser.add_argument(
        "--cores",
        choices=("split", "shared"),
        default="split",
        help="split (default): the proxy on a CPU of its own, as a sidecar with a one-core request, the engine and "
        "the client on the others; shared: all three wherever the kernel puts them",
    )
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-relay", nargs=2, type=int, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        asyncio.run(upstream_main(args.serve_upstream, args.interval_ms / 1000))
        return 0
    if args.serve_relay:
        asyncio.run(relay_main(*args.serve_relay))
        return 0
    if args.quick:
        args.latency_tokens, args.duration, args.rounds = 50, 4.0, 2
    try:
        return asyncio.run(run(args))
    except MissingPeer as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
