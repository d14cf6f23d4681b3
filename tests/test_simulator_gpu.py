"""The simulated GPUs beneath the simulated engines: their dcgm-exporter page and the GPU profiles.

The page is checked against the shape of the dcgm-exporter fixtures (families, types, label names and
order, number formats) and parsed by both the project's parser and prometheus_client's; the profiles
are checked through the engine's own metrics (translated by the real exporter mapping) and the page,
each against the ``normal`` profile in the same test, never against absolute times. Everything runs on a
virtual clock: no wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwatch.core import vocabulary as V
from inferwatch.exporters import textparse
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from inferwatch.simulator import dcgm
from inferwatch.simulator.base import SimSettings
from inferwatch.simulator.clock import VirtualClock
from inferwatch.simulator.gpus import (
    BOOST_CLOCK_MHZ,
    CLOCK_EVENT_GPU_IDLE,
    CLOCK_EVENT_POWER_CAP,
    FB_TOTAL_MIB,
    IDLE_POWER_W,
    sim_gpu_uuid,
)
from inferwatch.simulator.scheduler import EngineParams, Sequence, ServingModel
from inferwatch.simulator.server import ENGINES, create_app, default_params
from tests.conftest import ROOT, free_port, in_process

FIXTURES = ROOT / "tests" / "fixtures" / "gpu" / "dcgm-exporter" / "4.5.3-4.8.2"
NAME = {f.field_id: f.name for f in dcgm.FIELDS}
"""DCGM field ID -> its metric name (the names are spelled only in the dcgm modules)."""
SM_CLOCK, CLOCK_EVENTS, GPU_TEMP, POWER, ENERGY, POWER_LIMIT = (NAME[i] for i in (100, 112, 150, 155, 156, 160))
GPU_UTIL, XID, POWER_VIOLATION, FB_FREE, FB_USED, FB_RESERVED = (NAME[i] for i in (203, 230, 240, 251, 252, 253))
ENGINE_ACTIVE, SM_ACTIVE, TENSOR_ACTIVE, DRAM_ACTIVE = (NAME[i] for i in (1001, 1002, 1004, 1005))
ENGINE_METRICS_PATH = {"trtllm": "/prometheus/metrics"}


@dataclass
class Scrape:
    """One look at a running simulator: its GPU page, its engine's canonical series, its state."""

    at: float
    page: str
    engine: Snapshot
    state: dict[str, Any]

    def gpu(self, name: str, index: int = 0) -> float:
        """The value of family ``name`` for GPU ``index`` (KeyError when the page has none)."""
        for labels, value in textparse.parse(self.page, {name}).get(name):
            if dict(labels)["gpu"] == str(index):
                return value
        raise KeyError(f"{name} has no sample for GPU {index}")

    def mean(self, name: str, gpus: int = 1) -> float:
        return sum(self.gpu(name, i) for i in range(gpus)) / gpus


def run(
    gpu_profile: str = "normal",
    at: tuple[float, ...] = (30.0, 60.0),
    engine: str = "vllm",
    switch_at: tuple[float, str] | None = None,
    **settings: Any,
) -> list[Scrape]:
    """Run a simulator in virtual time and scrape it at each time in ``at`` (simulated seconds from start)."""
    params = default_params(engine)
    s = SimSettings(engine=engine, model="m", seed=3, params=params, gpu_profile=gpu_profile, **settings)
    adapter = builtin_registry().get(engine)
    session = adapter.open(adapter.own_options({"max_batch_total_tokens": params.num_blocks * params.block_size}))
    ctx = TranslateContext(engine=engine)

    async def main() -> list[Scrape]:
        clock = VirtualClock()
        start = clock.now()
        app = create_app(s, clock=clock)
        out = []
        async with in_process(app, timeout=5) as client:
            for t in sorted({*at, *([switch_at[0]] if switch_at else [])}):
                await clock.advance(start + t - clock.now())
                if switch_at and t == switch_at[0]:
                    r = await client.post("/simulator/gpu", json={"profile": switch_at[1]})
                    assert r.status_code == 200, r.text
                if t not in at:
                    continue
                page = await client.get(dcgm.PATH)
                assert page.status_code == 200
                assert page.headers["content-type"].startswith("text/plain; version=0.0.4")
                metrics = (await client.get(ENGINE_METRICS_PATH.get(engine, "/metrics"))).text
                state = (await client.get("/simulator/state")).json()
                out.append(Scrape(t, page.text, translate_text(adapter, metrics, ctx, session.extend), state))
        return out

    return asyncio.run(main())


