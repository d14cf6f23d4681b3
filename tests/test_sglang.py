"""SGLang value semantics on the fixtures written from its source (three releases' layouts, P/D, DP)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import sglang as sg
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.samples import Snapshot
from inferwatch.exporters.textparse import parse
from tests.conftest import ENGINE_FIXTURES

HERE = ENGINE_FIXTURES / "sglang"
NEW = HERE / "44cedc2"
OLD = HERE / "93d0487"
CURRENT = HERE / "0.5.23"
CURRENT_FRESH = HERE / "0.5.23-fresh"
PD = HERE / "44cedc2-pd"
DP = HERE / "44cedc2-dp2-all-schedulers"
FRESH = (HERE / "44cedc2-fresh", HERE / "93d0487-fresh")
LOADED = (NEW, OLD, CURRENT)


def facts(directory: Path, payload: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = yaml.safe_load((directory / "fixture.yaml").read_text())
    found: dict[str, Any] = meta["facts"][payload] if payload else meta["facts"]
    return found


def translate_payload(text: str) -> Snapshot:
    return translate_text(sg.ADAPTER, text, TranslateContext(engine=V.ENGINE_SGLANG))


def translate(path: Path) -> Snapshot:
    return translate_payload(path.read_text())


def raw_sum(path: Path, sample: str) -> float:
    return sum(v for _, v in parse(path.read_text(), {sample}).get(sample))


@pytest.mark.parametrize("directory", LOADED, ids=[d.name for d in LOADED])
def test_loaded_server_matches_its_facts(directory: Path) -> None:
    f = facts(directory)
    snap = translate(directory / "metrics.txt")
    model = {V.LABEL_MODEL: f["model"]}
    assert snap.value(V.PROMPT_TOKENS, **model) == f["prompt_tokens"]
    assert snap.value(V.GENERATION_TOKENS) == f["generation_tokens"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == f["requests_finished"]
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_ABORT) == f["requests_aborted"]
    assert snap.value(V.PREFIX_CACHE_HIT_TOKENS) == f["cached_tokens"]
    assert snap.value(V.PREFIX_CACHE_QUERIED_TOKENS) == f["prompt_tokens"]
    assert snap.value(V.REQUESTS_RUNNING) == f["running"]
    assert snap.value(V.REQUESTS_WAITING) == f["waiting"]
    assert snap.value(V.KV_CACHE_USAGE) == pytest.approx(f["used_tokens"] / f["kv_capacity_tokens"])
    assert snap.value(V.KV_CACHE_CAPACITY) == f["kv_capacity_tokens"]
    ttft = snap.histogram(V.TIME_TO_FIRST_TOKEN)
    assert ttft is not None and ttft.inf == f["ttft_count"] and ttft.total == pytest.approx(f["ttft_sum"])
    e2e = snap.histogram(V.REQUEST_DURATION)
    assert e2e is not None and e2e.inf == f["requests_finished"] and e2e.total == pytest.approx(f["e2e_sum"])
    queue = snap.histogram(V.REQUEST_QUEUE)
    assert queue is not None and queue.inf == f["requests_finished"] and queue.total == pytest.approx(f["queue_sum"])
    # inter-token latency: the count is output tokens after the first, the sum the decode time
    itl = snap.histogram(V.INTER_TOKEN_LATENCY)
    assert itl is not None and itl.inf == f["itl_tokens"]
    assert itl.total == pytest.approx(f["e2e_sum"] - f["ttft_sum"])
    prompts = snap.histogram(V.REQUEST_PROMPT_TOKENS)
    assert prompts is not None and prompts.total == f["prompt_tokens"]


@pytest.mark.parametrize("directory", [NEW, CURRENT], ids=["44cedc2", "0.5.23"])
def test_facts_are_the_payloads_own(directory: Path) -> None:
    """The ground truth is re-derived from the raw payload, through the adapter's own names."""
    f = facts(directory)
    path = directory / "metrics.txt"
    assert raw_sum(path, sg.PROMPT_TOTAL) == f["prompt_tokens"]
    assert raw_sum(path, sg.CACHED_TOTAL) == f["cached_tokens"]
    assert raw_sum(path, sg.REQUESTS_TOTAL) == f["requests_finished"]
    assert raw_sum(path, sg.RETRACTED_TOTAL) == f["retractions"]
    assert raw_sum(path, f"{sg.INTER_TOKEN}_count") == f["itl_tokens"]
    # every TP rank of 0.5.23 emits the start-up constants: the raw page holds the capacity once per rank
    ranks = 2 if directory is CURRENT else 1
    assert raw_sum(path, sg.MAX_TOTAL_TOKENS) == ranks * f["kv_capacity_tokens"]


