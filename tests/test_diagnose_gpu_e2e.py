"""throughput_low's three causes told apart end to end, on simulated GPUs, from the exporters alone.

Four simulated vLLM engines run one GPU profile each with the load it brings (``saturated``: the KV
cache full on a busy GPU; ``client_bound``: requests wait on the host while the GPU idles;
``throttled``: a 300 W cap slows every step until a load served at boost clock backs up; ``normal`` at
a light load), each with an inferwatch exporter that joins its GPUs from the simulator's
``/dcgm/metrics`` page (``--gpu-source``, ``--gpu-uuid``). ``inferwatch diagnose --exporter ... --json``
reads the four exporters, as an on-call engineer without Prometheus would, and each replica must get
the cause its GPU shows, with the evidence that shows it. Every process is stopped at the end.

Exporter mode judges the mean of two scrapes, and the saturated engine's KV usage dips under 0.9
between preemptions at about one scrape pair in thirty (measured in virtual time): when the saturated
replica alone misses its expectation, the diagnosis is run again, at most twice. Every other miss
fails at once; a cause the diagnosis gets wrong is wrong every time.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from inferwatch.collector.diagnosis.report import Diagnosis, Finding
from inferwatch.core import vocabulary as V
from inferwatch.core.causes import GPU_THRESHOLDS, Cause
from inferwatch.core.symptoms import Signal, Status, Symptom
from inferwatch.simulator.dcgm import PATH as DCGM_PATH
from inferwatch.simulator.gpus import sim_gpu_uuid
from tests.conftest import ROOT, free_port
from tests.support.stack import INFERWATCH, Processes, exporter_cmd

SPEED = 4.0
"""simulated seconds per wall second: the backlogs build in a few wall seconds."""
WARM_UP_S = 8.0
"""wall seconds after every exporter answers (32 simulated): the throttled clock settled, the queues built."""
INTERVAL_S = 2.0
"""wall seconds between the diagnosis's two scrapes of each exporter."""
ATTEMPTS = 3
"""diagnoses at most, the later ones only when the saturated replica alone missed (see the docstring)."""
BACKLOG = 5.0
"""requests waiting (mean of the two scrapes) that make a queue: one or two wait for the step in flight
on any busy engine, whatever its clock (the gate itself is 0.5)."""

SATURATED, THROTTLED = "saturated", "throttled"
EXPECTED: dict[str, Cause] = {
    SATURATED: Cause.GPU_SATURATED,
    "client_bound": Cause.OUTSIDE_GPU,
    THROTTLED: Cause.GPU_THROTTLED,
}
"""GPU profile -> the likely cause of its throughput_low finding."""
LIGHT = "normal"
LIGHT_LOAD_RPS = 1.0
PROFILES = (*EXPECTED, LIGHT)


@dataclass
class Diagnosed:
    diagnosis: Diagnosis
    exporters: dict[str, str]
    """GPU profile -> its exporter's host:port (the ``instance``)."""

    def findings(self, profile: str) -> list[Finding]:
        return [f for f in self.diagnosis.findings if f.instance == self.exporters[profile]]

    def finding(self, profile: str, symptom: Symptom) -> Finding | None:
        return next((f for f in self.findings(profile) if f.symptom is symptom), None)


def simulator_cmd(port: int, gpu_profile: str, seed: int) -> list[str]:
    """``inferwatch simulate`` with a GPU profile and no ``--profile``: the load is the GPU profile's own."""
    cmd = [*INFERWATCH, "simulate", "--engine", V.ENGINE_VLLM, "--port", str(port), "--model", gpu_profile]
    cmd += ["--gpu-profile", gpu_profile, "--seed", str(seed), "--speed", f"{SPEED:g}"]
    return cmd + (["--load", f"{LIGHT_LOAD_RPS:g}"] if gpu_profile == LIGHT else [])