def tpot(first: Scrape, later: Scrape) -> float:
    """Mean time per output token of the requests that finished between two scrapes."""
    a, b = first.engine.histogram(V.TIME_PER_OUTPUT_TOKEN), later.engine.histogram(V.TIME_PER_OUTPUT_TOKEN)
    assert a is not None and b is not None and b.inf > a.inf
    return float((b.total - a.total) / (b.inf - a.inf))


def families(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Family name -> (type, label names in order) for a page, checking every sample of a family agrees."""
    parsed = textparse.parse(text, {m.group(1) for m in re.finditer(r"^# TYPE (\S+)", text, re.M)})
    out = {}
    for name, kind in parsed.families.items():
        shapes = {tuple(k for k, _ in labels) for labels, _ in parsed.get(name)}
        assert len(shapes) == 1, f"{name}: samples with different label names {shapes}"
        out[name] = (kind, shapes.pop())
    return out


@pytest.fixture(scope="module")
def normal() -> list[Scrape]:
    return run("normal", at=(20.0, 60.0), gpus=2)


@pytest.fixture(scope="module")
def throttled() -> list[Scrape]:
    """At ``normal``'s load (steady), not the profile's own: the TPOT ratio is then the clock's alone."""
    return run("throttled", at=(20.0, 60.0), gpus=2, profile="steady")


# -- the page's shape ---------------------------------------------------------------------------
def test_page_has_the_fixture_families_types_and_labels(normal: list[Scrape]) -> None:
    page = normal[-1].page
    ours = families(page)
    busy = families((FIXTURES / "metrics-busy.txt").read_text())
    throttled = families((FIXTURES / "metrics-throttled.txt").read_text())
    assert set(busy) <= set(ours), f"default families missing: {set(busy) - set(ours)}"
    for name, shape in ours.items():
        expected = busy.get(name) or throttled.get(name)
        if expected is not None:
            assert shape == expected, f"{name}: ours {shape}, the fixture's {expected}"
    # the opt-in fields an operator enables, with the throttled fixture's shape where it has them
    for name in (CLOCK_EVENTS, POWER_VIOLATION, NAME[241], POWER_LIMIT, SM_ACTIVE):
        assert name in ours
    # families in ascending field ID, as in the fixtures; GPUs in order within each family
    fixture_order = [n for n in re.findall(r"^# TYPE (\S+)", (FIXTURES / "metrics-throttled.txt").read_text(), re.M)]
    ours_order = [n for n in ours if n in fixture_order]
    assert ours_order == [n for n in fixture_order if n in ours]
    assert list(ours) == [f.name for f in dcgm.FIELDS if f.name in ours]
    for name in ours:
        gpus = [dict(labels)["gpu"] for labels, _ in textparse.parse(page, {name}).get(name)]
        assert gpus == ["0", "1"], name


def test_page_parses_with_both_parsers_and_formats_values_as_dcgm(normal: list[Scrape]) -> None:
    page = normal[-1].page
    assert page.endswith("\n") and "\n\n" not in page
    textparse.check_complete(page)
    parsed = {f.name: f for f in text_string_to_metric_families(page)}
    assert {f.name for f in dcgm.FIELDS if f.field_id != 230} <= set(parsed)
    helps = {m.group(1): m.group(2) for m in re.finditer(r"^# HELP (\S+) (.*)$", page, re.M)}
    fixture_helps = {
        m.group(1): m.group(2)
        for path in FIXTURES.glob("metrics-*.txt")
        for m in re.finditer(r"^# HELP (\S+) (.*)$", path.read_text(), re.M)
    }
    assert all(helps[n] == h for n, h in fixture_helps.items() if n in helps)
    for f in dcgm.FIELDS:
        for line in re.findall(rf"^{f.name}{{.*}} (\S+)$", page, re.M):
            assert re.fullmatch(r"\d+\.\d{6}" if f.double else r"\d+", line), f"{f.name}: {line}"
    for r in text_string_to_metric_families(page):
        for sample in r.samples:
            assert sample.labels["modelName"] == "NVIDIA H100 80GB HBM3"
            assert sample.labels["device"] == f"nvidia{sample.labels['gpu']}"
            assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", sample.labels["pci_bus_id"])
    # ratios 0-1, percents 0-100, power under the board's limit
    later = normal[-1]
    for i in (0, 1):
        for name in (ENGINE_ACTIVE, SM_ACTIVE, TENSOR_ACTIVE, DRAM_ACTIVE):
            assert 0 <= later.gpu(name, i) <= 1
        assert 0 <= later.gpu(GPU_UTIL, i) <= 100
        assert IDLE_POWER_W <= later.gpu(POWER, i) <= later.gpu(POWER_LIMIT, i)


def test_uuids_are_stable_and_named_by_engine_and_port(normal: list[Scrape]) -> None:
    uuids = [sim_gpu_uuid("vllm", 8000, i) for i in (0, 1)]
    assert normal[-1].state["gpu_uuids"] == uuids
    for i, uuid in enumerate(uuids):
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid)
        assert f'gpu="{i}",UUID="{uuid}"' in normal[-1].page
    assert sim_gpu_uuid("vllm", 8000, 0) == sim_gpu_uuid("vllm", 8000, 0)
    others = {sim_gpu_uuid("vllm", 8001, 0), sim_gpu_uuid("tgi", 8000, 0), sim_gpu_uuid("vllm", 8000, 1)}
    assert uuids[0] not in others and len(others) == 3


