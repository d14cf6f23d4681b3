"""llama.cpp's ``/metrics`` (``--metrics``): the raw names (spelled only here), their HELP texts and TYPE
words, the text the handler streams out, and ``server_metrics`` fed from the serving model's steps.

The shape is the one after the metrics rework (``server_task_result_metrics::to_metrics`` in
``tools/server/server-task.cpp``), held to a real ``llama-server`` b11312 (ggml-org/llama.cpp
0c1e57098bba43ac29e6e3b677cdceebdd22334f): ``tests/fixtures/engines/llamacpp/b11312-cpu/metrics-fresh.txt``
byte for byte before the first request, and the behaviour its 65 polls under load show
(``raw/load-polls``, ``metrics.txt``, ``metrics-final.txt``). Per entry ``# HELP llamacpp:<name> <help>``,
``# TYPE llamacpp:<name> <type>`` and ``llamacpp:<name> <value>``, the value a ``double`` through
``std::stringstream`` (``%g``, six significant digits): no labels, no blank lines, no timestamps, all 15
families present (at 0) from the first scrape on. The per-position speculative counter appears only once a
draft model ran: the simulator has none, so it never prints it.

What the capture shows, and the simulator does:

* prompt tokens evaluated are credited per decode batch (``report.prefill_tokens``), cached ones when a
  slot starts its task; ``prompt_seconds_total`` is the wall time of the batches that evaluated prompt
  tokens (concurrent prompts are timed once);
* ``tokens_predicted_total`` and ``tokens_predicted_seconds_total`` move only when a request ends, the
  second by the request's ``timings.predicted_ms``; a cancelled task credits nothing;
* ``n_decode_total`` counts ``llama_decode()`` calls (one per engine step), ``n_busy_slots_per_decode``
  (TYPE gauge) divides the slots busy in them by that count (a request is busy in its prompt decode and in
  ``predicted - 1`` generation decodes), ``n_tokens_max`` (TYPE counter, a maximum) is the largest context
  a slot held at a decode;
* the two throughput gauges are rates over the window since the previous ``/metrics`` call (each call
  resets it): evaluated prompt tokens over prompt seconds, and generated tokens minus one per finished
  request (decode steps) over their ``predicted_ms``; 0 when the window saw none.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.simulator.base import EngineMetrics, SimulatedEngine
from inferwatch.simulator.engines.llamacpp.protocol import METRICS_TYPE, cpp_double, f32
from inferwatch.simulator.engines.llamacpp.slots import Slots
from inferwatch.simulator.scheduler import Finish, Sequence, StepReport

PREFIX = "llamacpp:"
PROMPT_TOKENS_TOTAL = PREFIX + "prompt_tokens_total"
PROMPT_TOKENS_CACHED_TOTAL = PREFIX + "prompt_tokens_cached_total"
PROMPT_SECONDS_TOTAL = PREFIX + "prompt_seconds_total"
TOKENS_PREDICTED_TOTAL = PREFIX + "tokens_predicted_total"
TOKENS_PREDICTED_SECONDS_TOTAL = PREFIX + "tokens_predicted_seconds_total"
N_DECODE_TOTAL = PREFIX + "n_decode_total"
N_TOKENS_MAX = PREFIX + "n_tokens_max"
SPEC_DRAFT_TOKENS_TOTAL = PREFIX + "spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED_TOKENS_TOTAL = PREFIX + "spec_decode_num_accepted_tokens_total"
SPEC_DRAFTS_TOTAL = PREFIX + "spec_decode_num_drafts_total"
PROMPT_TOKENS_SECONDS = PREFIX + "prompt_tokens_seconds"
PREDICTED_TOKENS_SECONDS = PREFIX + "predicted_tokens_seconds"
REQUESTS_PROCESSING = PREFIX + "requests_processing"
REQUESTS_DEFERRED = PREFIX + "requests_deferred"
N_BUSY_SLOTS_PER_DECODE = PREFIX + "n_busy_slots_per_decode"

COUNTER, GAUGE = "counter", "gauge"
FAMILIES: tuple[tuple[str, str, str], ...] = (
    (PROMPT_TOKENS_TOTAL, COUNTER, "Number of prompt tokens processed, excluding cached tokens"),
    (PROMPT_TOKENS_CACHED_TOTAL, COUNTER, "Number of prompt tokens reused from the cache"),
    (PROMPT_SECONDS_TOTAL, COUNTER, "Total time spent processing prompts"),
    (TOKENS_PREDICTED_TOTAL, COUNTER, "Number of generation tokens processed"),
    (TOKENS_PREDICTED_SECONDS_TOTAL, COUNTER, "Total time spent generating tokens"),
    (
        N_DECODE_TOTAL,
        COUNTER,
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    ),
    (N_TOKENS_MAX, COUNTER, "Largest observed sequence length (prompt + generation)"),
    (SPEC_DRAFT_TOKENS_TOTAL, COUNTER, "Speculative: Total draft tokens generated"),
    (SPEC_ACCEPTED_TOKENS_TOTAL, COUNTER, "Speculative: Total draft tokens accepted by the target model"),
    (SPEC_DRAFTS_TOTAL, COUNTER, "Speculative: Total speculative decoding verification steps"),
    (PROMPT_TOKENS_SECONDS, GAUGE, "Average prompt throughput in tokens/s"),
    (PREDICTED_TOKENS_SECONDS, GAUGE, "Average generation throughput in tokens/s"),
    (REQUESTS_PROCESSING, GAUGE, "Number of requests processing"),
    (REQUESTS_DEFERRED, GAUGE, "Number of requests deferred"),
    (N_BUSY_SLOTS_PER_DECODE, GAUGE, "Average number of busy slots per llama_decode() call"),
)
"""(name, TYPE word, HELP) in the order the handler prints them."""


@dataclass
class ServerMetrics:
    """``server_metrics``: totals since start, and the window the next ``/metrics`` call reads and resets.
    Times are milliseconds."""

    n_prompt_tokens_processed_total: int = 0
    n_prompt_tokens_cached_total: int = 0
    t_prompt_processing_total: float = 0.0
    n_tokens_predicted_total: int = 0
    t_tokens_generation_total: float = 0.0
    n_tokens_max: int = 0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_prompt_tokens_processed: int = 0
    t_prompt_processing: float = 0.0
    n_tokens_predicted: int = 0
    t_tokens_generation: float = 0.0

    def on_decoded(self, busy_slots: int, n_tokens: int) -> None:
        self.n_decode_total += 1
        self.n_busy_slots_total += busy_slots
        self.n_tokens_max = max(self.n_tokens_max, n_tokens)

    def on_prompt_batch(self, evaluated: int, batch_ms: float) -> None:
        self.n_prompt_tokens_processed_total += evaluated
        self.n_prompt_tokens_processed += evaluated
        self.t_prompt_processing_total += batch_ms
        self.t_prompt_processing += batch_ms

    def on_prediction(self, decoded: int, generation_ms: float) -> None:
        self.n_tokens_predicted_total += decoded
        self.n_tokens_predicted += max(0, decoded - 1)
        self.t_tokens_generation_total += generation_ms
        self.t_tokens_generation += generation_ms

    def reset_bucket(self) -> None:
        self.n_prompt_tokens_processed = 0
        self.t_prompt_processing = 0.0
        self.n_tokens_predicted = 0
        self.t_tokens_generation = 0.0


def prompt_ms(seq: Sequence) -> float:
    """``t_prompt_processing``: from the slot's first prompt batch to its first sampled token."""
    return seq.prefill_time * 1e3