def test_current_release_splits_requests_by_streaming() -> None:
    """0.5.23 labels the request counters, TTFT, TPOT and e2e with is_streaming; each request is in one."""
    f = facts(CURRENT)
    text = (CURRENT / "metrics.txt").read_text()
    series = parse(text, {sg.REQUESTS_TOTAL}).get(sg.REQUESTS_TOTAL)
    by_stream = {dict(labels)["is_streaming"]: value for labels, value in series}
    assert by_stream == {"true": f["streamed_requests"], "false": f["requests_finished"] - f["streamed_requests"]}
    snap = translate(CURRENT / "metrics.txt")
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == f["requests_finished"]
    assert all("is_streaming" not in dict(k) for s in snap.histograms.values() for k in s)


@pytest.mark.parametrize("older", [OLD, CURRENT], ids=["93d0487", "0.5.23"])
def test_layouts_give_the_same_canonical_answers(older: Path) -> None:
    """The same scenario through each release's names, labels and buckets: one canonical answer."""
    new, other = translate(NEW / "metrics.txt"), translate(older / "metrics.txt")
    shared = (new.metrics() & other.metrics()) - {V.PREEMPTIONS}
    assert V.REQUESTS_RUNNING in shared and V.KV_CACHE_CAPACITY in shared and V.TIME_TO_FIRST_TOKEN in shared
    for metric in shared:
        if metric.kind is V.Kind.HISTOGRAM:
            a, b = new.histogram(metric), other.histogram(metric)
            assert a is not None and b is not None
            assert a.inf == b.inf and a.total == pytest.approx(b.total), metric.name
            if metric is not V.REQUEST_QUEUE:  # 0.5.23 has finer queue-time buckets below 1 s
                assert a.counts == b.counts, metric.name
        else:
            assert new.value(metric) == pytest.approx(other.value(metric)), metric.name


def test_time_per_output_token_from_the_current_release_only() -> None:
    """0.5.22 added a per-request TPOT histogram: mapped where it exists, absent (never 0) before."""
    f = facts(CURRENT)
    tpot = translate(CURRENT / "metrics.txt").histogram(V.TIME_PER_OUTPUT_TOKEN)
    assert tpot is not None and tpot.inf == f["tpot_count"] and tpot.total == pytest.approx(f["tpot_sum"])
    # the decode time per token: the inter-token sum spread over the same requests' later tokens
    assert f["tpot_count"] == f["requests_finished"]
    for older in (NEW, OLD):
        assert V.TIME_PER_OUTPUT_TOKEN not in translate(older / "metrics.txt").metrics()
    assert V.TIME_PER_OUTPUT_TOKEN.key not in sg.ADAPTER.unsupported


def test_retractions_are_preemptions_and_absent_where_not_counted() -> None:
    assert translate(NEW / "metrics.txt").value(V.PREEMPTIONS) == facts(NEW)["retractions"]
    # the older layout has only a per-interval gauge: absent, never a made-up 0
    old = translate(OLD / "metrics.txt")
    assert V.PREEMPTIONS not in old.metrics()
    assert V.PREEMPTIONS.key not in sg.ADAPTER.unsupported


def test_older_capacity_is_derived_from_usage_and_says_so() -> None:
    snap = translate(OLD / "metrics.txt")
    assert snap.value(V.KV_CACHE_CAPACITY) == facts(OLD)["kv_capacity_tokens"]
    assert V.KV_CACHE_CAPACITY in snap.notes
    assert V.KV_CACHE_CAPACITY not in translate(NEW / "metrics.txt").notes


def test_a_zero_capacity_is_no_capacity() -> None:
    """max_total_num_tokens is 0 in the stats until the pool is sized: no capacity, not 0 tokens."""
    text = (NEW / "metrics.txt").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(sg.MAX_TOTAL_TOKENS + "{"))
    snap = translate_payload(text.replace(line, line.rsplit(" ", 1)[0] + " 0.0"))
    assert V.KV_CACHE_CAPACITY not in snap.metrics()
    assert V.KV_CACHE_USAGE in snap.metrics()


