"""The GPUs beneath an engine target: dcgm-exporter's page translated into ``llm_gpu_*`` for the target's
own GPUs, with the replica's labels (issue 34).

Truth is written by hand from the fixtures of ``tests/fixtures/gpu/dcgm-exporter/4.5.3-4.8.2/`` (their
``SOURCE.md`` gives the scenario of each file): units converted (percent -> ratio, MiB -> bytes, mJ ->
J, ns -> s, MHz -> Hz), the clock-event bitmask split into one 0/1 series per throttling reason, the
last XID as a label. The join is checked through a real exporter scraping two HTTP servers on
127.0.0.1: the genuine vLLM capture as the engine, a fixture page as the GPU source.
"""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from inferwatch.cli import app
from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError
from inferwatch.exporters import gpus
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.runtime import TargetScraper
from inferwatch.exporters.samples import Snapshot
from inferwatch.exporters.targets import TargetConfig
from tests.conftest import ENGINE_FIXTURES, ROOT
from tests.helpers import samples, value
from tests.support import fake_engines as fake
from tests.test_exporter_hardening import make_exporter

DCGM = ROOT / "tests" / "fixtures" / "gpu" / "dcgm-exporter" / "4.5.3-4.8.2"
VLLM_PAGE = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-final.txt"
GPU0 = "GPU-3f6a2c1e-8b4d-4f27-9e15-a0c7d2b6e941"
GPU1 = "GPU-b81e5d07-2c9a-4e63-8f4b-61d3a9c0f25e"
H100 = "NVIDIA H100 80GB HBM3"
MIB = 1024 * 1024
REPLICA = {V.LABEL_ENGINE: V.ENGINE_VLLM, V.LABEL_MODEL: "llama"}


def translate(name: str, chosen: gpus.GpuSelection, pool: str | None = None) -> Snapshot:
    return gpus.translate((DCGM / name).read_text(), chosen, REPLICA, {}, pool)


def one(snap: Snapshot, spec: V.MetricSpec, **labels: str) -> float:
    """The value of the one series of ``spec`` whose labels include ``labels``."""
    found = [v for k, v in snap.values.get(spec, {}).items() if labels.items() <= dict(k).items()]
    assert len(found) == 1, (spec.name, labels, snap.values.get(spec))
    return found[0]


def test_busy_gpu_translates_to_its_truth() -> None:
    snap = translate("metrics-busy.txt", gpus.GpuSelection(uuids=frozenset({GPU0})))
    truth = {
        V.GPU_UTILIZATION: 1.0,
        V.GPU_ENGINE_ACTIVE: 0.962418,
        V.GPU_TENSOR_ACTIVE: 0.412733,
        V.GPU_DRAM_ACTIVE: 0.683042,
        V.GPU_MEMORY_USED: 73474 * MIB,
        V.GPU_MEMORY_FREE: 7554 * MIB,
        V.GPU_POWER: 662.148,
        V.GPU_ENERGY: 313502297.892,
        V.GPU_SM_CLOCK: 1980e6,
        V.GPU_TEMPERATURE: 63.0,
    }
    for spec, want in truth.items():
        assert math.isclose(one(snap, spec), want, rel_tol=1e-12), spec.name
    # the default counters have no SM activity, power limit, clock events, violations or XID: absent, not 0
    assert not (
        {V.GPU_SM_ACTIVE, V.GPU_POWER_LIMIT, V.GPU_CLOCK_EVENT, V.GPU_THROTTLE_TIME, V.GPU_XID} & snap.metrics()
    )
    key = dict(next(iter(snap.values[V.GPU_POWER])))
    assert key == {
        **REPLICA,
        V.LABEL_HOST: "gpu-node-01",
        V.LABEL_GPU: "0",
        V.LABEL_GPU_UUID: GPU0,
        V.LABEL_GPU_MODEL: H100,
    }


def test_idle_gpu_is_idle_with_its_memory_preallocated() -> None:
    snap = translate("metrics-idle.txt", gpus.GpuSelection(uuids=frozenset({GPU0, GPU1})))
    assert len(snap.values[V.GPU_POWER]) == 2
    assert all(v == 0.0 for v in snap.values[V.GPU_UTILIZATION].values())
    assert all(v > 70_000 * MIB for v in snap.values[V.GPU_MEMORY_USED].values())