def generation_ms(seq: Sequence) -> float:
    """``t_token_generation`` at release: from the first sampled token to the last (1 µs at least)."""
    return max(1.0, seq.decode_time * 1e6) / 1e3


class LlamacppMetrics(EngineMetrics):
    """``server_metrics`` updated from the steps (one ``llama_decode`` per step) and rendered as the handler does."""

    content_type = METRICS_TYPE

    def __init__(self, engine: SimulatedEngine, n_slots: int, slots: Slots) -> None:
        super().__init__(engine)
        self.n_slots = n_slots
        self.slots = slots
        self.m = ServerMetrics()

    def processing(self) -> int:
        """Slots with a task: every request in the engine up to the number of slots."""
        model = self.engine.model
        return min(self.n_slots, len(model.running) + len(model.waiting))

    def deferred(self) -> int:
        """Tasks the server deferred because no slot was free (``queue_tasks_deferred``)."""
        model = self.engine.model
        return max(0, len(model.running) + len(model.waiting) - self.n_slots)

    def on_step(self, report: StepReport) -> None:
        self.slots.on_step(report, report.end)
        m = self.m
        for seq in report.admitted:
            m.n_prompt_tokens_cached_total += seq.cached_tokens
        if report.scheduled:
            m.on_decoded(len(report.scheduled), max(s.computed for s in report.scheduled))
        if report.prefill_tokens:
            m.on_prompt_batch(report.prefill_tokens, report.duration * 1e3)
        for seq in report.finished:
            if seq.finish in (Finish.STOP, Finish.LENGTH):
                m.on_prediction(seq.generated, generation_ms(seq))

    def values(self) -> dict[str, float]:
        """The value each family prints, computed as the metrics task computes it."""
        m = self.m
        return {
            PROMPT_TOKENS_TOTAL: float(m.n_prompt_tokens_processed_total),
            PROMPT_TOKENS_CACHED_TOTAL: float(m.n_prompt_tokens_cached_total),
            PROMPT_SECONDS_TOTAL: m.t_prompt_processing_total / 1e3,
            TOKENS_PREDICTED_TOTAL: float(m.n_tokens_predicted_total),
            TOKENS_PREDICTED_SECONDS_TOTAL: m.t_tokens_generation_total / 1e3,
            N_DECODE_TOTAL: float(m.n_decode_total),
            N_TOKENS_MAX: float(m.n_tokens_max),
            SPEC_DRAFT_TOKENS_TOTAL: 0.0,
            SPEC_ACCEPTED_TOKENS_TOTAL: 0.0,
            SPEC_DRAFTS_TOTAL: 0.0,
            PROMPT_TOKENS_SECONDS: _rate(m.n_prompt_tokens_processed, m.t_prompt_processing),
            PREDICTED_TOKENS_SECONDS: _rate(m.n_tokens_predicted, m.t_tokens_generation),
            REQUESTS_PROCESSING: float(self.processing()),
            REQUESTS_DEFERRED: float(self.deferred()),
            N_BUSY_SLOTS_PER_DECODE: f32(f32(m.n_busy_slots_total) / max(f32(m.n_decode_total), 1.0)),
        }

    def render(self) -> str:
        """The page one ``/metrics`` call prints; the call resets the throughput window."""
        values = self.values()
        self.m.reset_bucket()
        lines = []
        for name, kind, help_text in FAMILIES:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {cpp_double(values[name])}"]
        return "\n".join(lines) + "\n"


def _rate(tokens: int, ms: float) -> float:
    """``1.e3 / t * n``, 0 when the window saw no token (or no time)."""
    return 1e3 / ms * tokens if tokens and ms > 0 else 0.0
