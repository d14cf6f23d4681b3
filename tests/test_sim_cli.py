"""`inferwatch simulate` and `inferwatch demo` as users run them (real processes on 127.0.0.1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from inferwatch.core import vocabulary as V
from tests.conftest import ROOT, free_port


def test_simulate_serves_and_switches_profile() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferwatch",
            "simulate",
            "--engine",
            "vllm",
            "--port",
            str(port),
            "--model",
            "m",
            "--speed",
            "5",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "simulator did not start"
            time.sleep(0.2)
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "m"
        r = httpx.post(url + "/simulator/profile", json={"profile": "kv-pressure"})
        assert r.status_code == 200 and r.json()["profile"] == "kv-pressure"
        assert httpx.post(url + "/simulator/profile", json={"profile": "nope"}).status_code == 400
        time.sleep(1.0)
        assert httpx.get(url + "/simulator/state").json()["load_sent"] > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


def test_simulate_help_and_profiles() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "inferwatch", "simulate", "--engine", "tgi", "--list-profiles"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    for name in ("steady", "kv-pressure", "queue-buildup", "long-prompts", "slow-decode", "errors", "prefix-heavy"):
        assert name in out.stdout


def test_demo_runs_the_fleet_and_stops_everything() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "inferwatch", "demo", "--duration", "12", "--profile", "kv-pressure", "--speed", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    final = proc.stdout.split("final state")[-1]
    rows = {ln.split("│")[1].strip(): ln for ln in final.splitlines() if ln.count("│") > 5}
    assert set(rows) == set(V.ENGINES), final
    for engine, row in rows.items():
        cells = [c.strip() for c in row.split("│")[1:-1]]
        assert cells[1] == "1", f"{engine} exporter not up: {row}"
        assert cells[2] not in ("-", "0"), f"{engine} shows no traffic: {row}"
    vllm_cells = [c.strip() for c in rows[V.ENGINE_VLLM].split("│")[1:-1]]
    assert vllm_cells[-1] not in ("-", "0"), "kv-pressure should show vLLM preemptions"
    for engine in (V.ENGINE_VLLM, V.ENGINE_TGI, V.ENGINE_TRTLLM):  # spans reached the collector
        cells = [c.strip() for c in rows[engine].split("│")[1:-1]]
        assert cells[5] != "-", f"no exact p99 from the collector for {engine}: {rows[engine]}"
    assert "stopped 9 processes" in proc.stdout
    leftover = subprocess.run(["pgrep", "-f", "inferwatch simulate --engine"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "demo left simulator processes behind"