def test_rank_copies_are_counted_once() -> None:
    """--enable-metrics-for-all-schedulers: two TP ranks per DP group report the same batch."""
    path = DP / "metrics.txt"
    f = facts(DP)
    snap = translate(path)
    for rank in ("0", "1"):
        assert snap.value(V.REQUESTS_RUNNING, dp_rank=rank) == f["running"][rank]
        assert snap.value(V.REQUESTS_WAITING, dp_rank=rank) == f["waiting"][rank]
        assert snap.value(V.KV_CACHE_CAPACITY, dp_rank=rank) == f["kv_capacity_tokens"]
        assert snap.value(V.KV_CACHE_USAGE, dp_rank=rank) == pytest.approx(
            f["used_tokens"][rank] / f["kv_capacity_tokens"]
        )
        assert snap.value(V.LORA_ADAPTERS_MAX, dp_rank=rank) == f["lora_slots_total"]
    # the payload does hold every batch twice (so the dedup is what makes the numbers right)
    assert raw_sum(path, sg.RUNNING) == 2 * sum(f["running"].values())
    queue = snap.histogram(V.REQUEST_QUEUE)
    assert queue is not None and queue.inf == f["requests_finished"]
    assert raw_sum(path, f"{sg.QUEUE_TIME}_count") == 2 * f["requests_finished"]
    assert snap.value(V.PREEMPTIONS) == f["retractions"]
    # tokenizer series have no ranks: one tokenizer counts every request once
    assert snap.value(V.PROMPT_TOKENS) == f["prompt_tokens"]


def test_pipeline_stages_and_unknown_rank_values_keep_one_copy() -> None:
    text = (NEW / "metrics.txt").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(sg.RUNNING + "{"))
    copy = line.replace('pp_rank="0"', 'pp_rank="1"').rsplit(" ", 1)[0] + " 99.0"
    snap = translate_payload(text.replace(line, f"{line}\n{copy}"))
    assert snap.value(V.REQUESTS_RUNNING) == facts(NEW)["running"]


def test_prefill_and_decode_instances_split_by_role() -> None:
    prefill, decode = translate(PD / "prefill.txt"), translate(PD / "decode.txt")
    for snap, role, payload in ((prefill, V.ROLE_PREFILL, "prefill.txt"), (decode, V.ROLE_DECODE, "decode.txt")):
        f = facts(PD, payload)
        assert roles(snap) == {role}
        assert snap.value(V.REQUESTS_RUNNING, role=role) == f["running"]
        assert snap.value(V.REQUESTS_WAITING, role=role) == f["waiting"]
        assert snap.value(V.KV_CACHE_CAPACITY, role=role) == f["kv_capacity_tokens"]
    assert V.PREEMPTIONS not in prefill.metrics()
    assert decode.value(V.PREEMPTIONS, role=V.ROLE_DECODE) == facts(PD, "decode.txt")["retractions"]


def roles(snap: Snapshot) -> set[str | None]:
    found = {dict(k).get(V.LABEL_ROLE) for series in snap.values.values() for k in series}
    return found | {dict(k).get(V.LABEL_ROLE) for series in snap.histograms.values() for k in series}


def test_tokenizer_series_without_engine_type_take_the_servers_role() -> None:
    """Up to 0.5.10 the tokenizer series carry no engine_type: they get the scheduler series' role."""
    assert roles(translate(OLD / "metrics.txt")) == {V.ROLE_UNIFIED}
    text = (PD / "prefill.txt").read_text()
    tokenizer = (sg.PROMPT_TOTAL, sg.REQUESTS_TOTAL, sg.TTFT, sg.E2E, sg.INTER_TOKEN)
    lines = [
        ln.replace(',engine_type="prefill"', "").replace('engine_type="prefill",', "")
        if ln.startswith(tokenizer)
        else ln
        for ln in text.splitlines()
    ]
    stripped = "\n".join(lines) + "\n"
    assert sum(ln.startswith(tokenizer) and "engine_type" not in ln for ln in lines) > 20
    snap = translate_payload(stripped)
    assert roles(snap) == {V.ROLE_PREFILL}
    f = facts(PD, "prefill.txt")
    assert snap.value(V.PROMPT_TOKENS, role=V.ROLE_PREFILL) == f["prompt_tokens"]
    ttft = snap.histogram(V.TIME_TO_FIRST_TOKEN, role=V.ROLE_PREFILL)
    assert ttft is not None and ttft.inf == f["ttft_count"]


def test_is_streaming_is_summed_away() -> None:
    text = (NEW / "metrics.txt").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(sg.REQUESTS_TOTAL + "{"))
    streaming = line.replace("{", '{is_streaming="true",').rsplit(" ", 1)[0] + " 5.0"
    batch = line.replace("{", '{is_streaming="false",')
    snap = translate_payload(text.replace(line, f"{batch}\n{streaming}"))
    assert snap.value(V.REQUESTS, outcome=V.OUTCOME_STOP) == facts(NEW)["requests_finished"] + 5
    assert all("is_streaming" not in dict(k) for k in snap.values[V.REQUESTS])


