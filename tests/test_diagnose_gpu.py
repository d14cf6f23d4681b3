"""The GPU in the diagnosis, on hand-built signals: throughput_low's three causes told apart, tpot_slow's
decode bound, the gpu_throttled and gpu_errors findings, each threshold exactly at its value, and what
the diagnosis says without GPU series (as before, plus how to add them). The same signals from two
scrapes of an exporter page (exporter-only mode) and the checklist's GPU question; the PromQL itself is
checked in ``test_diagnose_gpu_prometheus.py``."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from rich.console import Console

from inferwatch.cli.oncall import render_diagnosis
from inferwatch.collector.diagnosis import dcgm, exporter_scrape
from inferwatch.collector.diagnosis.evaluate import Settings, diagnose, remedy_text
from inferwatch.collector.diagnosis.gpu import summarise
from inferwatch.collector.diagnosis.report import Diagnosis, Finding
from inferwatch.collector.diagnosis.signals import Fleet, GpuReading, TargetKey
from inferwatch.collector.diagnosis.tuning import evaluate as checklist
from inferwatch.core import vocabulary as V
from inferwatch.core.causes import GPU_THRESHOLDS, Cause, cause, remedies
from inferwatch.core.checklist import Check, Verdict
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.symptoms import Signal, Status, Symptom, catalogue
from tests.test_diagnose import HEALTHY

PROFILES = builtin_profiles()
KEY = TargetKey(V.ENGINE_VLLM, "m", "10.0.0.1:9400")
GPU0 = "GPU 0 (GPU-aaaa) on node-1"
GPU1 = "GPU 1 (GPU-bbbb) on node-1"
QUIET = [(GPU0, V.GPU_CLOCK_POWER_CAP, 0.0), (GPU0, V.GPU_CLOCK_SW_THERMAL, 0.0)]
"""clock-event reasons exported, none held: the GPU is known not to be throttled."""
BUSY_GPU: dict[Signal, float] = {
    Signal.GPU_COUNT: 1,
    Signal.GPU_ENGINE_ACTIVE: 0.96,
    Signal.GPU_UTILIZATION: 1.0,
    Signal.GPU_TENSOR_ACTIVE: 0.42,
    Signal.GPU_DRAM_ACTIVE: 0.69,
    Signal.GPU_SM_CLOCK: 1980,
}
QUEUE = {Signal.WAITING: 12.0, Signal.RUNNING: 3.0, Signal.MAX_CONCURRENCY: 64}


def fleet_with(
    values: dict[Signal, float],
    *,
    events: Iterable[tuple[str, str, float]] = QUIET,
    time: Iterable[tuple[str, str, float]] = (),
    xids: Iterable[tuple[str, str]] = (),
    window_seconds: float = 600,
) -> Fleet:
    fleet = Fleet("prometheus", "10m", window_seconds)
    target = fleet.target(KEY)
    for signal, value in values.items():
        target.put(signal, value, f"query of {signal.value}")
    if Signal.GPU_COUNT in values:
        target.gpus.clock_events += [GpuReading(g, r, v, "events query") for g, r, v in events]
        target.gpus.throttle_time += [GpuReading(g, r, v, "time query") for g, r, v in time]
    target.gpus.xids += [GpuReading(g, code, 1.0, "xid query") for g, code in xids]
    summarise(target, throttle_query="throttled query", xid_query="xid query")
    return fleet


def judged(fleet: Fleet, settings: Settings | None = None) -> tuple[dict[Symptom, Status], dict[Symptom, Finding]]:
    result = diagnose(fleet, PROFILES, settings)
    (target,) = result.targets
    return dict(target.status), {f.symptom: f for f in result.findings}


# -- throughput_low: three causes -------------------------------------------------------------------------
SATURATED = {**HEALTHY, **BUSY_GPU, Signal.KV_USAGE: 0.99, Signal.WAITING: 20.0, Signal.RUNNING: 64.0}
IDLE = {**HEALTHY, **BUSY_GPU, **QUEUE, Signal.KV_USAGE: 0.05, Signal.GPU_ENGINE_ACTIVE: 0.08}
THROTTLED = {**HEALTHY, **BUSY_GPU, Signal.KV_USAGE: 0.6, Signal.WAITING: 8.0, Signal.RUNNING: 30.0}
POWER_CAPPED = [(GPU0, V.GPU_CLOCK_POWER_CAP, 1.0), (GPU0, V.GPU_CLOCK_SW_THERMAL, 0.0)]


def test_saturated_gpu_with_a_full_cache_keeps_the_catalogues_cause_and_remedies() -> None:
    status, found = judged(fleet_with(SATURATED))
    finding = found[Symptom.THROUGHPUT_LOW]
    assert finding.severity is Status.CRITICAL and finding.likely_cause is Cause.GPU_SATURATED
    assert "the GPU is saturated too" in finding.summary
    spec = catalogue()[Symptom.THROUGHPUT_LOW]
    assert finding.remedies == [remedy_text(r, PROFILES[V.ENGINE_VLLM]) for r in spec.remedies]  # the seed's
    shown = {e.signal: e for e in finding.evidence}
    assert shown[Signal.KV_USAGE.value].threshold == "> 0.98"
    assert shown[Signal.GPU_ENGINE_ACTIVE.value].threshold == ">= 0.9 (saturated)"
    assert status[Symptom.GPU_THROTTLED] is Status.OK and status[Symptom.GPU_ERRORS] is Status.OK


def test_idle_gpu_while_requests_wait_points_outside_the_gpu() -> None:
    status, found = judged(fleet_with(IDLE))
    finding = found[Symptom.THROUGHPUT_LOW]
    assert finding.severity is Status.CRITICAL and finding.likely_cause is Cause.OUTSIDE_GPU
    assert "the bottleneck is outside the GPU" in finding.summary and "12 requests wait" in finding.summary
    assert finding.cause == cause(Symptom.THROUGHPUT_LOW, Cause.OUTSIDE_GPU).cause
    assert any("tokenizer" in r for r in finding.remedies) and any(
        "clients' concurrency" in r for r in finding.remedies
    )
    assert not any(r.startswith("quantize the model") for r in finding.remedies)  # memory is not the limit
    shown = {e.signal: e for e in finding.evidence}
    assert shown[Signal.GPU_ENGINE_ACTIVE.value].threshold == "< 0.2"
    assert shown[Signal.WAITING.value].threshold == "> 0.5"
    assert shown[Signal.MAX_CONCURRENCY.value].value == 64  # the batch far below the limit
    assert status[Symptom.GPU_THROTTLED] is Status.OK


def test_throttled_gpu_is_the_cause_and_its_own_critical_finding() -> None:
    status, found = judged(fleet_with(THROTTLED, events=POWER_CAPPED))
    throttled = found[Symptom.GPU_THROTTLED]
    assert throttled.severity is Status.CRITICAL
    assert f"{GPU0} throttled by power (power_cap) 100.0% of the window, about 10 min" in throttled.summary
    assert throttled.remedies[0].startswith("power:")  # the power remedy first for a power cause
    assert "here: power, on GPU 0" in throttled.cause
    low = found[Symptom.THROUGHPUT_LOW]
    assert low.likely_cause is Cause.GPU_THROTTLED
    assert low.severity is Status.WARNING and "consequence of gpu_throttled" in low.summary
    assert low.remedies[0].startswith("power:")
    assert f"{GPU0} was throttled (power) 100.0% of the window (> 10.0%) while 8 requests wait" in low.summary
    readings = [e for e in low.evidence if e.signal == "gpu_throttle"]
    assert [(e.description, e.value) for e in readings] == [(f"{GPU0}: power (power_cap): share of the window", 1.0)]
    assert status[Symptom.TPOT_SLOW] is Status.OK


def test_the_three_causes_on_three_replicas_at_once() -> None:
    fleet = Fleet("prometheus", "10m", 600)
    for i, (values, events) in enumerate(((SATURATED, QUIET), (IDLE, QUIET), (THROTTLED, POWER_CAPPED))):
        target = fleet.target(TargetKey(V.ENGINE_VLLM, "m", f"10.0.0.{i}:9400"))
        for signal, value in values.items():
            target.put(signal, value, "q")
        target.gpus.clock_events += [GpuReading(g, r, v, "q") for g, r, v in events]
        summarise(target, throttle_query="q", xid_query="q")
    result = diagnose(fleet, PROFILES)
    causes = {f.instance: f.likely_cause for f in result.findings if f.symptom is Symptom.THROUGHPUT_LOW}
    assert causes == {
        "10.0.0.0:9400": Cause.GPU_SATURATED,
        "10.0.0.1:9400": Cause.OUTSIDE_GPU,
        "10.0.0.2:9400": Cause.GPU_THROTTLED,
    }


def test_throttled_wins_over_a_full_cache_and_idle_over_a_full_cache() -> None:
    _, found = judged(fleet_with({**SATURATED}, events=POWER_CAPPED))
    assert found[Symptom.THROUGHPUT_LOW].likely_cause is Cause.GPU_THROTTLED
    _, found = judged(fleet_with({**SATURATED, Signal.GPU_ENGINE_ACTIVE: 0.3}))
    assert found[Symptom.THROUGHPUT_LOW].likely_cause is Cause.OUTSIDE_GPU


def test_nothing_waits_no_throughput_finding_whatever_the_gpu() -> None:
    quiet = {**IDLE, Signal.WAITING: 0.5}  # the gate: more than 0.5 waiting
    status, _ = judged(fleet_with(quiet, events=POWER_CAPPED))
    assert status[Symptom.THROUGHPUT_LOW] is Status.OK
    assert status[Symptom.GPU_THROTTLED] is Status.CRITICAL  # the GPU's own finding stands


# -- thresholds, exactly at the threshold -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("active", "expected"),
    [
        (GPU_THRESHOLDS.idle_activity, Status.OK),  # 0.5 is not idle: the cache (5 %) is not full either
        (0.4999, Status.WARNING),
        (GPU_THRESHOLDS.idle_critical, Status.WARNING),  # 0.2 is warning, below it critical
        (0.1999, Status.CRITICAL),
    ],
)
def test_idle_thresholds(active: float, expected: Status) -> None:
    status, found = judged(fleet_with({**IDLE, Signal.GPU_ENGINE_ACTIVE: active}))
    assert status[Symptom.THROUGHPUT_LOW] is expected
    if expected is not Status.OK:
        assert found[Symptom.THROUGHPUT_LOW].likely_cause is Cause.OUTSIDE_GPU


@pytest.mark.parametrize(
    ("signal", "value", "saturated"),
    [
        (Signal.GPU_ENGINE_ACTIVE, GPU_THRESHOLDS.busy_activity, True),
        (Signal.GPU_ENGINE_ACTIVE, 0.8999, False),
        (Signal.GPU_UTILIZATION, GPU_THRESHOLDS.busy_utilization, True),  # the fallback's own level
        (Signal.GPU_UTILIZATION, 0.9499, False),
    ],
)
def test_busy_thresholds_and_the_utilisation_fallback(signal: Signal, value: float, saturated: bool) -> None:
    values: dict[Signal, float] = {
        k: v for k, v in SATURATED.items() if k not in (Signal.GPU_ENGINE_ACTIVE, Signal.GPU_UTILIZATION)
    }
    _, found = judged(fleet_with({**values, signal: value}))
    finding = found[Symptom.THROUGHPUT_LOW]
    assert finding.likely_cause is Cause.GPU_SATURATED
    assert ("the GPU is saturated too" in finding.summary) is saturated
    assert ("memory, not compute, caps the batch" in finding.summary) is not saturated


def test_kv_usage_exactly_at_the_threshold_is_not_a_finding() -> None:
    status, _ = judged(fleet_with({**SATURATED, Signal.KV_USAGE: 0.9}))
    assert status[Symptom.THROUGHPUT_LOW] is Status.OK
    status, _ = judged(fleet_with({**SATURATED, Signal.KV_USAGE: 0.9001}))
    assert status[Symptom.THROUGHPUT_LOW] is Status.WARNING


@pytest.mark.parametrize(
    ("share", "expected", "cause_of_throughput"),
    [
        (0.1, Status.OK, Cause.GPU_SATURATED),  # a tenth of the window is not throttled
        (0.1001, Status.WARNING, Cause.GPU_THROTTLED),
        (0.5, Status.WARNING, Cause.GPU_THROTTLED),
        (0.5001, Status.CRITICAL, Cause.GPU_THROTTLED),
    ],
)
def test_throttle_thresholds(share: float, expected: Status, cause_of_throughput: Cause) -> None:
    events = [(GPU0, V.GPU_CLOCK_HW_THERMAL, share)]
    status, found = judged(fleet_with(SATURATED, events=events))
    assert status[Symptom.GPU_THROTTLED] is expected
    assert found[Symptom.THROUGHPUT_LOW].likely_cause is cause_of_throughput


def test_throttle_time_counts_when_the_clock_event_reasons_are_not_exported() -> None:
    time = [(GPU1, V.GPU_THROTTLE_THERMAL, 0.75), (GPU1, V.GPU_THROTTLE_POWER, 0.0)]
    status, found = judged(fleet_with(THROTTLED, events=(), time=time))
    finding = found[Symptom.GPU_THROTTLED]
    assert finding.severity is Status.CRITICAL
    assert f"{GPU1} throttled by thermal (throttle time) 75.0% of the window" in finding.summary
    assert finding.remedies[0].startswith("thermal:")
    assert [e.signal for e in finding.evidence if e.signal.startswith("gpu_throttle")][1:] == ["gpu_throttle_time"]
    assert status[Symptom.THROUGHPUT_LOW] is Status.WARNING


def test_overrides_move_the_gpu_thresholds_too() -> None:
    events = [(GPU0, V.GPU_CLOCK_POWER_CAP, 0.3)]
    settings = Settings(overrides={Symptom.GPU_THROTTLED: (0.4, 0.8)})
    status, found = judged(fleet_with(THROTTLED, events=events), settings)
    assert status[Symptom.GPU_THROTTLED] is Status.OK
    assert Symptom.THROUGHPUT_LOW not in found  # the cache is 60 % and the GPU busy: nothing else holds


# -- gpu_errors ---------------------------------------------------------------------------------------------
def test_critical_xid_is_critical_and_names_the_gpu_and_code() -> None:
    status, found = judged(fleet_with(HEALTHY | BUSY_GPU, xids=[(GPU1, "79"), (GPU0, "13")]))
    finding = found[Symptom.GPU_ERRORS]
    assert finding.severity is Status.CRITICAL
    assert finding.summary.startswith(f"GPU errors (XID): {GPU1} XID 79 (critical: the GPU has fallen off the bus")
    assert f"{GPU0} XID 13 (graphics engine exception" in finding.summary
    shown = [(e.signal, e.value) for e in finding.evidence]
    assert shown[:3] == [(Signal.GPU_XID_CRITICAL.value, 1.0), ("gpu_xid", 1.0), ("gpu_xid", 1.0)]
    assert "79" in V.GPU_XID_CRITICAL and "13" not in V.GPU_XID_CRITICAL
    assert status[Symptom.GPU_THROTTLED] is Status.OK


def test_an_xid_off_the_critical_list_is_a_warning_and_none_is_ok() -> None:
    status, found = judged(fleet_with(HEALTHY | BUSY_GPU, xids=[(GPU0, "31")]))
    assert status[Symptom.GPU_ERRORS] is Status.WARNING
    assert "GPU memory page fault" in found[Symptom.GPU_ERRORS].summary
    status, _ = judged(fleet_with(HEALTHY | BUSY_GPU))
    assert status[Symptom.GPU_ERRORS] is Status.OK


# -- tpot_slow ----------------------------------------------------------------------------------------------
SLOW = {**HEALTHY, **BUSY_GPU, Signal.TPOT_P99: 0.15}


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ({Signal.GPU_DRAM_ACTIVE: 0.5, Signal.GPU_TENSOR_ACTIVE: 0.4}, Cause.MEMORY_BANDWIDTH),  # at the threshold
        ({Signal.GPU_DRAM_ACTIVE: 0.4999, Signal.GPU_TENSOR_ACTIVE: 0.4}, None),
        ({Signal.GPU_DRAM_ACTIVE: 0.6, Signal.GPU_TENSOR_ACTIVE: 0.6}, None),  # tensor as busy: compute-heavy
        (
            {Signal.GPU_DRAM_ACTIVE: 0.1, Signal.GPU_TENSOR_ACTIVE: 0.05, Signal.GPU_SM_ACTIVE: 0.2},
            Cause.SMALL_BATCHES,
        ),
        ({Signal.GPU_DRAM_ACTIVE: 0.1, Signal.GPU_TENSOR_ACTIVE: 0.05, Signal.GPU_SM_ACTIVE: 0.3}, None),
        ({Signal.GPU_ENGINE_ACTIVE: 0.3}, Cause.OUTSIDE_GPU),
    ],
)
def test_tpot_slow_says_how_the_decode_is_bound(gpu: dict[Signal, float], expected: Cause | None) -> None:
    _, found = judged(fleet_with({**SLOW, **gpu}))
    finding = found[Symptom.TPOT_SLOW]
    assert finding.likely_cause is expected
    main = [r.text for r in catalogue()[Symptom.TPOT_SLOW].remedies]
    texts = [r.split(" (vLLM")[0] for r in finding.remedies]
    assert texts[-len(main) :] == main  # the model-too-big remedies stay
    if expected is Cause.SMALL_BATCHES:
        assert "CUDA graphs" in texts[0] and finding.cause == cause(Symptom.TPOT_SLOW, expected).cause
    if expected is None:
        assert finding.cause.startswith(catalogue()[Symptom.TPOT_SLOW].cause)
    evidence = {e.signal for e in finding.evidence}
    assert {Signal.GPU_DRAM_ACTIVE.value, Signal.GPU_TENSOR_ACTIVE.value} <= evidence


def test_a_throttled_gpu_makes_slow_tokens_its_consequence() -> None:
    _, found = judged(fleet_with(SLOW | {Signal.TPOT_P99: 0.5}, events=POWER_CAPPED))
    finding = found[Symptom.TPOT_SLOW]
    assert finding.likely_cause is Cause.GPU_THROTTLED
    assert finding.severity is Status.WARNING and "consequence of gpu_throttled" in finding.summary
    texts = [r.split(" (")[0] for r in finding.remedies]
    assert texts[0].startswith("power:")  # the power cap held the clock: its remedy first
    assert sorted(texts) == sorted(
        r.text.split(" (")[0] for r in remedies(cause(Symptom.TPOT_SLOW, Cause.GPU_THROTTLED))
    )


# -- no GPU series ------------------------------------------------------------------------------------------
def test_without_gpu_series_the_diagnosis_is_as_before_and_says_what_is_missing() -> None:
    engine_only = {**HEALTHY, Signal.KV_USAGE: 0.99, Signal.WAITING: 10.0, Signal.TPOT_P99: 0.15}
    status, found = judged(fleet_with(engine_only))
    low = found[Symptom.THROUGHPUT_LOW]
    spec = catalogue()[Symptom.THROUGHPUT_LOW]
    assert low.severity is Status.CRITICAL and low.likely_cause is None
    assert low.summary == "Throughput will not rise: KV-cache usage (mean over the window) 99.0% > 98.0%"
    assert low.cause == f"{spec.cause}; {dcgm.NO_GPU_EVIDENCE}" and "gpus:" in low.cause
    assert low.remedies == [remedy_text(r, PROFILES[V.ENGINE_VLLM]) for r in spec.remedies]
    tpot = found[Symptom.TPOT_SLOW]
    assert tpot.likely_cause is None and dcgm.NO_GPU_EVIDENCE in tpot.cause
    assert status[Symptom.GPU_THROTTLED] is Status.UNKNOWN and status[Symptom.GPU_ERRORS] is Status.UNKNOWN
    reasons = diagnose(fleet_with(engine_only), PROFILES).targets[0].reasons
    assert reasons[Symptom.GPU_THROTTLED] == reasons[Symptom.GPU_ERRORS] == dcgm.NO_GPU


def test_gpus_without_clock_events_or_throttle_time_cannot_tell_throttling() -> None:
    result = diagnose(fleet_with(SATURATED, events=()), PROFILES)
    (target,) = result.targets
    assert target.status[Symptom.GPU_THROTTLED] is Status.UNKNOWN
    reason = target.reasons[Symptom.GPU_THROTTLED]
    assert reason == dcgm.CANNOT_TELL_THROTTLE
    assert reason.startswith("cannot tell: add ") and "CLOCKS_EVENT_REASONS to dcgm-exporter's counters" in reason
    assert target.status[Symptom.GPU_ERRORS] is Status.OK  # GPUs without an XID have none
    low = next(f for f in result.findings if f.symptom is Symptom.THROUGHPUT_LOW)
    assert low.likely_cause is Cause.GPU_SATURATED  # the activity still says which cause


def test_without_profiling_the_tpot_cause_says_so() -> None:
    profiling = (Signal.GPU_DRAM_ACTIVE, Signal.GPU_TENSOR_ACTIVE, Signal.GPU_ENGINE_ACTIVE)
    no_profiling: dict[Signal, float] = {k: v for k, v in SLOW.items() if k not in profiling}
    _, found = judged(fleet_with(no_profiling))
    finding = found[Symptom.TPOT_SLOW]
    assert finding.likely_cause is None and dcgm.NO_PROFILING in finding.cause


def test_kv_usage_missing_but_an_idle_gpu_still_judges_throughput() -> None:
    values: dict[Signal, float] = {k: v for k, v in IDLE.items() if k is not Signal.KV_USAGE}
    _, found = judged(fleet_with(values))
    assert found[Symptom.THROUGHPUT_LOW].likely_cause is Cause.OUTSIDE_GPU
    busy: dict[Signal, float] = {k: v for k, v in SATURATED.items() if k is not Signal.KV_USAGE}
    status, _ = judged(fleet_with(busy))
    assert status[Symptom.THROUGHPUT_LOW] is Status.UNKNOWN  # the cache cannot be judged, the GPU is busy


# -- the terminal --------------------------------------------------------------------------------------------
def test_the_terminal_table_has_a_gpu_column_and_fits_80_columns() -> None:
    fleet = fleet_with(THROTTLED, events=POWER_CAPPED, xids=[(GPU0, "94")])
    result = diagnose(fleet, PROFILES)
    console = Console(width=80, record=True, highlight=False, soft_wrap=True)
    render_diagnosis(result, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    header = next(line for line in text.splitlines() if line.startswith("target"))
    assert header.split()[-1] == "gpu" and len(header) <= 80
    row = next(line for line in text.splitlines() if line.startswith("vllm m"))
    assert row.split()[-1] == "CRIT"
    assert "CRITICAL gpu_throttled" in text and "CRITICAL gpu_errors" in text
    # one GPU's reading by its words: which GPU, which reason
    flat = " ".join(text.split())
    assert f"{GPU0}: power (power_cap): share of the window = 100.0%" in flat
    assert f"{GPU0}: XID 94 (critical: contained ECC error" in flat


def test_the_terminal_without_gpu_series_says_how_to_add_them_once() -> None:
    result = Diagnosis.model_validate(diagnose(fleet_with(HEALTHY), PROFILES).model_dump())
    console = Console(width=80, record=True, highlight=False, soft_wrap=True)
    render_diagnosis(result, console)
    text = console.export_text()
    assert text.count("vllm gpu: no GPU series for this target") == 1
    header = next(line for line in text.splitlines() if line.startswith("target"))
    assert header.split()[-1] == "aborts"  # no target has GPU series: no column of question marks


# -- exporter-only mode: two scrapes of the exporter's page -------------------------------------------------
def _page(t: float, *, power_cap: int, thermal_seconds: float, xid: str | None) -> str:
    """An exporter page: a vLLM replica on two GPUs (``t`` seconds of constant load)."""
    replica = f'{V.LABEL_ENGINE}="{V.ENGINE_VLLM}",{V.LABEL_MODEL}="m"'
    lines = [
        f"# TYPE {V.REQUESTS_RUNNING.name} gauge",
        f"{V.REQUESTS_RUNNING.name}{{{replica}}} 4",
        f"# TYPE {V.REQUESTS_WAITING.name} gauge",
        f"{V.REQUESTS_WAITING.name}{{{replica}}} 9",
        f"# TYPE {V.KV_CACHE_USAGE.name} gauge",
        f"{V.KV_CACHE_USAGE.name}{{{replica}}} 0.3",
    ]
    gpus = [("0", "GPU-aaaa", 0.2, 1980e6), ("1", "GPU-bbbb", 0.1, 1200e6)]

    def family(spec: V.MetricSpec, rows: list[tuple[str, str, float]]) -> None:
        lines.append(f"# TYPE {spec.name.removesuffix('_total')} {spec.kind.value}")
        for index, extra, value in rows:
            uuid = dict((i, u) for i, u, _, _ in gpus)[index]
            labels = f'{replica},{V.LABEL_GPU}="{index}",{V.LABEL_GPU_UUID}="{uuid}",{V.LABEL_HOST}="node-1"{extra}'
            lines.append(f"{spec.name}{{{labels}}} {value}")

    family(V.GPU_ENGINE_ACTIVE, [(i, "", a) for i, _, a, _ in gpus])
    family(V.GPU_UTILIZATION, [(i, "", a + 0.1) for i, _, a, _ in gpus])
    family(V.GPU_SM_CLOCK, [(i, "", c) for i, _, _, c in gpus])
    family(V.GPU_POWER, [(i, "", 350.0) for i, _, _, _ in gpus])
    family(V.GPU_POWER_LIMIT, [(i, "", 700.0) for i, _, _, _ in gpus])
    reason = f',{V.LABEL_REASON}="{{}}"'
    held = {("0", V.GPU_CLOCK_POWER_CAP): float(power_cap)}
    events = [(i, r) for i in ("0", "1") for r in (V.GPU_CLOCK_POWER_CAP, V.GPU_CLOCK_HW_THERMAL)]
    family(V.GPU_CLOCK_EVENT, [(i, reason.format(r), held.get((i, r), 0.0)) for i, r in events])
    family(V.GPU_THROTTLE_TIME, [("1", reason.format(V.GPU_THROTTLE_THERMAL), thermal_seconds)])
    if xid is not None:
        family(V.GPU_XID, [("1", f',{V.LABEL_XID}="{xid}"', 1.0)])
    return "\n".join(lines) + "\n"


def test_exporter_mode_reads_the_gpus_from_two_scrapes() -> None:
    first = exporter_scrape._parse(_page(0, power_cap=0, thermal_seconds=100.0, xid=None), "h:9400", 0.0)
    second = exporter_scrape._parse(_page(10, power_cap=1, thermal_seconds=106.0, xid="94"), "h:9400", 10.0)
    fleet = Fleet("exporters", "10s", 10.0)
    exporter_scrape._signals("http://h:9400/metrics", first, second, fleet)
    target = fleet.targets[TargetKey(V.ENGINE_VLLM, "m", "h:9400")]
    got = {s: o.value for s, o in target.values.items()}
    assert got[Signal.GPU_COUNT] == 2
    assert got[Signal.GPU_ENGINE_ACTIVE] == pytest.approx(0.15)  # the mean of 0.2 and 0.1
    assert got[Signal.GPU_SM_CLOCK] == 1200  # the slowest GPU, in MHz
    assert got[Signal.GPU_POWER_SHARE] == 0.5
    assert got[Signal.GPU_THROTTLED_SHARE] == pytest.approx(0.6)  # GPU 1: 6 s of thermal in 10 s
    assert got[Signal.GPU_XID_CRITICAL] == 1 and got[Signal.GPU_XID_OTHER] == 0
    assert {(r.gpu, r.what, r.value) for r in target.gpus.clock_events if r.value} == {
        ("GPU 0 (GPU-aaaa) on node-1", V.GPU_CLOCK_POWER_CAP, 0.5)  # held in one of the two scrapes
    }
    result = diagnose(fleet, PROFILES)
    found = {f.symptom: f for f in result.findings}
    assert found[Symptom.GPU_THROTTLED].severity is Status.CRITICAL
    assert (
        "GPU 1 (GPU-bbbb) on node-1 throttled by thermal (throttle time) 60.0%" in found[Symptom.GPU_THROTTLED].summary
    )
    assert found[Symptom.GPU_ERRORS].severity is Status.CRITICAL and "XID 94" in found[Symptom.GPU_ERRORS].summary
    assert found[Symptom.THROUGHPUT_LOW].likely_cause is Cause.GPU_THROTTLED


def test_exporter_mode_without_gpu_series_is_as_before() -> None:
    page = "\n".join(_page(0, power_cap=0, thermal_seconds=0, xid=None).splitlines()[:6]) + "\n"
    first, second = (exporter_scrape._parse(page, "h:9400", at) for at in (0.0, 5.0))
    fleet = Fleet("exporters", "5s", 5.0)
    exporter_scrape._signals("http://h:9400/metrics", first, second, fleet)
    (target,) = fleet.targets.values()
    assert not any(s.value.startswith("gpu_") for s in target.values)
    (status,) = diagnose(fleet, PROFILES).targets
    assert status.reasons[Symptom.GPU_THROTTLED] == dcgm.NO_GPU


# -- the checklist ------------------------------------------------------------------------------------------
def _gpu_check(fleet: Fleet) -> tuple[Verdict, list[str]]:
    (target,) = fleet.targets.values()
    item = next(i for i in checklist(target, PROFILES[V.ENGINE_VLLM]).items if i.check is Check.GPU_HEALTHY)
    return item.verdict, item.evidence


def test_the_checklist_asks_about_the_gpus() -> None:
    verdict, evidence = _gpu_check(fleet_with(SATURATED))
    assert verdict is Verdict.PASS and "no critical XID" in evidence[0]
    verdict, evidence = _gpu_check(fleet_with(SATURATED, events=POWER_CAPPED))
    assert verdict is Verdict.FAIL and "throttled (power_cap) 100%" in evidence[0]
    verdict, evidence = _gpu_check(fleet_with(SATURATED, xids=[(GPU1, "48")]))
    assert verdict is Verdict.FAIL and "XID 48 (double-bit ECC error" in evidence[0]
    verdict, evidence = _gpu_check(fleet_with(SATURATED, events=()))
    assert verdict is Verdict.UNKNOWN and evidence == [dcgm.CANNOT_TELL_THROTTLE]
    verdict, evidence = _gpu_check(fleet_with(HEALTHY))
    assert verdict is Verdict.UNKNOWN and evidence == [dcgm.NO_GPU]


def test_docs_cover_every_gpu_family_cause_and_finding() -> None:
    from inferwatch.core.knowledge import cause_table
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "gpu.md").read_text()
    for spec in V.GPU_METRICS:
        assert f"`{spec.name}" in text, spec.name
    for row in cause_table():
        assert f"`{row[1]}`" in text, row
    for symptom in (Symptom.GPU_THROTTLED, Symptom.GPU_ERRORS):
        assert f"### `{symptom.value}`" in text
    assert "## Joining a GPU to its replica" in text


def test_a_gpu_is_named_by_its_labels_cut_to_a_bound() -> None:
    from inferwatch.collector.diagnosis.signals import LABEL_MAX, gpu_name

    labels = {V.LABEL_GPU: "3", V.LABEL_GPU_UUID: "GPU-" + "x" * 500, V.LABEL_HOST: "node-1"}
    name = gpu_name(labels)
    assert name.startswith("GPU 3 (GPU-xxx") and name.endswith("…) on node-1")
    assert len(name) < LABEL_MAX + 30
    assert gpu_name({}) == "GPU"
