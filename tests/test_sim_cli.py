"""`inferwatch simulate` and `inferwatch demo` as users run them (real processes on 127.0.0.1).

Only the processes a test starts are checked and stopped: by their own ids and process groups, never by
matching command lines (which would catch other users' simulators).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from inferwatch.core import vocabulary as V
from tests.conftest import ROOT, free_port, require_tool

PROC = Path("/proc")
Process = tuple[int, int]
"""(pid, start time in clock ticks since boot): a process, told apart from a later one with the same pid."""


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
        while httpx.get(url + "/simulator/state").json()["load_sent"] == 0:
            assert time.monotonic() < deadline, "the built-in load sent nothing"
            time.sleep(0.1)
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


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a process from ``/proc/<pid>/stat``; None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name in parentheses may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def alive(process: Process) -> bool:
    stat = _stat(process[0])
    return stat is not None and stat[2] == process[1] and stat[1] != "Z"


def descendants(root: int) -> dict[Process, str]:
    """Every live descendant of ``root`` (children, their children, ...) with its command line."""
    parents: dict[int, list[Process]] = {}
    for entry in PROC.iterdir():
        stat = _stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and stat[1] != "Z":
            parents.setdefault(stat[0], []).append((int(entry.name), stat[2]))
    found: dict[Process, str] = {}
    frontier = [root]
    while frontier:
        for child in parents.get(frontier.pop(), []):
            with contextlib.suppress(OSError):
                found[child] = (PROC / str(child[0]) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                frontier.append(child[0])
    return found


def group_empty(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def kill_groups(pgids: list[int]) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def test_demo_runs_the_whole_pipeline_and_stops_everything(tmp_path: Path) -> None:
    """The demo starts the simulated fleet, the exporters, a proxy, the collector, Prometheus and Alertmanager, each
    in a session of its own; under kv-pressure an alert travels Prometheus -> Alertmanager -> collector; at
    the end every process it started is gone: the test records the demo's descendants while it runs and
    checks afterwards that each of them, and each one's process group, is gone (the demo's own group too)."""
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    if not (PROC / "self" / "stat").exists():
        message = "needs /proc to follow the demo's processes"
        if os.environ.get("CI"):
            pytest.fail(message + " and CI is set: this test must not be skipped")
        pytest.skip(message)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    cmd = [sys.executable, "-m", "inferwatch", "demo", "--duration", "75", "--profile", "kv-pressure", "--speed", "3"]
    seen: dict[Process, str] = {}
    with out.open("w") as stdout, err.open("w") as stderr:
        demo = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
            env={**os.environ, "COLUMNS": "80"},
            start_new_session=True,  # the demo leads a process group of its own
        )
    try:
        deadline = time.monotonic() + 180
        while demo.poll() is None:
            for process, cmdline in descendants(demo.pid).items():
                seen[process] = cmdline or seen.get(process, "")  # an exiting process shows an empty one
            assert time.monotonic() < deadline, "the demo did not finish"
            time.sleep(0.2)
    finally:
        if demo.poll() is None:
            kill_groups([demo.pid])
        demo.wait()
        left = {p: c for p, c in seen.items() if alive(p) or not group_empty(p[0])}
        kill_groups([pid for pid, _ in left])  # what the demo left behind, so that the test leaves nothing
    stdout_text = out.read_text()
    assert demo.returncode == 0, stdout_text + err.read_text()
    simulators = [c for c in seen.values() if " simulate --engine" in c]
    assert len(simulators) == len(V.ENGINES), f"expected a simulator per engine among the demo's processes: {seen}"
    assert group_empty(demo.pid), "a process is left in the demo's process group"
    assert not left, f"the demo left processes behind: {left}"
    assert max(len(line) for line in stdout_text.splitlines()) <= 80, "the view must fit 80 columns"
    final = stdout_text.split("final state")[-1]
    rows = {ln.split()[0]: ln.split() for ln in final.splitlines() if ln.split() and ln.split()[0] in V.ENGINES}
    assert set(rows) == set(V.ENGINES), final
    for engine, cells in rows.items():
        assert cells[1] not in ("-", "0"), f"{engine} shows no traffic: {cells}"
    vllm = rows[V.ENGINE_VLLM]
    assert vllm[7] not in ("-", "0"), f"kv-pressure should show vLLM preemptions: {vllm}"
    assert vllm[-1] == "preemptions", f"the diagnosis should name preemptions for vLLM: {vllm}"
    for engine in (V.ENGINE_TGI, V.ENGINE_TRTLLM, V.ENGINE_SGLANG):  # spans reached the collector
        assert rows[engine][3] != "-", f"no exact p99 from the collector for {engine}: {rows[engine]}"
    reached = stdout_text.split("alerts that reached the collector:")[-1]
    assert V.ALERT_PREEMPTIONS_SUSTAINED in reached or V.ALERT_KV_SATURATED in reached, reached
    # TGI measures no TTFT: the view shows the one inferwatch proxy measured in front of it
    tgi_ttft = rows[V.ENGINE_TGI][2]
    assert tgi_ttft.endswith("*") and tgi_ttft != "-*", rows[V.ENGINE_TGI]
    assert "at the client, through inferwatch proxy" in final
    # 6 simulators, 6 exporters, 2 proxies (TGI, llama.cpp), the collector, Prometheus, Alertmanager
    assert f"stopped {2 * len(V.ENGINES) + 5} processes" in stdout_text