def diagnose(exporters: dict[str, str]) -> Diagnosis:
    """``inferwatch diagnose --exporter URL... --json``, as a user runs it."""
    cmd = [*INFERWATCH, "diagnose", "--interval", f"{INTERVAL_S:g}", "--json"]
    for address in exporters.values():
        cmd += ["--exporter", f"http://{address}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return Diagnosis.model_validate_json(done.stdout)


def evidence_of(finding: Finding, signal: str) -> list[tuple[float, str | None, str]]:
    return [(e.value, e.threshold, e.description) for e in finding.evidence if e.signal == signal]


def misses(run: Diagnosed, profile: str) -> list[str]:
    """What the diagnosis got wrong for ``profile``'s replica, in words (empty: nothing)."""
    found = [f.summary for f in run.findings(profile)]
    if profile == LIGHT:
        target = next(t for t in run.diagnosis.targets if t.instance == run.exporters[LIGHT])
        ok = target.status[Symptom.THROUGHPUT_LOW] is Status.OK and not found
        return [] if ok else [f"at a light load: throughput_low {target.status[Symptom.THROUGHPUT_LOW]}; {found}"]
    out = []
    if profile == THROTTLED:
        held = run.finding(THROTTLED, Symptom.GPU_THROTTLED)
        if held is None or held.severity is not Status.CRITICAL or "(here: power" not in held.cause:
            out.append(f"no critical gpu_throttled by power; got {found}")
    got, expected = run.finding(profile, Symptom.THROUGHPUT_LOW), EXPECTED[profile]
    if got is None:
        return [*out, f"no throughput_low; got {found}"]
    if got.likely_cause is not expected:
        return [*out, f"throughput_low's likely cause {got.likely_cause}, not {expected}: {got.summary}"]
    return out + CHECKS[expected](got)


def waits(finding: Finding) -> list[str]:
    """The gate's evidence: a queue of at least :data:`BACKLOG` requests."""
    gate = evidence_of(finding, Signal.WAITING.value)
    if gate and gate[0][0] >= BACKLOG and gate[0][1] == "> 0.5":
        return []
    return [f"no queue of {BACKLOG:g} or more waiting requests as evidence: {gate}"]


def saturated_evidence(finding: Finding) -> list[str]:
    kv, active = evidence_of(finding, Signal.KV_USAGE.value), evidence_of(finding, Signal.GPU_ENGINE_ACTIVE.value)
    out = waits(finding)
    if not kv or kv[0][0] <= 0.9 or kv[0][1] not in ("> 0.9", "> 0.98"):
        out.append(f"KV usage over 0.9 not shown: {kv}")
    if not active or active[0][0] < GPU_THRESHOLDS.busy_activity or not (active[0][1] or "").startswith(">= "):
        out.append(f"a busy GPU (engine activity >= {GPU_THRESHOLDS.busy_activity:g}) not shown: {active}")
    return out


def outside_evidence(finding: Finding) -> list[str]:
    active = evidence_of(finding, Signal.GPU_ENGINE_ACTIVE.value)
    out = waits(finding)
    if not active or active[0][0] >= GPU_THRESHOLDS.idle_activity or not (active[0][1] or "").startswith("< "):
        out.append(f"an idle GPU (engine activity < {GPU_THRESHOLDS.idle_activity:g}) not shown: {active}")
    if "outside the GPU" not in finding.summary:
        out.append(f"summary: {finding.summary}")
    return out


def throttled_evidence(finding: Finding) -> list[str]:
    share = evidence_of(finding, Signal.GPU_THROTTLED_SHARE.value)
    per_gpu = evidence_of(finding, "gpu_throttle")
    out = waits(finding)
    if not share or share[0][0] < 0.5 or not (share[0][1] or "").startswith("> "):
        out.append(f"the throttled share of the window not shown: {share}")
    if not any(value > 0.5 and "power (power_cap)" in text for value, _, text in per_gpu):
        out.append(f"the GPU held by its power cap not shown: {per_gpu}")
    if not finding.remedies or not finding.remedies[0].startswith("power:"):
        out.append(f"the power remedy not first: {finding.remedies[:1]}")
    return out


CHECKS = {
    Cause.GPU_SATURATED: saturated_evidence,
    Cause.OUTSIDE_GPU: outside_evidence,
    Cause.GPU_THROTTLED: throttled_evidence,
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Diagnosed]:
    procs = Processes(tmp_path_factory.mktemp("diagnose-gpu") / "logs", cwd=ROOT)
    exporters: dict[str, str] = {}
    try:
        for seed, profile in enumerate(PROFILES):
            sp, ep = free_port(), free_port()
            target = f"http://127.0.0.1:{sp}"
            procs.spawn(f"{profile}-sim", simulator_cmd(sp, profile, seed))
            exporters[profile] = f"127.0.0.1:{ep}"
            cmd = exporter_cmd(V.ENGINE_VLLM, target, exporters[profile])
            cmd += ["--gpu-source", target + DCGM_PATH, "--gpu-uuid", sim_gpu_uuid(V.ENGINE_VLLM, sp, 0)]
            procs.spawn(f"{profile}-exporter", cmd)
        for profile, address in exporters.items():
            procs.wait_http(f"{profile}-exporter", f"http://{address}/metrics")
        time.sleep(WARM_UP_S)
        result = Diagnosed(diagnose(exporters), exporters)
        for _ in range(ATTEMPTS - 1):
            if [p for p in PROFILES if misses(result, p)] != [SATURATED]:
                break
            result = Diagnosed(diagnose(exporters), exporters)
        yield result
    finally:
        procs.close()


def test_the_diagnosis_reads_the_gpus_through_the_exporters(fleet: Diagnosed) -> None:
    assert fleet.diagnosis.source == "exporters"
    assert {t.instance for t in fleet.diagnosis.targets} == set(fleet.exporters.values())
    for target in fleet.diagnosis.targets:
        assert target.status[Symptom.GPU_THROTTLED] is not Status.UNKNOWN, target.reasons
        assert target.status[Symptom.GPU_ERRORS] is Status.OK, target.reasons


@pytest.mark.parametrize("profile", list(EXPECTED))
def test_throughput_low_names_the_profiles_cause_with_its_evidence(fleet: Diagnosed, profile: str) -> None:
    finding = fleet.finding(profile, Symptom.THROUGHPUT_LOW)
    assert finding is not None, [f.summary for f in fleet.findings(profile)]
    assert finding.likely_cause is EXPECTED[profile], finding.summary
    missing = CHECKS[EXPECTED[profile]](finding)
    assert not missing, "\n".join(missing)


def test_throttled_also_reports_gpu_throttled_by_power(fleet: Diagnosed) -> None:
    finding = fleet.finding(THROTTLED, Symptom.GPU_THROTTLED)
    assert finding is not None and finding.severity is Status.CRITICAL
    assert "(here: power, on GPU 0" in finding.cause
    assert finding.remedies[0].startswith("power:")
    held = evidence_of(finding, "gpu_throttle")
    assert held and held[0][0] > 0.5 and "power (power_cap)" in held[0][2]
    for other in (SATURATED, "client_bound", LIGHT):
        assert fleet.finding(other, Symptom.GPU_THROTTLED) is None


def test_a_light_load_on_a_healthy_gpu_reports_no_throughput_low(fleet: Diagnosed) -> None:
    target = next(t for t in fleet.diagnosis.targets if t.instance == fleet.exporters[LIGHT])
    assert target.status[Symptom.THROUGHPUT_LOW] is Status.OK
    assert fleet.findings(LIGHT) == []
