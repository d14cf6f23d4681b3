"""Real processes on loopback for end-to-end tests: simulators, exporters, Prometheus, Alertmanager.

:class:`Processes` starts each child in its own session with its output in a log file, waits for
HTTP endpoints, and stops every process it started (SIGTERM to its group, SIGKILL after a grace
period). It checks and signals only the processes it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

INFERWATCH = [sys.executable, "-m", "inferwatch"]
STOP_GRACE_S = 15.0


@dataclass
class Processes:
    logs: Path
    cwd: Path | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _handles: list[IO[bytes]] = field(default_factory=list)

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("wb")
        self._handles.append(log)
        proc = subprocess.Popen(
            cmd,
            cwd=self.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def wait_http(self, name: str, url: str, timeout: float = 60.0) -> None:
        """Until ``url`` answers below 500; fails early (with its log) when ``name``'s process exits."""
        deadline = time.monotonic() + timeout
        proc = self.procs[name]
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} before {url} answered:\n{self.log(name)}")
            time.sleep(0.2)
        raise RuntimeError(f"{url} ({name}) did not come up within {timeout:g} s:\n{self.log(name)}")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        _stop([proc])

    def close(self) -> None:
        _stop(list(self.procs.values()))
        self.procs.clear()
        for handle in self._handles:
            handle.close()
        self._handles.clear()


def stop_groups(procs: list[subprocess.Popen[bytes]], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM each process's group (each started in a session of its own), SIGKILL what still runs
    ``grace`` seconds later, and reap them."""
    _stop(procs, grace)


def _stop(procs: list[subprocess.Popen[bytes]], grace: float = STOP_GRACE_S) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def simulator_cmd(
    engine: str, port: int, *, model: str, profile: str = "steady", seed: int = 0, speed: float = 2.0
) -> list[str]:
    return [
        *INFERWATCH,
        "simulate",
        "--engine",
        engine,
        "--port",
        str(port),
        "--model",
        model,
        "--profile",
        profile,
        "--seed",
        str(seed),
        "--speed",
        f"{speed:g}",
    ]


def exporter_cmd(
    engine: str, target: str, listen: str, options: dict[str, Any] | None = None, gpu: tuple[str, str] | None = None
) -> list[str]:
    """``inferwatch exporter serve`` of one target; ``gpu``: its GPU source's URL and the GPU's UUID."""
    cmd = [*INFERWATCH, "exporter", "serve", "--target", target, "--engine", engine, "--listen", listen]
    for key, value in (options or {}).items():
        cmd += ["--engine-option", f"{key}={value}"]
    if gpu is not None:
        cmd += ["--gpu-source", gpu[0], "--gpu-uuid", gpu[1]]
    return [*cmd, "--log-level", "warning"]


def write_prometheus_config(
    path: Path, jobs: dict[str, list[str]], rule_files: list[Path], alertmanager: str | None = None
) -> None:
    """A Prometheus configuration scraping ``jobs`` every second, evaluating ``rule_files`` every second."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": targets}]} for job, targets in sorted(jobs.items())
        ],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    path.write_text(yaml.safe_dump(config))


def prometheus_cmd(binary: str, config: Path, data: Path, port: int) -> list[str]:
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]


def alertmanager_cmd(binary: str, config: Path, storage: Path, port: int) -> list[str]:
    """A single Alertmanager on 127.0.0.1: no cluster port (``--cluster.listen-address=`` empty), no gossip."""
    return [
        binary,
        f"--config.file={config}",
        f"--storage.path={storage}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]


def collector_cmd(port: int, grpc_port: int, data_dir: Path, *options: str) -> list[str]:
    """``inferwatch collector serve`` on 127.0.0.1 (API and OTLP/gRPC), its database under ``data_dir``."""
    return [
        *INFERWATCH,
        "collector",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--grpc-listen",
        f"127.0.0.1:{grpc_port}",
        "--data-dir",
        str(data_dir),
        *options,
    ]
