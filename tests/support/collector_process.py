"""``inferwatch collector serve`` as a process the fault tests kill and restart (:class:`Collector`), and the
senders that load it meanwhile, counting what it acknowledged (:class:`Load`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.conftest import ROOT, free_port
from tests.support.durability import PB, wait_until
from tests.support.spans import SpanBodies


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux ``/proc``): the collector's fork server and ingest workers."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Collector:
    """``inferwatch collector serve`` as a process, restartable on the same data directory and HTTP port."""

    def __init__(self, data_dir: Path, url: str | None, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.url = url
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        cmd = [
            sys.executable,
            "-m",
            "inferwatch",
            "collector",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--grpc-listen",
            f"127.0.0.1:{free_port()}",
            "--log-level",
            "warning",
        ]
        if self.url:
            cmd += ["--database-url", self.url]
        started = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.ready, 60, "collector ready")
        return time.monotonic() - started

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"collector exited with {self.proc.returncode}")
        try:
            return httpx.get(self.base + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill9(self) -> None:
        """kill -9 the collector; its worker processes (and their fork server) must end on their own."""
        assert self.proc is not None
        helpers = descendants(self.proc.pid)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in helpers), 10, "workers gone")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Load:
    """Senders posting ``rate`` spans/s in bodies of ``per_body``; a span counts as acknowledged on a 200
    without rejections."""

    def __init__(self, base: str, rate: float, per_body: int = 20, senders: int = 4) -> None:
        self.base = base
        self.per_body = per_body
        self.interval = senders * per_body / rate
        self.factory = SpanBodies(seed=7, service="durability", instance="d")
        self.acked: set[str] = set()
        self.sent = 0
        self.failed = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(senders)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as client:
            next_at = time.monotonic()
            while not self.stop.is_set():
                body, ids = self.factory.body(self.per_body)
                ok = False
                try:
                    r = client.post("/v1/traces", content=body, headers={"content-type": PB})
                    ok = (
                        r.status_code == 200
                        and ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans == 0
                    )
                except httpx.HTTPError:
                    pass
                with self.lock:
                    self.sent += len(ids)
                    if ok:
                        self.acked.update(ids)
                    else:
                        self.failed += len(ids)
                next_at = max(next_at + self.interval, time.monotonic() - self.interval)
                self.stop.wait(max(0.0, next_at - time.monotonic()))
