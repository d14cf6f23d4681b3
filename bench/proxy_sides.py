"""The other proxies of ``bench/proxy.py``, sides in the same interleaved rounds as ``inferwatch proxy``.

- **haproxy** (the Debian package; ``make system-deps``): HTTP mode with ``option http-no-delay``, one
  thread, its configuration written to a temporary directory, bound to a free loopback port and placed
  on the proxy's CPU. The lean hop a user would put there instead: inferwatch's proxy is judged against
  it (``HAPROXY_TARGETS``). Missing, it is skipped, except under ``CI``, where that is a failure.
- **LiteLLM's proxy** (``--litellm PATH``, the ``litellm`` executable of its own environment, or
  ``INFERWATCH_BENCH_LITELLM``): a gateway that also counts requests and tokens, configured with one
  OpenAI-compatible model pointing at the simulated engine's ``/v1``. Measured, not judged.

Every side's CPU time is its process group's, read from ``/proc`` like the proxy's.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.support.stack import stop_groups

HAPROXY_TARGETS = {"throughput": 0.95, "cpu": 1.5, "p99_ms": 0.5}
"""inferwatch's proxy against haproxy (issue 35): throughput at 256 streams >= 0.95x haproxy's, CPU per chunk
<= 1.5x haproxy's, added p99 within 0.5 ms of haproxy's; each side's best round."""
LITELLM_ENV = "INFERWATCH_BENCH_LITELLM"


# -- processes ----------------------------------------------------------------------------------------
LOGS: dict[int, IO[bytes]] = {}
"""Each started process' stderr: a temporary file, not a pipe (a chatty side, such as LiteLLM logging every
failed stream, would fill a pipe nobody reads and block on it)."""


def start(
    cmd: Sequence[str], cpus: set[int] | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``cmd`` in a session of its own, on ``cpus`` when given (set before it runs: its threads inherit it)."""

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    log = tempfile.TemporaryFile()  # noqa: SIM115 (kept open while the process runs; closed by stop)
    proc = subprocess.Popen(
        list(cmd), stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, preexec_fn=pin, env=env
    )
    LOGS[proc.pid] = log
    return proc


def placement(cores: str) -> tuple[set[int] | None, set[int] | None]:
    """(CPUs of the engine and the client, CPUs of the proxy) for ``--cores``; None: wherever the kernel likes."""
    available = sorted(os.sched_getaffinity(0))
    if cores == "shared" or len(available) < 2:
        return None, None
    return set(available[:-1]), {available[-1]}


def stop(proc: subprocess.Popen[bytes]) -> None:
    stop_groups([proc], grace=10)
    log = LOGS.pop(proc.pid, None)
    if log is not None:
        log.close()


async def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = LOGS.get(proc.pid)
            err = b""
            if log is not None:
                log.seek(0)
                err = log.read()
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{err[-2000:].decode(errors='replace')}")
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout:g} s")


class MissingPeer(RuntimeError):
    """A side the run must have is not installed."""


def find_haproxy() -> str | None:
    """haproxy's executable; ``None`` when missing (a :class:`MissingPeer` under ``CI``)."""
    path = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)), None
    )
    if path is None and os.environ.get("CI"):
        raise MissingPeer("haproxy is not installed (make system-deps): under CI it is a side, not a skip")
    return path


def haproxy_cmd(exe: str, workdir: Path, port: int, upstream: int) -> list[str]:
    """haproxy in the foreground, relaying HTTP from ``port`` to the engine at ``upstream``."""
    config = workdir / "haproxy.cfg"
    config.write_text(
        "global\n"
        "    nbthread 1\n"
        "    maxconn 4096\n"
        "defaults\n"
        "    mode http\n"
        "    option http-no-delay\n"
        "    timeout connect 5s\n"
        "    timeout client 300s\n"
        "    timeout server 300s\n"
        "frontend bench\n"
        f"    bind 127.0.0.1:{port}\n"
        "    default_backend engine\n"
        "backend engine\n"
        f"    server engine 127.0.0.1:{upstream}\n"
    )
    return [exe, "-db", "-f", str(config)]


def litellm_exe(flag: str | None) -> str | None:
    path = flag or os.environ.get(LITELLM_ENV)
    if path and not os.access(path, os.X_OK):
        raise MissingPeer(f"LiteLLM: {path} is not an executable")
    return path