def test_the_page_is_deterministic(normal: list[Scrape]) -> None:
    again = run("normal", at=(20.0, 60.0), gpus=2)
    assert [s.page for s in again] == [s.page for s in normal]


def test_energy_integrates_power_and_the_framebuffer_stays_preallocated(normal: list[Scrape]) -> None:
    first, later = normal
    for i in (0, 1):
        watts = (later.gpu(ENERGY, i) - first.gpu(ENERGY, i)) / 1000 / (later.at - first.at)
        assert IDLE_POWER_W < watts < 700
        for s in normal:
            assert s.gpu(FB_USED, i) + s.gpu(FB_FREE, i) + s.gpu(FB_RESERVED, i) == FB_TOTAL_MIB
    idle = run("normal", at=(20.0,), load=0)[0]
    # the engine preallocated its share (vLLM: 0.92 of the board) whether it serves or not
    assert abs(later.gpu(FB_USED) - idle.gpu(FB_USED)) < 300
    assert idle.gpu(FB_USED) > 0.9 * FB_TOTAL_MIB


# -- activity follows the load --------------------------------------------------------------------
def test_activity_rises_with_load() -> None:
    idle, light, busy = (run("normal", at=(40.0,), load=rps)[0] for rps in (0, 0.5, 8.0))
    assert idle.gpu(GPU_UTIL) == 0 and idle.gpu(ENGINE_ACTIVE) == 0
    assert idle.gpu(POWER) == pytest.approx(IDLE_POWER_W)
    assert int(idle.gpu(CLOCK_EVENTS)) & CLOCK_EVENT_GPU_IDLE
    for name in (GPU_UTIL, ENGINE_ACTIVE, SM_ACTIVE, TENSOR_ACTIVE, DRAM_ACTIVE, POWER):
        assert idle.gpu(name) <= light.gpu(name) < busy.gpu(name), name
    assert busy.gpu(SM_CLOCK) == BOOST_CLOCK_MHZ
    # decode-heavy serving is bound by memory bandwidth: DRAM busier than the tensor cores
    assert busy.gpu(DRAM_ACTIVE) > busy.gpu(TENSOR_ACTIVE)


def test_temperature_follows_power_slowly() -> None:
    early, late = run("normal", at=(5.0, 90.0), load=8.0)
    idle = run("normal", at=(90.0,), load=0)[0]
    assert idle.gpu(GPU_TEMP) < early.gpu(GPU_TEMP) + 3 < late.gpu(GPU_TEMP)


# -- the GPU profiles ------------------------------------------------------------------------------
def test_throttled_sets_power_cap_lowers_the_clock_and_slows_tpot(
    normal: list[Scrape], throttled: list[Scrape]
) -> None:
    first, later = throttled
    for i in (0, 1):
        assert int(later.gpu(CLOCK_EVENTS, i)) & CLOCK_EVENT_POWER_CAP
        assert not int(normal[-1].gpu(CLOCK_EVENTS, i)) & CLOCK_EVENT_POWER_CAP
        assert later.gpu(SM_CLOCK, i) < 0.8 * normal[-1].gpu(SM_CLOCK, i)
        assert later.gpu(POWER, i) <= later.gpu(POWER_LIMIT, i) < normal[-1].gpu(POWER_LIMIT, i)
        # most of the 40 s between the scrapes were spent at the cap
        assert later.gpu(POWER_VIOLATION, i) - first.gpu(POWER_VIOLATION, i) > 30e9
        assert normal[-1].gpu(POWER_VIOLATION, i) == 0
    ratio = tpot(*throttled) / tpot(*normal)
    clock_ratio = BOOST_CLOCK_MHZ / later.mean(SM_CLOCK, 2)
    assert ratio > 1.3, f"throttled TPOT only {ratio:.2f}x normal"
    assert ratio > 0.8 * clock_ratio


