"""llama.cpp server: values against the facts of each shape's fixture (before the move to tools/, before
and after the metrics rework, and a real b11312 server captured loaded, fresh and final, whose facts are
the clients' own sums), families translated by meaning, the model from /props, detection, fresh servers,
and absence where the engine has nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import llamacpp as engine
from inferwatch.exporters.mapping import TranslateContext
from inferwatch.exporters.samples import Snapshot
from inferwatch.exporters.textparse import parse
from tests.conftest import ENGINE_FIXTURES

ROOT = ENGINE_FIXTURES / V.ENGINE_LLAMACPP
CLASSIC_KV = ROOT / "61e588a"
CLASSIC = ROOT / "aa6192d"
CLASSIC_FRESH = ROOT / "aa6192d-fresh"
REWORK = ROOT / "001d906"
REWORK_FRESH = ROOT / "001d906-fresh"
CAPTURE = ROOT / "b11312-cpu"
CAPTURE_PAGES = {"loaded": "metrics.txt", "fresh": "metrics-fresh.txt", "final": "metrics-final.txt"}
LOADED = (CLASSIC_KV, CLASSIC, REWORK)
ALL = (CLASSIC_KV, CLASSIC, CLASSIC_FRESH, REWORK, REWORK_FRESH)


def facts(d: Path) -> dict[str, Any]:
    meta: dict[str, Any] = yaml.safe_load((d / "fixture.yaml").read_text())
    return dict(meta["facts"])


def capture_facts(stage: str) -> dict[str, Any]:
    """The capture's facts for one of its pages: the top level for the loaded page, else its sub-block."""
    f = facts(CAPTURE)
    return f if stage == "loaded" else dict(f[stage])


def translate(d: Path, text: str | None = None) -> Snapshot:
    ctx = TranslateContext(engine=V.ENGINE_LLAMACPP)
    ctx.facts = engine.parse_info(json.loads((d / "props.json").read_text()))
    payload = (d / "metrics.txt").read_text() if text is None else text
    return engine.ADAPTER.open().translate(payload, ctx)


def raw(d: Path, name: str) -> float:
    """A sample of the fixture payload as the engine printed it."""
    ((_, value),) = parse((d / "metrics.txt").read_text(), {name}).samples[name]
    return value


@pytest.mark.parametrize("d", ALL, ids=lambda d: d.name)
def test_detected_and_every_family_known(d: Path, registry: EngineRegistry) -> None:
    assert registry.detect((d / "metrics.txt").read_text()) is engine.ADAPTER
    snap = translate(d)
    assert snap.unmapped == []
    assert len(parse((d / "metrics.txt").read_text(), set()).families) == facts(d)["family_count"]


@pytest.mark.parametrize("d", LOADED, ids=lambda d: d.name)
def test_tokens_slots_and_decode_time(d: Path) -> None:
    f = facts(d)
    snap = translate(d)
    assert snap.value(V.GENERATION_TOKENS) == f["tokens_predicted"]
    assert snap.value(V.REQUESTS_RUNNING) == f["running"]
    assert snap.value(V.REQUESTS_WAITING) == f["waiting"]
    itl = snap.histogram(V.INTER_TOKEN_LATENCY)
    assert itl is not None and itl.counts is None  # sum and count only: no invented buckets
    assert itl.inf == f["tokens_predicted"]
    assert itl.total / itl.inf == pytest.approx(f["mean_seconds_per_generated_token"])
    assert V.INTER_TOKEN_LATENCY.key in builtin_profiles()[V.ENGINE_LLAMACPP].bucketless


@pytest.mark.parametrize("d", LOADED, ids=lambda d: d.name)
def test_model_build_and_slots_from_props(d: Path) -> None:
    f = facts(d)
    snap = translate(d)
    assert {dict(k)[V.LABEL_MODEL] for k in snap.values[V.GENERATION_TOKENS]} == {f["model"]}
    (key,) = snap.values[V.ENGINE_INFO]
    info = dict(key)
    assert info[V.LABEL_MODEL] == f["model"]
    assert info[V.LABEL_ENGINE_VERSION] == f["build_info"]
    assert info[V.LABEL_MAX_CONCURRENCY] == str(f["total_slots"])


def test_v1_models_names_the_model_like_props() -> None:
    models = engine.parse_info(json.loads((REWORK / "models.json").read_text()))
    props = engine.parse_info(json.loads((REWORK / "props.json").read_text()))
    assert models.model == props.model == facts(REWORK)["model"]
    # without --alias, /props and /v1/models both name the model file
    assert engine.parse_info(json.loads((CLASSIC_KV / "props.json").read_text())).model == facts(CLASSIC_KV)["model"]
    assert engine.parse_info({"model_alias": "", "model_path": "/m/x.gguf", "total_slots": 2}).model == "/m/x.gguf"
    assert engine.parse_info([]).model is None


