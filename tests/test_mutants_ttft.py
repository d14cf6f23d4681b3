"""The proxy's client-side timings of one exchange (TTFT, chunk gaps, TPOT), its token counts and its
outcome, on hand-computed cases (``mutation/ttft.toml``: each case kills mutants of
:class:`inferwatch.proxy.measure.Exchange` that the end-to-end proxy tests let through).

Times are perf_counter seconds chosen as binary fractions, so every expected figure below is exact."""

from __future__ import annotations

import dataclasses

import pytest

from inferwatch.core import vocabulary as V
from inferwatch.proxy.apis import OPENAI_CHAT, TGI_GENERATE, Ask, Reading
from inferwatch.proxy.client_metrics import ClientMetrics
from inferwatch.proxy.measure import Exchange

MODEL = "m"


def exchange(status: int = 200, content_type: str = "text/event-stream", **kw: object) -> Exchange:
    ex = Exchange(OPENAI_CHAT, Ask(model=MODEL), MODEL, None, 10.0, ClientMetrics("vllm", V.Vocabulary()), **kw)  # type: ignore[arg-type]
    ex.begin(status, content_type)
    return ex


def observed(ex: Exchange, spec: V.MetricSpec) -> tuple[int, float]:
    """(observations, their sum) of one client histogram of the exchange's model."""
    hist = ex.metrics.histograms[spec].get((MODEL, V.TENANT_ANONYMOUS))
    return (0, 0.0) if hist is None else (sum(hist.counts), hist.total)


def content(n: int = 1) -> Reading:
    return Reading(content=n, tokens=n)


def test_ttft_and_chunk_gaps_are_measured_from_the_start_and_between_contents() -> None:
    ex = exchange()
    assert ex.ttft is None
    ex.take(content(), 10.5)  # first content 0.5 s after the start
    assert ex.ttft == 0.5
    assert observed(ex, V.CLIENT_TIME_TO_FIRST_TOKEN) == (1, 0.5)
    assert observed(ex, V.CLIENT_CHUNK_GAP) == (0, 0.0)
    ex.take(content(), 10.75)
    ex.take(Reading(), 10.875)  # no content (a role or usage chunk): no gap, the last content stays 10.75
    ex.take(content(), 11.25)
    assert observed(ex, V.CLIENT_TIME_TO_FIRST_TOKEN) == (1, 0.5)  # observed once
    assert observed(ex, V.CLIENT_CHUNK_GAP) == (2, 0.25 + 0.5)
    assert ex.ttft == 0.5
    assert (ex.contents, ex.tokens) == (3, 3)


def test_tpot_is_the_time_after_the_first_content_over_the_tokens_after_the_first() -> None:
    ex = exchange()
    ex.take(content(), 10.5)
    ex.take(content(2), 11.0)
    ex.take(Reading(finish_reasons=["stop"], final=True), 11.0)
    assert ex.finish(12.5) == V.OUTCOME_STOP
    # 3 counted tokens: (12.5 - 10.5) / (3 - 1)
    assert observed(ex, V.CLIENT_TIME_PER_OUTPUT_TOKEN) == (1, 1.0)
    assert observed(ex, V.CLIENT_REQUEST_DURATION) == (1, 2.5)
    assert ex.end == 12.5


def test_tpot_uses_the_engines_usage_over_the_counted_tokens() -> None:
    ex = exchange()
    ex.take(content(), 10.5)
    ex.take(Reading(completion_tokens=5, prompt_tokens=7), 11.0)
    assert ex.generated == (5, False)
    ex.finish(12.5)
    assert observed(ex, V.CLIENT_TIME_PER_OUTPUT_TOKEN) == (1, 0.5)  # (12.5 - 10.5) / (5 - 1)
    assert ex.metrics.generation_tokens == {(MODEL, V.TENANT_ANONYMOUS, V.FALSE): 5}
    assert ex.metrics.prompt_tokens == {(MODEL, V.TENANT_ANONYMOUS, V.FALSE): 7}


@pytest.mark.parametrize(("tokens", "expected"), [(1, (0, 0.0)), (2, (1, 2.0))])
def test_tpot_needs_two_tokens(tokens: int, expected: tuple[int, float]) -> None:
    ex = exchange()
    ex.take(content(tokens), 10.5)
    ex.finish(12.5)
    assert observed(ex, V.CLIENT_TIME_PER_OUTPUT_TOKEN) == expected