def test_throttling_reasons_and_time() -> None:
    snap = translate("metrics-throttled.txt", gpus.GpuSelection(uuids=frozenset({GPU0, GPU1})))
    active = {
        (dict(k)[V.LABEL_GPU], dict(k)[V.LABEL_REASON]) for k, v in snap.values[V.GPU_CLOCK_EVENT].items() if v == 1.0
    }
    # GPU 0: bitmask 4 = power_cap; GPU 1: bitmask 96 = sw_thermal (0x20) + hw_thermal (0x40)
    assert active == {("0", V.GPU_CLOCK_POWER_CAP), ("1", V.GPU_CLOCK_SW_THERMAL), ("1", V.GPU_CLOCK_HW_THERMAL)}
    assert len(snap.values[V.GPU_CLOCK_EVENT]) == 2 * 5, "one 0/1 series per throttling reason and GPU"
    assert set(V.GPU_THROTTLE_CAUSES) == {dict(k)[V.LABEL_REASON] for k in snap.values[V.GPU_CLOCK_EVENT]}
    assert one(snap, V.GPU_THROTTLE_TIME, gpu="0", reason=V.GPU_THROTTLE_POWER) == pytest.approx(1842.117305112)
    assert one(snap, V.GPU_THROTTLE_TIME, gpu="1", reason=V.GPU_THROTTLE_THERMAL) == pytest.approx(2215.402771568)
    assert one(snap, V.GPU_SM_CLOCK, gpu="1") == 825e6


def test_xid_is_a_label_of_the_gpu_that_had_it() -> None:
    snap = translate("metrics-xid.txt", gpus.GpuSelection(uuids=frozenset({GPU0, GPU1})))
    assert [dict(k) for k in snap.values[V.GPU_XID]] == [
        {**REPLICA, V.LABEL_HOST: "gpu-node-01", V.LABEL_GPU: "1", V.LABEL_GPU_UUID: GPU1, V.LABEL_GPU_MODEL: H100}
        | {V.LABEL_XID: "94"}
    ]
    only_gpu0 = translate("metrics-xid.txt", gpus.GpuSelection(uuids=frozenset({GPU0})))
    assert V.GPU_XID not in only_gpu0.metrics()


def test_kubernetes_pods_take_their_own_gpu() -> None:
    for pod, gpu in (("vllm-7c9d5b8f6d-4xk2p", "0"), ("vllm-7c9d5b8f6d-q8m7z", "1")):
        snap = translate("metrics-k8s.txt", gpus.GpuSelection(pod=pod, namespace="inference"), pool="h100-spot")
        assert {dict(k)[V.LABEL_GPU] for k in snap.values[V.GPU_POWER]} == {gpu}
        assert {dict(k)[V.LABEL_POOL] for k in snap.values[V.GPU_POWER]} == {"h100-spot"}
    elsewhere = translate("metrics-k8s.txt", gpus.GpuSelection(pod="vllm-7c9d5b8f6d-4xk2p", namespace="other"))
    assert not elsewhere.metrics()


def test_host_and_index_selection_accepts_both_spellings_of_the_host_label() -> None:
    text = (DCGM / "metrics-busy.txt").read_text()
    chosen = gpus.GpuSelection(host="gpu-node-01", indices=frozenset({"1"}))
    for page in (text, text.replace("Hostname=", "hostname=")):
        snap = gpus.translate(page, chosen, REPLICA, {})
        assert {dict(k)[V.LABEL_GPU_UUID] for k in snap.values[V.GPU_POWER]} == {GPU1}


def test_pod_from_env_needs_the_downward_api() -> None:
    chosen = gpus.selection([], None, [], None, None, True, {"POD_NAME": "p", "POD_NAMESPACE": "ns"})
    assert (chosen.pod, chosen.namespace) == ("p", "ns")
    with pytest.raises(gpus.GpuSelectionError, match=r"\$POD_NAME is not set"):
        gpus.selection([], None, [], None, None, True, {})


