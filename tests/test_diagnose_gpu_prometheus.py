"""The GPU's PromQL in the diagnosis: each query on synthetic series (``promtool test rules``), then a real
Prometheus scraping four exporter pages, one replica each: a saturated GPU with a full KV cache, a GPU idle
while requests wait, a throttled GPU with an XID, and a replica without GPU series. ``read_fleet`` then
``diagnose`` must tell throughput_low's three causes apart, raise the GPU findings, and leave the replica
without GPUs as it was, saying what is missing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from inferwatch.collector.diagnosis import dcgm
from inferwatch.collector.diagnosis.evaluate import diagnose
from inferwatch.collector.diagnosis.prometheus import (
    GPU_CLOCK_EVENTS_QUERY,
    GPU_THROTTLE_TIME_QUERY,
    GPU_XID_QUERY,
    fleet_queries,
    read_fleet,
)
from inferwatch.collector.diagnosis.signals import Filters, Fleet, TargetKey
from inferwatch.core import vocabulary as V
from inferwatch.core.causes import Cause
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.symptoms import Signal, Status, Symptom
from tests.conftest import require_tool
from tests.support.prometheus_run import running, wait_scraped
from tests.support.promql_check import expr_test
from tests.test_diagnose_proxy_fallback import _serve

REPLICA = 'engine="vllm",model="m",instance="a:9400"'
GPU_LABELS = ('gpu="0",gpu_uuid="GPU-aaaa",host="node-1"', 'gpu="1",gpu_uuid="GPU-bbbb",host="node-1"')


def _row(value: float, extra: str = "", gpu: int | None = None) -> dict[str, object]:
    labels = REPLICA + ("," + GPU_LABELS[gpu] if gpu is not None else "") + extra
    return {"labels": "{" + labels + "}", "value": value}


# -- the PromQL, on synthetic series ---------------------------------------------------------------------
def test_activity_and_gpu_count_per_replica(promtool: str, tmp_path: Path) -> None:
    queries = fleet_queries("5m", Filters())
    series = [
        (f"{V.GPU_ENGINE_ACTIVE.name}{{{REPLICA},{GPU_LABELS[0]}}}", "0.9x10"),
        (f"{V.GPU_ENGINE_ACTIVE.name}{{{REPLICA},{GPU_LABELS[1]}}}", "0.5x10"),
        (f"{V.GPU_UTILIZATION.name}{{{REPLICA},{GPU_LABELS[0]}}}", "1x10"),
        (f"{V.GPU_POWER.name}{{{REPLICA},{GPU_LABELS[0]}}}", "600x10"),
        (f"{V.GPU_POWER.name}{{{REPLICA},{GPU_LABELS[1]}}}", "350x10"),  # GPU 1 has power but no utilisation
        (f"{V.GPU_POWER_LIMIT.name}{{{REPLICA},{GPU_LABELS[0]}}}", "700x10"),
        (f"{V.GPU_POWER_LIMIT.name}{{{REPLICA},{GPU_LABELS[1]}}}", "350x10"),
        (f"{V.GPU_SM_CLOCK.name}{{{REPLICA},{GPU_LABELS[0]}}}", "1980000000x10"),
        (f"{V.GPU_SM_CLOCK.name}{{{REPLICA},{GPU_LABELS[1]}}}", "1200000000x10"),
    ]
    expr_test(promtool, tmp_path, queries[Signal.GPU_ENGINE_ACTIVE], series, [_row(0.7)])
    expr_test(promtool, tmp_path, queries[Signal.GPU_COUNT], series, [_row(2)])
    expr_test(promtool, tmp_path, queries[Signal.GPU_POWER_SHARE], series, [_row(1)])  # GPU 1 at its limit
    expr_test(promtool, tmp_path, queries[Signal.GPU_SM_CLOCK], series, [_row(1200)])  # the slowest, in MHz


def test_throttling_reasons_time_and_xids_per_gpu(promtool: str, tmp_path: Path) -> None:
    queries = fleet_queries("5m", Filters())
    event = V.GPU_CLOCK_EVENT.name
    series = [
        (f'{event}{{{REPLICA},{GPU_LABELS[0]},reason="{V.GPU_CLOCK_POWER_CAP}"}}', "1x10"),
        (f'{event}{{{REPLICA},{GPU_LABELS[0]},reason="{V.GPU_CLOCK_HW_THERMAL}"}}', "0x10"),
        (f'{event}{{{REPLICA},{GPU_LABELS[1]},reason="sync_boost"}}', "1x10"),  # not throttling: left out
        (f'{V.GPU_THROTTLE_TIME.name}{{{REPLICA},{GPU_LABELS[1]},reason="thermal"}}', "0+30x10"),  # 0.5 s/s
        (f'{V.GPU_XID.name}{{{REPLICA},{GPU_LABELS[1]},xid="79"}}', "_x7 1x3"),  # an XID three minutes ago
    ]
    power_cap, hw_thermal = (f',reason="{r}"' for r in (V.GPU_CLOCK_POWER_CAP, V.GPU_CLOCK_HW_THERMAL))
    expr_test(
        promtool, tmp_path, queries[GPU_CLOCK_EVENTS_QUERY], series, [_row(1, power_cap, 0), _row(0, hw_thermal, 0)]
    )
    expr_test(promtool, tmp_path, queries[GPU_THROTTLE_TIME_QUERY], series, [_row(0.5, ',reason="thermal"', 1)])
    expr_test(promtool, tmp_path, queries[GPU_XID_QUERY], series, [_row(1, ',xid="79"', 1)])


# -- a real Prometheus, four replicas ----------------------------------------------------------------------
@dataclass
class Replica:
    """An exporter page for one replica: engine gauges, and (unless ``gpus`` is empty) its GPUs'
    ``llm_gpu_*`` series; counters grow at every scrape."""

    model: str
    waiting: float
    running: float
    kv: float
    gpus: list[float] = field(default_factory=list)
    """engine activity per GPU."""
    power_cap: bool = False
    xid: str | None = None
    scrapes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def page(self) -> bytes:
        with self.lock:
            self.scrapes += 1
            n = self.scrapes
        replica = f'{V.LABEL_ENGINE}="{V.ENGINE_VLLM}",{V.LABEL_MODEL}="{self.model}"'
        lines = [
            f"# TYPE {V.REQUESTS_RUNNING.name} gauge",
            f"{V.REQUESTS_RUNNING.name}{{{replica}}} {self.running}",
            f"# TYPE {V.REQUESTS_WAITING.name} gauge",
            f"{V.REQUESTS_WAITING.name}{{{replica}}} {self.waiting}",
            f"# TYPE {V.KV_CACHE_USAGE.name} gauge",
            f"{V.KV_CACHE_USAGE.name}{{{replica}}} {self.kv}",
            f"# TYPE {V.GENERATION_TOKENS.name.removesuffix('_total')} counter",
            f"{V.GENERATION_TOKENS.name}{{{replica}}} {100 * n}",
        ]

        def family(spec: V.MetricSpec, rows: list[tuple[int, str, float]]) -> None:
            if not rows:
                return
            lines.append(f"# TYPE {spec.name.removesuffix('_total')} {spec.kind.value}")
            for gpu, extra, value in rows:
                labels = f'{replica},{V.LABEL_GPU}="{gpu}",{V.LABEL_GPU_UUID}="GPU-{self.model}-{gpu}"'
                lines.append(f'{spec.name}{{{labels},{V.LABEL_HOST}="node-1"{extra}}} {value}')

        gpus = list(enumerate(self.gpus))
        family(V.GPU_ENGINE_ACTIVE, [(i, "", a) for i, a in gpus])
        family(V.GPU_UTILIZATION, [(i, "", min(1.0, a + 0.05)) for i, a in gpus])
        family(V.GPU_POWER, [(i, "", 700.0 if self.power_cap else 300 + 380 * a) for i, a in gpus])
        family(
            V.GPU_CLOCK_EVENT,
            [
                (i, f',{V.LABEL_REASON}="{reason}"', float(self.power_cap and reason == V.GPU_CLOCK_POWER_CAP))
                for i, _ in gpus
                for reason in sorted(V.GPU_THROTTLE_CAUSES)
            ],
        )
        family(V.GPU_THROTTLE_TIME, [(i, f',{V.LABEL_REASON}="{V.GPU_THROTTLE_POWER}"', 0.0) for i, _ in gpus])
        if self.xid is not None and gpus:
            family(V.GPU_XID, [(0, f',{V.LABEL_XID}="{self.xid}"', 1.0)])
        return ("\n".join(lines) + "\n").encode()


REPLICAS = {
    "saturated": Replica("saturated", waiting=20, running=64, kv=0.99, gpus=[0.97, 0.96]),
    "client-bound": Replica("client-bound", waiting=12, running=2, kv=0.05, gpus=[0.1]),
    "throttled": Replica("throttled", waiting=8, running=30, kv=0.6, gpus=[0.95], power_cap=True, xid="79"),
    "no-gpus": Replica("no-gpus", waiting=10, running=40, kv=0.99),
}


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """Prometheus scraping the four pages every second; yields its URL and each model's instance."""
    require_tool("prometheus")
    servers, instances = [], {}
    for name, replica in REPLICAS.items():
        server, where = _serve(replica.page)
        servers.append(server)
        instances[name] = where
    try:
        with running(tmp_path, {"exporters": list(instances.values())}) as base:
            if not wait_scraped(base, len(REPLICAS)):
                pytest.fail("Prometheus did not scrape every page four times in 30 s")
            yield base, instances
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_real_prometheus_tells_the_three_causes_apart(scraped: tuple[str, dict[str, str]]) -> None:
    base, instances = scraped

    async def read() -> Fleet:
        async with httpx.AsyncClient() as client:
            return await read_fleet(client, base, window="1m", filters=Filters())

    fleet = asyncio.run(read())
    saturated = fleet.targets[TargetKey(V.ENGINE_VLLM, "saturated", instances["saturated"])]
    assert saturated.values[Signal.GPU_COUNT].value == 2
    assert saturated.values[Signal.GPU_ENGINE_ACTIVE].value == pytest.approx(0.965)
    throttled = fleet.targets[TargetKey(V.ENGINE_VLLM, "throttled", instances["throttled"])]
    assert [(r.what, r.value) for r in throttled.gpus.clock_events if r.value] == [(V.GPU_CLOCK_POWER_CAP, 1.0)]
    assert throttled.gpus.clock_events[0].gpu == "GPU 0 (GPU-throttled-0) on node-1"

    result = diagnose(fleet, builtin_profiles())
    by_model = {(f.model, f.symptom): f for f in result.findings}
    low = {model: by_model[(model, Symptom.THROUGHPUT_LOW)].likely_cause for model in REPLICAS}
    assert low == {
        "saturated": Cause.GPU_SATURATED,
        "client-bound": Cause.OUTSIDE_GPU,
        "throttled": Cause.GPU_THROTTLED,
        "no-gpus": None,
    }
    assert by_model[("client-bound", Symptom.THROUGHPUT_LOW)].severity is Status.CRITICAL  # activity 0.1 < 0.2
    power = by_model[("throttled", Symptom.GPU_THROTTLED)]
    assert power.severity is Status.CRITICAL and "by power (power_cap) 100.0% of the window" in power.summary
    assert "avg_over_time(" in power.evidence[0].query  # the PromQL to paste
    errors = by_model[("throttled", Symptom.GPU_ERRORS)]
    assert errors.severity is Status.CRITICAL and "XID 79" in errors.summary
    assert dcgm.NO_GPU_EVIDENCE in by_model[("no-gpus", Symptom.THROUGHPUT_LOW)].cause
    statuses = {t.model: t for t in result.targets}
    assert statuses["no-gpus"].reasons[Symptom.GPU_THROTTLED] == dcgm.NO_GPU
    assert statuses["saturated"].status[Symptom.GPU_THROTTLED] is Status.OK
    assert statuses["saturated"].status[Symptom.GPU_ERRORS] is Status.OK