def litellm_cmd(exe: str, workdir: Path, port: int, upstream: int) -> tuple[list[str], dict[str, str]]:
    """LiteLLM's proxy (one worker) with the engine as an OpenAI-compatible model ``bench``; its environment."""
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: bench\n"
        "    litellm_params:\n"
        "      model: text-completion-openai/bench\n"
        f"      api_base: http://127.0.0.1:{upstream}/v1\n"
        "      api_key: bench\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  drop_params: false\n"
    )
    # no master key: the client sends no credentials (loopback only; LiteLLM refuses to start keyless otherwise)
    env = dict(
        os.environ,
        LITELLM_TELEMETRY="False",
        LITELLM_LOG="ERROR",
        NO_PROXY="127.0.0.1",
        LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true",
    )
    cmd = [exe, "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    return cmd, env


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU time of every live process in the process group ``pgid`` (a side and its workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


@dataclass
class Side:
    """A hop between the client and the engine, measured in the same interleaved rounds as the others."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    figures: SideFigures


@dataclass
class SideFigures:
    """One side's rounds: added latency (ms, per round) and throughput (per round)."""

    name: str
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    streams_per_s: list[float] = field(default_factory=list)
    chunks_per_s: list[float] = field(default_factory=list)
    cpu_ms_per_1000: list[float] = field(default_factory=list)

    def best(self) -> dict[str, float]:
        nan = float("nan")
        return {
            "p50": min(self.p50, default=nan),
            "p99": min(self.p99, default=nan),
            "streams_per_s": max(self.streams_per_s, default=nan),
            "chunks_per_s": max(self.chunks_per_s, default=nan),
            "cpu": min(self.cpu_ms_per_1000, default=nan),
            "cpu_mean": statistics.fmean(self.cpu_ms_per_1000) if self.cpu_ms_per_1000 else nan,
        }


def peer_table(figures: Sequence[SideFigures], direct: SideFigures, streams: int) -> None:
    """The peers side by side (best rounds; CPU also as the mean of the rounds)."""
    print(f"peers, best rounds (throughput at {streams} streams; added latency at the latency phase's streams):")
    print(
        f"  {'side':<9} {'streams/s':>10} {'chunks/s':>10} {'/ direct':>9} "
        f"{'CPU ms/1k chunks (best, mean)':>30} {'p50 us':>8} {'p99 us':>8}"
    )
    d = direct.best()
    for f in [*figures, direct]:
        b = f.best()
        ratio = b["chunks_per_s"] / d["chunks_per_s"]
        cpu = f"{b['cpu']:.1f}, {b['cpu_mean']:.1f}" if f.cpu_ms_per_1000 else "-"
        lat = f"{b['p50'] * 1000:8.0f} {b['p99'] * 1000:8.0f}" if f.p99 else f"{'-':>8} {'-':>8}"
        print(f"  {f.name:<9} {b['streams_per_s']:10.1f} {b['chunks_per_s']:10.0f} {ratio:9.3f} {cpu:>30} {lat}")


def judge_haproxy(proxy: SideFigures, haproxy: SideFigures | None) -> bool:
    """Prints inferwatch's proxy against haproxy's targets; True when one is missed."""
    if haproxy is None:
        print("against haproxy: skipped (haproxy is not installed; make system-deps)")
        return False
    p, h = proxy.best(), haproxy.best()
    rs, rc = p["streams_per_s"] / h["streams_per_s"], p["chunks_per_s"] / h["chunks_per_s"]
    cpu = p["cpu"] / h["cpu"]
    over = p["p99"] - h["p99"]
    t = HAPROXY_TARGETS
    print("against haproxy (best rounds):")
    print(f"  throughput:  {rs:.3f}x streams/s, {rc:.3f}x chunks/s (target >= {t['throughput']}x)")
    print(f"  CPU:         {p['cpu']:.1f} / {h['cpu']:.1f} ms per 1,000 chunks = {cpu:.2f}x (target <= {t['cpu']}x)")
    print(
        f"  added p99:   {p['p99'] * 1000:.0f} - {h['p99'] * 1000:.0f} us = {over * 1000:+.0f} us "
        f"(target <= +{t['p99_ms'] * 1000:.0f} us)"
    )
    misses = [
        name
        for name, missed in (
            ("throughput", min(rs, rc) < t["throughput"]),
            ("CPU per chunk", cpu > t["cpu"]),
            ("added p99", over > t["p99_ms"]),
        )
        if missed
    ]
    if misses:
        print(f"  missed: {', '.join(misses)}")
    return bool(misses)