def test_props_and_models_claimed_but_not_other_engines_info() -> None:
    for body in ("props.json", "models.json"):
        assert engine.claims_info(json.loads((REWORK / body).read_text()))
    tgi_info = json.loads((ENGINE_FIXTURES / V.ENGINE_TGI / "3.3.7" / "info.json").read_text())
    assert not engine.claims_info(tgi_info)
    assert not engine.claims_info({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]})


def test_empty_body_claimed_through_props(registry: EngineRegistry) -> None:
    props = (CLASSIC_FRESH / "props.json").read_text()
    assert registry.detect_empty(lambda path, allow_404=False: props if path == engine.PROPS_PATH else "{}") is (
        engine.ADAPTER
    )


@pytest.mark.parametrize("d", [CLASSIC_KV, CLASSIC], ids=lambda d: d.name)
def test_classic_prompt_tokens_exclude_the_cache_and_say_so(d: Path) -> None:
    snap = translate(d)
    assert snap.value(V.PROMPT_TOKENS) == facts(d)["prompt_tokens_evaluated"]
    assert "not counted" in snap.notes[V.PROMPT_TOKENS]
    # no cached-token counter in these shapes: no prefix-cache series at all, not zeros
    assert V.PREFIX_CACHE_HIT_TOKENS not in snap.metrics()
    assert V.PREFIX_CACHE_QUERIED_TOKENS not in snap.metrics()
    assert V.SPEC_DECODE_DRAFT_TOKENS not in snap.metrics()
    assert V.SPEC_DECODE_ACCEPTED_TOKENS not in snap.metrics()


def test_rework_prompt_tokens_cache_hits_and_speculation() -> None:
    f = facts(REWORK)
    snap = translate(REWORK)
    assert f["prompt_tokens_evaluated"] + f["prompt_tokens_cached"] == f["prompt_tokens_all"]
    assert snap.value(V.PROMPT_TOKENS) == f["prompt_tokens_all"]
    assert snap.value(V.PREFIX_CACHE_HIT_TOKENS) == f["prompt_tokens_cached"]
    assert snap.value(V.PREFIX_CACHE_QUERIED_TOKENS) == f["prompt_tokens_all"]
    assert snap.value(V.SPEC_DECODE_DRAFT_TOKENS) == f["spec_draft_tokens"]
    assert snap.value(V.SPEC_DECODE_ACCEPTED_TOKENS) == f["spec_accepted_tokens"]
    assert sum(f["spec_accepted_per_position"]) == f["spec_accepted_tokens"]


def test_kv_usage_only_where_the_build_exports_it() -> None:
    snap = translate(CLASSIC_KV)
    assert snap.value(V.KV_CACHE_USAGE) == facts(CLASSIC_KV)["kv_cache_usage_ratio"]
    for d in (CLASSIC, REWORK, CLASSIC_FRESH, REWORK_FRESH):
        assert V.KV_CACHE_USAGE not in translate(d).metrics()
    assert V.KV_CACHE_CAPACITY.key in engine.ADAPTER.unsupported


@pytest.mark.parametrize(
    ("d", "name", "fact"),
    [
        (CLASSIC, engine.N_TOKENS_MAX, "n_tokens_max"),
        (REWORK, engine.N_TOKENS_MAX, "n_tokens_max"),
        (CLASSIC_KV, engine.N_DECODE_TOTAL, "n_decode_total"),
    ],
    ids=lambda x: x.name if isinstance(x, Path) else str(x),
)
def test_counter_typed_families_without_a_canonical_meaning_feed_no_counter(d: Path, name: str, fact: str) -> None:
    assert raw(d, name) == facts(d)[fact]
    snap = translate(d)
    counters = [spec for spec in snap.metrics() if spec.kind is V.Kind.COUNTER]
    assert counters and all(facts(d)[fact] not in snap.values[spec].values() for spec in counters)


@pytest.mark.parametrize("d", [CLASSIC_KV, CLASSIC, REWORK], ids=lambda d: d.name)
def test_busy_slots_per_decode_is_a_ratio_whatever_its_type(d: Path) -> None:
    f = facts(d)
    ratio = raw(d, engine.N_BUSY_SLOTS_PER_DECODE)
    assert ratio == pytest.approx(f["busy_slots_total"] / f["n_decode_total"], rel=1e-5)
    kind = "gauge" if d is REWORK else "counter"
    assert f"# TYPE {engine.N_BUSY_SLOTS_PER_DECODE} {kind}" in (d / "metrics.txt").read_text()
    snap = translate(d)
    assert all(ratio not in series.values() for series in snap.values.values())