@pytest.mark.parametrize(
    "section",
    [{}, {"uuids": [GPU0], "pod": "p"}, {"host": "h"}, {"indices": [0]}, {"uuids": [GPU0], "url": "ftp://x"}],
)
def test_gpus_section_names_the_gpus_one_way(registry: EngineRegistry, section: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"one way|go together|must start with"):
        make_exporter(registry, "http://127.0.0.1:1/metrics", gpus={"url": "http://127.0.0.1:2/metrics", **section})


def test_exporter_joins_its_gpus_to_the_engine_replica(registry: EngineRegistry) -> None:
    """Through a real exporter: the GPU series carry the model the engine's page names, and the
    target's extra labels; the other GPU of the host is not this target's."""
    with (
        fake.FakeEngine({"/metrics": fake.page(VLLM_PAGE.read_bytes())}) as engine,
        fake.FakeEngine({"/metrics": fake.page((DCGM / "metrics-busy.txt").read_bytes())}) as source,
    ):
        exporter = make_exporter(
            registry,
            engine.url + "/metrics",
            labels={"replica": "a"},
            gpus={"url": source.url + "/metrics", "uuids": [GPU1], "pool": "h100"},
        )
        try:
            text = exporter.metrics()
        finally:
            exporter.stop(grace=1)
    engine_models = {lbls[V.LABEL_MODEL] for n, lbls, _ in samples(text) if n == V.REQUESTS_RUNNING.name}
    gpu_series = [lbls for n, lbls, _ in samples(text) if n == V.GPU_POWER.name]
    assert len(gpu_series) == 1 and len(engine_models) == 1
    assert gpu_series[0] == {
        V.LABEL_ENGINE: V.ENGINE_VLLM,
        V.LABEL_MODEL: engine_models.pop(),
        V.LABEL_POOL: "h100",
        V.LABEL_HOST: "gpu-node-01",
        V.LABEL_GPU: "1",
        V.LABEL_GPU_UUID: GPU1,
        V.LABEL_GPU_MODEL: H100,
        "replica": "a",
    }
    assert value(text, V.GPU_POWER.name) == pytest.approx(681.527)
    assert f"# TYPE {V.GPU_ENERGY.name} counter" in text


def test_an_unreachable_gpu_source_leaves_the_engine_served(registry: EngineRegistry) -> None:
    with fake.FakeEngine({"/metrics": fake.page(VLLM_PAGE.read_bytes())}) as engine:
        exporter = make_exporter(
            registry, engine.url + "/metrics", gpus={"url": "http://127.0.0.1:9/metrics", "uuids": [GPU0]}
        )
        try:
            text = exporter.metrics()
        finally:
            exporter.stop(grace=1)
    assert value(text, V.EXPORTER_UP.name) == 1.0
    assert value(text, V.REQUESTS_RUNNING.name) >= 0
    assert not any(n.startswith(V.GPU_POWER.name) for n, _, _ in samples(text))


def test_pod_from_env_without_the_env_is_a_configuration_error(registry: EngineRegistry) -> None:
    target = TargetConfig.model_validate(
        {"url": "http://127.0.0.1:1", "engine": "vllm", "gpus": {"url": "http://127.0.0.1:2", "pod_from_env": True}}
    )
    with httpx.Client() as client, pytest.raises(ConfigError, match="POD_NAME"):
        TargetScraper(target=target, registry=registry, vocabulary=V.Vocabulary(), client=client, environ={})


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--gpu-source", "http://127.0.0.1:2/metrics"], "--gpu-uuid, repeatable, or --gpu-pod-from-env"),
        (["--gpu-source", "http://127.0.0.1:2/metrics", "--gpu-pod-from-env"], "$POD_NAME is not set"),
    ],
)
def test_serve_gpu_flags_say_what_is_missing(flags: list[str], says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    args = ["exporter", "serve", "--target", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert says in " ".join(result.output.split())


def test_serve_gpu_flags_do_not_apply_to_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "exporter.yaml"
    config.write_text("targets:\n  - url: http://127.0.0.1:1\n")
    args = ["exporter", "serve", "--config", str(config), "--gpu-source", "http://127.0.0.1:2/metrics"]
    result = CliRunner().invoke(app, [*args, "--gpu-uuid", GPU0])
    assert result.exit_code != 0
    assert "give each a gpus: section" in " ".join(result.output.split())