def test_throttled_brings_a_load_served_at_boost_clock_and_not_at_the_cap() -> None:
    """The profile's own load (near-capacity): the queue grows while the GPU is capped, the batch full at
    its sequence slots, the KV cache not full; the same load on a GPU at boost clock leaves it near empty."""
    at = tuple(float(t) for t in range(20, 61, 5))
    capped = run("throttled", at=at)
    boost = run("throttled", at=at, switch_at=(0.0, "normal"))
    assert capped[0].state["profile"] == boost[0].state["profile"] == "near-capacity"
    assert boost[0].state["gpu_profile"] == "normal"
    waiting = [s.engine.value(V.REQUESTS_WAITING) for s in capped]
    assert all(w > 5 for w in waiting) and waiting[-1] > waiting[0] + 60, f"no backlog at the cap: {waiting}"
    for s in capped:
        assert s.gpu(SM_CLOCK) < 0.7 * BOOST_CLOCK_MHZ and int(s.gpu(CLOCK_EVENTS)) & CLOCK_EVENT_POWER_CAP
        assert s.engine.value(V.REQUESTS_RUNNING) >= EngineParams().max_num_seqs - 4, "the batch at its slots"
        assert s.engine.value(V.KV_CACHE_USAGE) < 0.9, "the clock limits, not the KV cache"
    for s in boost:
        assert s.gpu(SM_CLOCK) == BOOST_CLOCK_MHZ
        assert s.engine.value(V.REQUESTS_WAITING) <= 4, "at boost clock the queue stays near empty"
        assert s.engine.value(V.REQUESTS_RUNNING) < EngineParams().max_num_seqs * 0.8


def test_client_bound_waits_with_the_gpu_mostly_idle(normal: list[Scrape]) -> None:
    scrapes = run("client_bound", at=(30.0, 45.0, 60.0))
    for s in scrapes:
        assert s.engine.value(V.REQUESTS_WAITING) > 0
        running = s.engine.value(V.REQUESTS_RUNNING)
        assert 0 < running <= EngineParams().max_num_seqs / 4, "a small running batch"
        assert running + s.engine.value(V.REQUESTS_WAITING) <= 24, "the clients' concurrency cap"
        assert s.gpu(ENGINE_ACTIVE) < 0.5 and s.gpu(GPU_UTIL) < 50
        assert s.gpu(ENGINE_ACTIVE) < normal[-1].gpu(ENGINE_ACTIVE)
        assert s.gpu(SM_CLOCK) == BOOST_CLOCK_MHZ


def test_saturated_is_busy_with_the_kv_cache_full() -> None:
    for s in run("saturated", at=(40.0, 60.0)):
        assert s.gpu(ENGINE_ACTIVE) >= 0.9 and s.gpu(GPU_UTIL) >= 95
        assert s.engine.value(V.KV_CACHE_USAGE) >= 0.9
        assert s.engine.value(V.REQUESTS_WAITING) > 0
        assert s.state["profile"] == "kv-pressure"


def test_an_explicit_load_profile_overrides_the_gpu_profiles() -> None:
    s = run("saturated", at=(10.0,), profile="steady")[0]
    assert s.state["profile"] == "steady" and s.state["gpu_profile"] == "saturated"


def test_xid_appears_on_the_last_gpu_only_after_its_delay() -> None:
    before, after = run("xid", at=(20.0, 40.0), gpus=2)
    assert XID not in before.page
    assert after.gpu(XID, 1) == 79
    with pytest.raises(KeyError):
        after.gpu(XID, 0)
    line = next(x for x in after.page.splitlines() if x.startswith(XID + "{"))
    assert line.endswith(',err_code="79",err_msg="GPU has fallen off the bus"} 79')
    custom = run("normal", at=(10.0,), gpu_xid=94, gpu_xid_after=5.0)[0]
    assert custom.gpu(XID) == 94