@pytest.mark.parametrize("outcome", [V.OUTCOME_ABORT, V.OUTCOME_ERROR])
def test_no_tpot_for_an_aborted_or_failed_stream(outcome: str) -> None:
    ex = exchange()
    ex.take(content(3), 10.5)
    assert ex.finish(12.5, outcome) == outcome
    assert observed(ex, V.CLIENT_TIME_PER_OUTPUT_TOKEN) == (0, 0.0)
    assert ex.metrics.requests == {(MODEL, V.TENANT_ANONYMOUS, outcome): 1}


def test_length_outcome_keeps_its_tpot() -> None:
    ex = exchange()
    ex.take(content(3), 10.5)
    ex.take(Reading(finish_reasons=["length"]), 11.0)
    assert ex.finish(12.5) == V.OUTCOME_LENGTH
    assert observed(ex, V.CLIENT_TIME_PER_OUTPUT_TOKEN) == (1, 1.0)


def test_a_json_response_has_no_ttft_and_is_read_at_its_end() -> None:
    ex = exchange(content_type="application/json")
    assert not ex.streamed
    ex.take(content(), 10.5)  # even a reading with content: not streamed, so no first token
    assert ex.ttft is None and ex.first_content is None
    assert observed(ex, V.CLIENT_TIME_TO_FIRST_TOKEN) == (0, 0.0)
    body = (
        b'{"id": "r1", "choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],'
        b' "usage": {"prompt_tokens": 3, "completion_tokens": 4}}'
    )
    ex.feed(body, 10.75)
    assert ex.finish(11.0) == V.OUTCOME_LENGTH
    assert ex.body is None
    assert (ex.prompt_tokens, ex.completion_tokens, ex.response_id) == (3, 4, "r1")
    assert observed(ex, V.CLIENT_TIME_PER_OUTPUT_TOKEN) == (0, 0.0)
    assert observed(ex, V.CLIENT_REQUEST_DURATION) == (1, 1.0)


def test_a_forced_outcome_does_not_read_the_body() -> None:
    ex = exchange(content_type="application/json")
    ex.feed(b'{"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 4}}', 10.5)
    assert ex.finish(11.0, V.OUTCOME_ABORT, error="client went away") == V.OUTCOME_ABORT
    assert ex.completion_tokens is None
    assert ex.error == "client went away"


def test_a_body_that_is_not_json_is_dropped() -> None:
    ex = exchange(content_type="application/json")
    ex.feed(b"not json", 10.5)
    assert ex.finish(11.0) == V.OUTCOME_STOP
    assert ex.body is None
    assert ex.tokens == 0


def test_finish_records_once() -> None:
    ex = exchange()
    ex.take(content(3), 10.5)
    assert ex.finish(12.5) == V.OUTCOME_STOP
    assert ex.finish(20.0, V.OUTCOME_ABORT) == V.OUTCOME_STOP
    assert ex.end == 12.5
    assert ex.metrics.requests == {(MODEL, V.TENANT_ANONYMOUS, V.OUTCOME_STOP): 1}
    assert observed(ex, V.CLIENT_REQUEST_DURATION) == (1, 2.5)
    assert observed(ex, V.CLIENT_TIME_PER_OUTPUT_TOKEN) == (1, 1.0)


def test_take_keeps_the_first_error_and_response_id_and_the_last_usage() -> None:
    ex = exchange()
    ex.take(Reading(response_id="a", prompt_tokens=1, completion_tokens=2), 10.5)
    ex.take(Reading(response_id="b", error="e1"), 10.5)
    ex.take(Reading(error="e2", prompt_tokens=3), 10.5)
    ex.take(Reading(), 10.5)
    assert (ex.response_id, ex.error, ex.prompt_tokens, ex.completion_tokens) == ("a", "e1", 3, 2)
    assert not ex.final
    ex.take(Reading(finish_reasons=["stop"]), 10.5)
    ex.take(Reading(final=True), 10.5)
    ex.take(Reading(finish_reasons=["length"]), 10.5)
    assert ex.final
    assert ex.finish_reasons == ["stop", "length"]
    assert ex.finish(11.0) == V.OUTCOME_ERROR  # an error in the stream, whatever the finish reasons


@pytest.mark.parametrize(
    ("status", "tokens", "expected"),
    [(200, 0, (0, True)), (399, 0, (0, True)), (400, 0, None), (500, 0, None), (500, 2, (2, True))],
)
def test_generated_counts_the_tokens_unless_a_failure_sent_none(
    status: int, tokens: int, expected: tuple[int, bool] | None
) -> None:
    ex = exchange(status, "application/json")
    ex.tokens = tokens
    assert ex.generated == expected