@pytest.mark.parametrize("directory", FRESH, ids=[d.name for d in FRESH])
def test_fresh_server_has_no_made_up_zeros(directory: Path, registry: EngineRegistry) -> None:
    text = (directory / "metrics.txt").read_text()
    assert text == ""
    assert translate_payload(text).metrics() == set()
    assert registry.detect(text) is None


def test_current_release_is_not_empty_before_the_first_request(registry: EngineRegistry) -> None:
    """0.5.23 emits its start-up constants at once and its idle stats after 30 s: real zeros, and a capacity."""
    f = facts(CURRENT_FRESH)
    text = (CURRENT_FRESH / "metrics.txt").read_text()
    adapter = registry.detect(text)
    assert adapter is not None and adapter.name == V.ENGINE_SGLANG
    snap = translate_payload(text)
    assert snap.metrics() == {V.REQUESTS_RUNNING, V.REQUESTS_WAITING, V.KV_CACHE_USAGE, V.KV_CACHE_CAPACITY}
    assert snap.value(V.REQUESTS_RUNNING) == f["running"] == 0
    assert snap.value(V.REQUESTS_WAITING) == f["waiting"] == 0
    assert snap.value(V.KV_CACHE_USAGE) == 0
    assert snap.value(V.KV_CACHE_CAPACITY, model=f["model"], role=V.ROLE_UNIFIED) == f["kv_capacity_tokens"]
    assert snap.unmapped == []


def test_priority_breakdowns_are_not_added_to_the_total() -> None:
    """--enable-priority-scheduling: the queue gauges hold the total under priority="" plus one series per
    priority; only the total is read."""
    text = (CURRENT / "metrics.txt").read_text()
    for name in (sg.RUNNING, sg.QUEUED):
        line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
        total = line.replace("{", '{priority="",')
        high = line.replace("{", '{priority="1",').rsplit(" ", 1)[0] + " 2.0"
        text = text.replace(line, f"{total}\n{high}")
    snap = translate_payload(text)
    assert snap.value(V.REQUESTS_RUNNING) == facts(CURRENT)["running"]
    assert snap.value(V.REQUESTS_WAITING) == facts(CURRENT)["waiting"]


@pytest.mark.parametrize("directory", [FRESH[0], CURRENT_FRESH], ids=["0.5.9", "0.5.23"])
def test_model_info_names_the_engine_and_model(directory: Path, registry: EngineRegistry) -> None:
    """GET /model_info: SGLang's body is claimed and gives the model the series name; others' are not."""
    meta: dict[str, Any] = yaml.safe_load((directory / "fixture.yaml").read_text())
    body = json.loads((directory / meta["info"]).read_text())
    assert sg.claims_info(body)
    assert sg.parse_info(body).model == meta["facts"]["model"]
    pages = {sg.MODEL_INFO_PATH: json.dumps(body)}

    def get(path: str, *, allow_404: bool = False) -> str:
        return pages.get(path, "")

    adapter = registry.detect_empty(get)
    assert adapter is not None and adapter.name == V.ENGINE_SGLANG
    for other in ("tgi/3.3.7/info.json", "llamacpp/001d906/props.json", "llamacpp/001d906/models.json"):
        assert not sg.claims_info(json.loads((ENGINE_FIXTURES / other).read_text())), other
    assert sg.parse_info(["not", "a", "dict"]).model is None


def test_detection_picks_sglang(registry: EngineRegistry) -> None:
    payloads = [d / "metrics.txt" for d in (NEW, OLD, DP, CURRENT, CURRENT_FRESH)] + [
        PD / "prefill.txt",
        PD / "decode.txt",
    ]
    for path in payloads:
        adapter = registry.detect(path.read_text())
        assert adapter is not None and adapter.name == V.ENGINE_SGLANG, path
    for other in ("vllm/0.32.0-cpu/metrics-final.txt", "tgi/3.3.7/metrics.txt"):
        adapter = registry.detect((ENGINE_FIXTURES / other).read_text())
        assert adapter is not None and adapter.name != V.ENGINE_SGLANG, other


def test_every_known_family_is_mapped_or_ignored() -> None:
    paths = (NEW / "metrics.txt", OLD / "metrics.txt", DP / "metrics.txt", PD / "prefill.txt", CURRENT / "metrics.txt")
    for path in paths:
        assert translate(path).unmapped == [], path
