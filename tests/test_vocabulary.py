"""The canonical vocabulary's layouts and rendering rules."""

from __future__ import annotations

import pytest

from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError, InferwatchSettings


def test_otel_layouts() -> None:
    assert V.TIME_TO_FIRST_TOKEN.buckets[0] == 0.001 and V.TIME_TO_FIRST_TOKEN.buckets[-1] == 10.0
    assert V.TIME_PER_OUTPUT_TOKEN.buckets[0] == 0.01 and V.TIME_PER_OUTPUT_TOKEN.buckets[-1] == 2.5
    assert V.Vocabulary().le_strings(V.REQUEST_DURATION) == (
        "0.01",
        "0.02",
        "0.04",
        "0.08",
        "0.16",
        "0.32",
        "0.64",
        "1.28",
        "2.56",
        "5.12",
        "10.24",
        "20.48",
        "40.96",
        "81.92",
        "+Inf",
    )
    assert V.TIME_TO_FIRST_TOKEN.otel_name == "gen_ai.server.time_to_first_token"


def test_every_histogram_has_a_layout_and_unique_names() -> None:
    names = [m.name for m in V.ALL_METRICS]
    assert len(names) == len(set(names))
    assert len({m.key for m in V.ALL_METRICS}) == len(names)
    for m in V.HISTOGRAMS:
        assert list(m.buckets) == sorted(set(m.buckets))
    for m in V.ALL_METRICS:
        if m.kind is V.Kind.COUNTER:
            assert m.name.endswith("_total")


@pytest.mark.parametrize(("bound", "text"), [(1, "1.0"), (0.5, "0.5"), (81.92, "81.92"), (float("inf"), "+Inf")])
def test_format_le(bound: float, text: str) -> None:
    assert V.format_le(bound) == text


def test_slo_thresholds_become_boundaries() -> None:
    vocab = InferwatchSettings(slo_thresholds={"time_to_first_token": [0.3]}).vocabulary()
    assert "0.3" in vocab.le_strings(V.TIME_TO_FIRST_TOKEN)
    assert "0.3" not in V.Vocabulary().le_strings(V.TIME_TO_FIRST_TOKEN)
    with pytest.raises(ConfigError, match="unknown canonical metric"):
        InferwatchSettings(slo_thresholds={"ttft": [0.3]}).vocabulary()
    with pytest.raises(ValueError, match="not a histogram"):
        V.Vocabulary().with_boundaries(V.REQUESTS_RUNNING, [1.0])
    with pytest.raises(ValueError, match="positive"):
        V.Vocabulary().with_boundaries(V.TIME_TO_FIRST_TOKEN, [-1.0])