@pytest.mark.parametrize(("d", "twin"), [(CLASSIC_FRESH, CLASSIC), (REWORK_FRESH, REWORK)], ids=lambda d: d.name)
def test_fresh_server_reports_zeros_it_prints(d: Path, twin: Path) -> None:
    f = facts(d)
    snap = translate(d)
    assert snap.value(V.GENERATION_TOKENS) == 0 == f["tokens_predicted"]
    assert snap.value(V.REQUESTS_RUNNING) == 0 and snap.value(V.REQUESTS_WAITING) == 0
    itl = snap.histogram(V.INTER_TOKEN_LATENCY)
    assert itl is not None and itl.inf == 0 and itl.total == 0
    assert {dict(k)[V.LABEL_MODEL] for k in snap.values[V.GENERATION_TOKENS]} == {f["model"]}
    # a fresh server prints every family of its shape: the same canonical metrics come out, but for the
    # speculative-decoding counters, absent until the server has drafted (0 without a draft model)
    speculative = {V.SPEC_DECODE_DRAFT_TOKENS, V.SPEC_DECODE_ACCEPTED_TOKENS}
    assert not speculative & set(snap.metrics())
    assert set(snap.metrics()) == set(translate(twin).metrics()) - speculative


def test_speculative_counters_are_absent_without_a_draft_model() -> None:
    """The real b11312 server, run without a draft model, prints its speculative counters as 0: no canonical
    series (a zero would read as speculative decoding on and accepting nothing)."""
    for name in ("metrics.txt", "metrics-fresh.txt", "metrics-final.txt"):
        text = (CAPTURE / name).read_text()
        assert f"{engine.SPEC_DRAFT_TOKENS_TOTAL} 0" in text
        snap = translate(CAPTURE, text)
        assert V.SPEC_DECODE_DRAFT_TOKENS not in snap.values and V.SPEC_DECODE_ACCEPTED_TOKENS not in snap.values


def test_the_engine_lacks_what_it_does_not_print() -> None:
    unsupported = engine.ADAPTER.unsupported
    for spec in (V.TIME_TO_FIRST_TOKEN, V.TIME_PER_OUTPUT_TOKEN, V.REQUEST_DURATION, V.REQUESTS, V.PREEMPTIONS):
        assert spec.key in unsupported
    for d in ALL:
        produced = {spec.key for spec in translate(d).metrics()}
        assert not produced & set(unsupported), d.name


def test_no_labels_means_one_series_per_metric() -> None:
    snap = translate(REWORK)
    for spec, series in snap.values.items():
        assert len(series) == 1, spec.key
        (key,) = series
        assert V.LABEL_DP_RANK not in dict(key) and V.LABEL_ROLE not in dict(key)
    profile = builtin_profiles()[V.ENGINE_LLAMACPP]
    assert {V.LABEL_MODEL, V.LABEL_DP_RANK, V.LABEL_ROLE} <= set(profile.unlabelled)


def test_model_override_wins_over_props() -> None:
    ctx = TranslateContext(engine=V.ENGINE_LLAMACPP, model_override="edge-box")
    ctx.facts = engine.parse_info(json.loads((CLASSIC / "props.json").read_text()))
    snap = engine.ADAPTER.open().translate((CLASSIC / "metrics.txt").read_text(), ctx)
    assert {dict(k)[V.LABEL_MODEL] for k in snap.values[V.PROMPT_TOKENS]} == {"edge-box"}


# -- a real llama-server b11312 (0c1e570): translated values against what its clients counted -------------------
@pytest.mark.parametrize("stage", sorted(CAPTURE_PAGES))
def test_real_capture_detected_and_every_family_known(stage: str, registry: EngineRegistry) -> None:
    text = (CAPTURE / CAPTURE_PAGES[stage]).read_text()
    assert registry.detect(text) is engine.ADAPTER
    assert translate(CAPTURE, text).unmapped == []
    assert len(parse(text, set()).families) == capture_facts(stage)["family_count"] == 15