@pytest.mark.parametrize(("status", "outcome"), [(399, V.OUTCOME_STOP), (400, V.OUTCOME_ERROR)])
def test_status_400_and_above_is_an_error(status: int, outcome: str) -> None:
    ex = exchange(status, "application/json")
    assert ex.sse is None and (ex.body is None) == (status >= 400)
    assert ex.finish(11.0) == outcome


@pytest.mark.parametrize(("counted", "outcome"), [(3, V.OUTCOME_STOP), (4, V.OUTCOME_LENGTH), (5, V.OUTCOME_LENGTH)])
def test_an_api_without_finish_reasons_is_cut_at_its_budget(counted: int, outcome: str) -> None:
    api = dataclasses.replace(OPENAI_CHAT, count_length=True)
    ex = Exchange(api, Ask(model=MODEL, max_tokens=4), MODEL, None, 10.0, ClientMetrics("vllm", V.Vocabulary()))
    ex.begin(200, "text/event-stream")
    ex.take(content(counted), 10.5)
    assert ex.finish(11.0) == outcome


def test_a_budget_is_not_applied_where_the_api_reports_finish_reasons() -> None:
    ex = Exchange(OPENAI_CHAT, Ask(model=MODEL, max_tokens=2), MODEL, None, 10.0, ClientMetrics("vllm", V.Vocabulary()))
    ex.begin(200, "text/event-stream")
    ex.take(content(3), 10.5)
    assert ex.finish(11.0) == V.OUTCOME_STOP


def test_sse_bytes_are_timed_when_they_are_forwarded() -> None:
    ex = exchange(content_type="text/event-stream; charset=utf-8")
    assert ex.streamed
    ex.feed(b'data: {"id": "x", "choices": [{"delta": {"content": "He"}}]}\n\n', 10.25)
    ex.feed(b'data: {"choices": [{"delta": {"content": "llo"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n', 10.75)
    assert ex.complete
    assert ex.gone(11.0) == V.OUTCOME_STOP
    assert observed(ex, V.CLIENT_TIME_TO_FIRST_TOKEN) == (1, 0.25)
    assert observed(ex, V.CLIENT_CHUNK_GAP) == (1, 0.5)
    assert observed(ex, V.CLIENT_TIME_PER_OUTPUT_TOKEN) == (1, 0.75)  # (11.0 - 10.25) / (2 - 1)


def tgi_exchange() -> Exchange:
    ex = Exchange(TGI_GENERATE, Ask(model=MODEL), MODEL, None, 10.0, ClientMetrics("tgi", V.Vocabulary()))
    ex.begin(200, "application/json")
    ex.feed(b'{"generated_text": "hi", "details": {"finish_reason": "eos_token"}}', 10.5)
    return ex


def test_a_json_body_is_read_with_the_response_headers() -> None:
    ex = tgi_exchange()
    assert ex.finish(11.0, headers={"x-prompt-tokens": "12", "x-generated-tokens": "9"}) == V.OUTCOME_STOP
    assert (ex.prompt_tokens, ex.completion_tokens, ex.generated) == (12, 9, (9, False))


def test_a_json_body_is_read_without_headers_too() -> None:
    ex = tgi_exchange()
    assert ex.finish(11.0) == V.OUTCOME_STOP
    assert (ex.prompt_tokens, ex.completion_tokens, ex.generated) == (None, None, (1, True))


def test_chunk_gaps_go_to_a_new_series_after_the_tenants_series_were_dropped() -> None:
    ex = exchange(tenant="t1", tenant_label="t1")
    ex.take(content(), 10.5)
    ex.take(content(), 10.75)
    gaps = ex.metrics.histograms[V.CLIENT_CHUNK_GAP]
    assert (sum(gaps[(MODEL, "t1")].counts), gaps[(MODEL, "t1")].total) == (1, 0.25)
    ex.metrics.forget(["t1"])  # the tenant left the busiest: its series are dropped
    assert (MODEL, "t1") not in gaps
    ex.take(content(), 11.25)
    assert (sum(gaps[(MODEL, "t1")].counts), gaps[(MODEL, "t1")].total) == (1, 0.5)
    ex.take(content(), 11.5)
    assert (sum(gaps[(MODEL, "t1")].counts), gaps[(MODEL, "t1")].total) == (2, 0.75)
