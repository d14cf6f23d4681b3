"""The demo's live view fits 80 columns with six engines at their widest values, nothing cut short.

The demo test (test_sim_cli) runs the real pipeline, where the values depend on the load of the moment:
once the fleet grew to six engines, a run whose vLLM showed 100 % KV cut its diagnosis to "preemptio…".
Here every column holds its widest plausible value at once.
"""

from __future__ import annotations

from rich.console import Console

from inferwatch.core import vocabulary as V
from inferwatch.core.quantile import Scrape
from inferwatch.demo_view import Insight, Member, model_of, view

WIDEST_SYMPTOMS = ("latency_p99_high", "preemptions", "throughput_low", "gpu_throttled", "tpot_slow", "error_rate_high")


def _scrape(at: float, requests: float, preemptions: float, slow: bool) -> Scrape:
    """An exporter scrape: counters at ``requests``, TTFT and TPOT in their top buckets, a full queue."""
    top_ttft, top_tpot = max(V.TIME_TO_FIRST_TOKEN.buckets), max(V.TIME_PER_OUTPUT_TOKEN.buckets)
    buckets = {
        V.TIME_TO_FIRST_TOKEN.name: {**{le: 0.0 for le in V.TIME_TO_FIRST_TOKEN.buckets}, float("inf"): requests},
        V.TIME_PER_OUTPUT_TOKEN.name: {
            le: (requests if le >= top_tpot / 2 else 0.0) for le in V.TIME_PER_OUTPUT_TOKEN.buckets
        }
        | {float("inf"): requests},
    }
    if not slow:
        buckets[V.TIME_TO_FIRST_TOKEN.name] = {
            le: requests for le in V.TIME_TO_FIRST_TOKEN.buckets if le >= top_ttft / 8
        }
        buckets[V.TIME_TO_FIRST_TOKEN.name][float("inf")] = requests
    values = {
        V.REQUESTS.name: requests,
        V.PREEMPTIONS.name: preemptions,
        V.REQUESTS_RUNNING.name: 124.0,
        V.REQUESTS_WAITING.name: 12_345.0,
    }
    gauges = {V.KV_CACHE_USAGE.name: 1.0, V.GPU_UTILIZATION.name: 1.0}
    return Scrape(at=at, values=values, buckets=buckets, gauges_max=gauges, up=1.0)


def test_six_engines_at_their_widest_fit_80_columns_without_cutting_a_cell() -> None:
    members = []
    for i, engine in enumerate(V.ENGINES):
        m = Member(engine, 8000 + i, 9000 + i)
        m.history.extend([_scrape(0.0, 0.0, 0.0, i % 2 == 0), _scrape(10.0, 1234.0, 123.0, i % 2 == 0)])
        members.append(m)
    insight = Insight()
    insight.exact_p99 = {engine: 123.4 for engine in V.ENGINES}
    insight.exact_at_proxy = {V.ENGINE_LLAMACPP}
    insight.diagnosis = {
        engine: ("critical", WIDEST_SYMPTOMS[i % len(WIDEST_SYMPTOMS)]) for i, engine in enumerate(V.ENGINES)
    }
    insight.burn = {model_of(engine): 1444.4 for engine in V.ENGINES}
    console = Console(width=80, record=True, color_system=None)
    console.print(view(members, "inferwatch demo - last 30 s", insight, 80))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    rows = [line for line in lines if line.split() and line.split()[0] in V.ENGINES]
    assert len(rows) == len(V.ENGINES), text
    assert not any("…" in row for row in rows), text  # no cell cut short
    assert all(line.count("100%") == 2 for line in rows), text  # KV and GPU
    for word in ("preemptions", "queue backlog", "GPU throttled", "124/12k", "100%", "1.4kx", ">10.0s", "123s*"):
        assert word in text, (word, text)