@pytest.mark.parametrize("stage", ["loaded", "final"])
def test_real_capture_values_equal_the_clients_sums(stage: str) -> None:
    f = capture_facts(stage)
    snap = translate(CAPTURE, (CAPTURE / CAPTURE_PAGES[stage]).read_text())
    assert f["prompt_tokens_evaluated"] + f["prompt_tokens_cached"] == f["prompt_tokens_all"]
    assert snap.value(V.PROMPT_TOKENS) == f["prompt_tokens_all"]  # = the usage.prompt_tokens the clients saw
    assert snap.value(V.PREFIX_CACHE_HIT_TOKENS) == f["prompt_tokens_cached"]
    assert snap.value(V.PREFIX_CACHE_QUERIED_TOKENS) == f["prompt_tokens_all"]
    assert snap.value(V.GENERATION_TOKENS) == f["tokens_predicted"]
    itl = snap.histogram(V.INTER_TOKEN_LATENCY)
    assert itl is not None and itl.counts is None and itl.inf == f["tokens_predicted"]
    assert itl.total == pytest.approx(f["predicted_ms_total"] / 1e3, rel=1e-5)  # printed to 6 digits
    assert itl.total / itl.inf == pytest.approx(f["mean_seconds_per_generated_token"], rel=1e-5)
    assert snap.value(V.REQUESTS_RUNNING) == f["running"]
    assert snap.value(V.REQUESTS_WAITING) == f["waiting"]
    # the build prints the speculative counters at 0 without a draft model: the engine's own zeros
    assert snap.value(V.SPEC_DECODE_DRAFT_TOKENS) == 0 == snap.value(V.SPEC_DECODE_ACCEPTED_TOKENS)
    top = capture_facts("loaded")
    (key,) = snap.values[V.ENGINE_INFO]
    info = dict(key)
    assert (info[V.LABEL_MODEL], info[V.LABEL_ENGINE_VERSION]) == (top["model"], top["build_info"])
    assert info[V.LABEL_MAX_CONCURRENCY] == str(top["total_slots"])


def test_real_capture_final_page_counts_nothing_it_cannot() -> None:
    f = capture_facts("final")
    snap = translate(CAPTURE, (CAPTURE / "metrics-final.txt").read_text())
    # 30 requests finished and 2 were rejected, but llama.cpp counts requests nowhere: no canonical count
    assert f["finished_requests"] == 30 and f["rejected_requests"] == 2
    assert V.REQUESTS not in snap.metrics() and V.REQUEST_DURATION not in snap.metrics()
    text = (CAPTURE / "metrics-final.txt").read_text()

    def final(name: str) -> float:
        ((_, value),) = parse(text, {name}).samples[name]
        return value

    assert final(engine.N_TOKENS_MAX) == f["n_tokens_max"] and final(engine.N_DECODE_TOTAL) == f["n_decode_total"]
    ratio = final(engine.N_BUSY_SLOTS_PER_DECODE)
    assert ratio * f["n_decode_total"] == pytest.approx(f["busy_slots_total"]) == f["tokens_predicted"]
    assert f"# TYPE {engine.N_BUSY_SLOTS_PER_DECODE} gauge" in text
    # neither the maximum nor the ratio nor the decode count feeds any canonical series
    for series in snap.values.values():
        assert not {f["n_tokens_max"], f["n_decode_total"], ratio} & set(series.values())


def test_real_capture_fresh_page_reports_the_zeros_it_prints() -> None:
    f = capture_facts("fresh")
    snap = translate(CAPTURE, (CAPTURE / "metrics-fresh.txt").read_text())
    assert snap.value(V.PROMPT_TOKENS) == f["prompt_tokens_all"] == 0
    assert snap.value(V.GENERATION_TOKENS) == f["tokens_predicted"] == 0
    assert (snap.value(V.REQUESTS_RUNNING), snap.value(V.REQUESTS_WAITING)) == (f["running"], f["waiting"]) == (0, 0)
    assert snap.metrics() == translate(CAPTURE).metrics()


def test_written_from_source_fixture_matches_the_real_build() -> None:
    """001d906 was written from the source; the b11312 build prints the same families, HELP and TYPE lines."""

    def comments(path: Path) -> list[str]:
        return [ln for ln in path.read_text().splitlines() if ln.startswith("#")]

    assert comments(CAPTURE / "metrics-fresh.txt") == comments(REWORK_FRESH / "metrics.txt")
    assert (
        comments(CAPTURE / "metrics.txt") == comments(REWORK / "metrics.txt")[: len(comments(CAPTURE / "metrics.txt"))]
    )
    models = engine.parse_info(json.loads((CAPTURE / "models.json").read_text()))
    assert models.model == engine.parse_info(json.loads((CAPTURE / "props.json").read_text())).model == "tiny.gguf"