def test_switching_the_gpu_profile_at_runtime() -> None:
    before, after = run("normal", at=(20.0, 50.0), switch_at=(25.0, "throttled"))
    assert before.gpu(SM_CLOCK) == BOOST_CLOCK_MHZ and before.state["gpu_profile"] == "normal"
    assert after.gpu(SM_CLOCK) < BOOST_CLOCK_MHZ and after.state["gpu_profile"] == "throttled"


def test_fields_the_source_does_not_export_are_absent() -> None:
    from inferwatch.simulator.gpus import GpuConfig, SimulatedGpus
    from inferwatch.simulator.profiles import get_gpu_profile

    def page(**kw: Any) -> str:
        config = GpuConfig(engine="vllm", port=1, profile=get_gpu_profile("normal"), **kw)
        return dcgm.render(SimulatedGpus(config, start=0.0), 10.0)

    full, plain, no_prof = page(), page(opt_in_fields=False), page(profiling=False)
    assert CLOCK_EVENTS in full and SM_ACTIVE in full
    assert CLOCK_EVENTS not in plain and POWER_LIMIT not in plain and SM_ACTIVE not in plain
    assert ENGINE_ACTIVE in plain
    assert not any(f.name in no_prof for f in dcgm.FIELDS if f.field_id >= 1000)
    assert GPU_UTIL in no_prof
    with pytest.raises(ValueError, match="GPUs per simulated engine"):
        GpuConfig(engine="vllm", port=1, profile=get_gpu_profile("normal"), count=9)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_serves_its_gpus(engine: str) -> None:
    s = run("saturated", at=(20.0,), engine=engine)[0]
    assert s.gpu(GPU_UTIL) > 50
    assert s.state["gpu_uuids"] == [sim_gpu_uuid(engine, 8000, 0)]


# -- the serving model's host stage -----------------------------------------------------------------
def test_the_host_input_stage_holds_requests_in_the_queue() -> None:
    """With an input stage of 1000 tokens/s, requests are admitted one after another as it finishes them."""
    model = ServingModel(EngineParams(input_rate=1000.0))
    seqs = [Sequence(f"r{i}", 500, 10, 10, arrival=0.0) for i in range(3)]
    for s in seqs:
        model.add(s)
    assert [s.ready_at for s in seqs] == [0.5, 1.0, 1.5]
    assert model.plan(0.2) is None and model.next_ready() == 0.5
    report = model.plan(0.5)
    assert report is not None and report.admitted == [seqs[0]]
    model.complete()


def test_host_time_leaves_the_gpu_idle_in_every_step() -> None:
    model = ServingModel(EngineParams(host_step=0.02))
    model.add(Sequence("r", 100, 10, 10, arrival=0.0))
    report = model.plan(0.0)
    assert report is not None
    assert report.host == 0.02
    assert report.duration == pytest.approx(report.host + report.gpu_weights + report.gpu_prefill + report.gpu_decode)


# -- as users run it ---------------------------------------------------------------------------------
def test_simulate_cli_serves_the_gpu_profile() -> None:
    """``inferwatch simulate --gpu-profile throttled --gpus 2``: the page at /dcgm/metrics on the engine's port
    shows the power cap within a few (accelerated) seconds, and the UUIDs are the documented ones."""
    port = free_port()
    cmd = [sys.executable, "-m", "inferwatch", "simulate", "--engine", "vllm", "--port", str(port)]
    cmd += ["--gpu-profile", "throttled", "--gpus", "2", "--speed", "10"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                page = httpx.get(url + dcgm.PATH, timeout=2).text
                clocks = [v for labels, v in textparse.parse(page, {SM_CLOCK}).get(SM_CLOCK)]
                if len(clocks) == 2 and max(clocks) < BOOST_CLOCK_MHZ:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "no throttled GPUs on the page"
            time.sleep(0.3)
        assert [sim_gpu_uuid("vllm", port, i) in page for i in (0, 1)] == [True, True]
        state = httpx.get(url + "/simulator/gpu").json()
        assert state["profile"] == "throttled" and "client_bound" in state["profiles"]
        assert httpx.post(url + "/simulator/gpu", json={"profile": "nope"}).status_code == 400
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    bad = subprocess.run([*cmd[:6], "--gpu-profile", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown GPU profile" in bad.stderr + bad.stdout
