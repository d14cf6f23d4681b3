"""The symptom catalogue's thresholds and gates against what docs/diagnostics.md documents, and how a
threshold grades a value (``mutation/symptoms.toml``). The expected figures are copied by hand from the
documentation's "Detected when" paragraphs, not read from the code."""

from __future__ import annotations

import dataclasses

import pytest

from inferwatch.core.symptoms import CATALOGUE, Gate, Signal, Status, Symptom, Threshold, Thresholds, catalogue

# docs/diagnostics.md, "Detected when": symptom -> (signal, warning above, critical above)
DOCUMENTED_THRESHOLDS: dict[Symptom, tuple[Signal, float, float]] = {
    Symptom.PREEMPTIONS: (Signal.PREEMPTIONS_PER_REQUEST, 0.0, 0.05),  # any preemption; 5 % per request
    Symptom.LATENCY_P99_HIGH: (Signal.QUEUE_P99, 1.0, 5.0),  # 1 s; 5 s
    Symptom.THROUGHPUT_LOW: (Signal.KV_USAGE, 0.90, 0.98),  # 90 %; 98 %
    Symptom.TTFT_SLOW: (Signal.TTFT_P99, 0.5, 1.0),  # default 0.5 s; 1 s
    Symptom.TPOT_SLOW: (Signal.TPOT_P99, 0.1, 0.2),  # default 0.1 s; 0.2 s
    Symptom.ERROR_RATE_HIGH: (Signal.ERROR_RATIO, 0.01, 0.05),  # 1 %; 5 %
    Symptom.STREAMS_ABORTED: (Signal.ABORT_RATIO, 0.05, 0.20),  # 5 %; 20 %
    Symptom.GPU_THROTTLED: (Signal.GPU_THROTTLED_SHARE, 0.10, 0.50),  # 10 % of the window; half of it
    Symptom.GPU_ERRORS: (Signal.GPU_XID_CRITICAL, 0.0, 0.0),  # any code on the critical list is critical
}

# docs/diagnostics.md, the "while ..." of each "Detected when": symptom -> (signal, above, below)
DOCUMENTED_GATES: dict[Symptom, list[tuple[Signal, float | None, float | None]]] = {
    Symptom.PREEMPTIONS: [(Signal.PREEMPTION_RATE, 0.0, None)],  # the preemption rate is above zero
    Symptom.LATENCY_P99_HIGH: [(Signal.WAITING, 0.5, None)],  # mean waiting > 0.5
    Symptom.THROUGHPUT_LOW: [(Signal.WAITING, 0.5, None)],  # while requests wait
    Symptom.TTFT_SLOW: [(Signal.TTFT_QUEUE_SHARE, None, 0.5)],  # queue time / TTFT < 0.5
    Symptom.TPOT_SLOW: [(Signal.PREFILL_DECODE_RATIO, None, 10.0)],  # fewer than 10 prompt tokens per token
    Symptom.ERROR_RATE_HIGH: [(Signal.REQUEST_RATE, 0.0, None)],  # a share of finished requests
    Symptom.STREAMS_ABORTED: [(Signal.REQUEST_RATE, 0.0, None)],
    Symptom.GPU_THROTTLED: [],
    Symptom.GPU_ERRORS: [],
}


def test_every_symptom_is_documented_here() -> None:
    assert set(catalogue()) == set(DOCUMENTED_THRESHOLDS) == set(DOCUMENTED_GATES)
    assert len(CATALOGUE) == len(DOCUMENTED_THRESHOLDS)


@pytest.mark.parametrize("symptom", list(DOCUMENTED_THRESHOLDS))
def test_catalogue_thresholds_are_the_documented_ones(symptom: Symptom) -> None:
    signal, warning, critical = DOCUMENTED_THRESHOLDS[symptom]
    threshold = catalogue()[symptom].threshold
    assert threshold.signal is signal
    assert threshold.warning == pytest.approx(warning, abs=1e-12)
    assert threshold.critical == pytest.approx(critical, abs=1e-12)


@pytest.mark.parametrize("symptom", list(DOCUMENTED_GATES))
def test_catalogue_gates_are_the_documented_ones(symptom: Symptom) -> None:
    gates: tuple[Gate, ...] = catalogue()[symptom].gates
    assert [(g.signal, g.above, g.below) for g in gates] == DOCUMENTED_GATES[symptom]
    assert all(g.of is None for g in gates)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, Status.OK),
        (1.0, Status.OK),  # at the warning threshold: not above it
        (1.5, Status.WARNING),
        (5.0, Status.WARNING),  # at the critical threshold: not above it
        (5.5, Status.CRITICAL),
    ],
)
def test_a_threshold_grades_strictly_above(value: float, expected: Status) -> None:
    assert Threshold(Signal.QUEUE_P99, 1.0, 5.0).status(value) is expected


def test_critical_wins_over_warning() -> None:
    # critical below warning (an override may do that): above both is critical, between them critical too
    t = Threshold(Signal.QUEUE_P99, 5.0, 1.0)
    assert t.status(6.0) is Status.CRITICAL
    assert t.status(2.0) is Status.CRITICAL
    assert t.status(1.0) is Status.OK


def test_zero_thresholds_report_any_occurrence() -> None:
    t = DOCUMENTED_THRESHOLDS[Symptom.PREEMPTIONS]
    threshold = Threshold(*t)
    assert threshold.status(0.0) is Status.OK
    assert threshold.status(0.01) is Status.WARNING
    assert threshold.status(0.06) is Status.CRITICAL


def test_overrides_replace_both_levels_and_keep_the_signal() -> None:
    spec = catalogue()[Symptom.TPOT_SLOW]
    assert Thresholds().for_symptom(spec) is spec.threshold
    t = Thresholds({Symptom.TPOT_SLOW: (0.25, 0.75)}).for_symptom(spec)
    assert (t.signal, t.warning, t.critical) == (Signal.TPOT_P99, 0.25, 0.75)
    other = catalogue()[Symptom.TTFT_SLOW]
    assert Thresholds({Symptom.TPOT_SLOW: (0.25, 0.75)}).for_symptom(other) is other.threshold


def test_thresholds_are_values() -> None:
    # frozen: a threshold shared by the catalogue (and its overrides) cannot be changed by one user of it
    t = Threshold(Signal.QUEUE_P99, 1.0, 5.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.warning = 2.0  # type: ignore[misc]
    assert {t, Threshold(Signal.QUEUE_P99, 1.0, 5.0)} == {t}
    overrides = Thresholds({Symptom.TPOT_SLOW: (0.25, 0.75)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        overrides.overrides = {}  # type: ignore[misc]
    assert overrides == Thresholds({Symptom.TPOT_SLOW: (0.25, 0.75)})
