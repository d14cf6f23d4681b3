"""TensorRT-LLM's ``trtllm-serve``: Prometheus text (three name generations) and JSON iteration stats.

Source: the TensorRT-LLM catalog (``trtllm.md`` §2.3–2.4, §5–6): ``tensorrt_llm/metrics/collector.py``
at three commits. Gen A (1.1–1.2): five unprefixed families with ``model_name="undefined"``;
Gen B: the same with the ``trtllm_`` prefix plus two KV gauges; Gen C: ~60 ``trtllm_*`` families
with real labels. All are rendered by prometheus_client in multiprocess mode (gauges carry ``pid``,
which is dropped). ``GET /metrics`` on the same port is a JSON array of per-iteration stats and a
destructive read: a target's :class:`TrtllmSession` drains it in the background into an
:class:`IterationStatsAccumulator`, which sums per-iteration counts and keeps the latest gauges; its
signals fill in what the Prometheus endpoint of the deployment lacks.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import Field, JsonValue

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import trtllm as trtllm_facts
from inferwatch.exporters.mapping import (
    EngineAdapter,
    EngineOptions,
    EngineSession,
    Fetch,
    Row,
    ScrapeError,
    TranslateContext,
    info_key,
    version_info,
)
from inferwatch.exporters.memo import derive
from inferwatch.exporters.samples import SeriesKey, Snapshot
from inferwatch.exporters.textparse import ParsedText

L = {"model_name": V.LABEL_MODEL}

FINISHED_REASON: dict[str, str | None] = {
    "stop": V.OUTCOME_STOP,
    "length": V.OUTCOME_LENGTH,
    "cancelled": V.OUTCOME_ABORT,
    "timeout": V.OUTCOME_ERROR,
    "unknown": V.OUTCOME_ERROR,
    "not_finished": None,  # disaggregated context-only phase: not a final outcome
}
# trtllm_request_error_total{http_code}: server errors count, client errors (400) do not.
HTTP_CODE: dict[str, str | None] = {str(code): V.OUTCOME_ERROR for code in range(500, 600)}

ROWS: tuple[Row, ...] = (
    Row(
        V.REQUESTS,
        ("trtllm_request_success_total", "request_success_total"),
        {**L, "finished_reason": V.LABEL_OUTCOME},
        values={"finished_reason": FINISHED_REASON},
    ),
    Row(
        V.REQUESTS,
        ("trtllm_request_error_total",),
        {**L, "http_code": V.LABEL_OUTCOME},
        values={"http_code": HTTP_CODE},
    ),
    Row(V.TIME_TO_FIRST_TOKEN, ("trtllm_time_to_first_token_seconds", "time_to_first_token_seconds"), L),
    Row(V.TIME_PER_OUTPUT_TOKEN, ("trtllm_time_per_output_token_seconds", "time_per_output_token_seconds"), L),
    Row(V.REQUEST_DURATION, ("trtllm_e2e_request_latency_seconds", "e2e_request_latency_seconds"), L),
    Row(
        V.REQUEST_QUEUE,
        ("trtllm_request_queue_time_seconds", "request_queue_time_seconds"),
        L,
        note="[trtllm: before PR 12545 zero queue times were not recorded.]",
    ),
    Row(V.REQUEST_PREFILL, ("trtllm_request_prefill_time_seconds",), L),
    Row(V.REQUEST_DECODE, ("trtllm_request_decode_time_seconds",), L),
    Row(V.PROMPT_TOKENS, ("trtllm_prompt_tokens_total",), L),
    Row(V.GENERATION_TOKENS, ("trtllm_generation_tokens_total",), L),
    Row(V.PREFIX_CACHE_HIT_TOKENS, ("trtllm_prompt_cached_tokens_total",), L),
    Row(V.SPEC_DECODE_DRAFT_TOKENS, ("trtllm_spec_decode_num_draft_tokens_total",), L),
    Row(V.SPEC_DECODE_ACCEPTED_TOKENS, ("trtllm_spec_decode_num_accepted_tokens_total",), L),
    Row(V.REQUESTS_RUNNING, ("trtllm_num_requests_running",), L),
    Row(V.REQUESTS_WAITING, ("trtllm_num_requests_waiting",), L),
    Row(V.KV_CACHE_USAGE, ("trtllm_kv_cache_utilization",), L),
)

PROMPT_TOKENS = "trtllm_prompt_tokens_total"
PROMPT_CACHED = "trtllm_prompt_cached_tokens_total"
MAX_BLOCKS = "trtllm_kv_cache_max_blocks"
TOKENS_PER_BLOCK = "trtllm_kv_cache_tokens_per_block"
MAX_ACTIVE = "trtllm_max_num_active_requests"
CACHE_INFO = ("trtllm_kv_cache_config_info", "trtllm_cache_config_info")


IGNORED = frozenset(
    {
        "trtllm_request_inference_time_seconds",
        "trtllm_prompt_cache_hit_tokens",
        "trtllm_prompt_cached_tokens_per_request",
        "trtllm_spec_decode_drafted_tokens",
        "trtllm_spec_decode_accepted_tokens",
        "trtllm_prefill_perplexity",
        "trtllm_generation_perplexity",
        "trtllm_num_requests_completed",
        "trtllm_iteration_latency_seconds",
        "trtllm_gpu_memory_usage_bytes",
        "trtllm_cpu_memory_usage_bytes",
        "trtllm_pinned_memory_usage_bytes",
        "trtllm_max_batch_size_static",
        "trtllm_max_batch_size_runtime",
        "trtllm_max_num_tokens_runtime",
        "trtllm_kv_cache_free_blocks",
        "trtllm_kv_cache_used_blocks",
        "trtllm_kv_cache_hit_rate",
        "trtllm_kv_cache_reused_blocks",
        "trtllm_kv_cache_missed_blocks",
        "trtllm_num_context_requests",
        "trtllm_num_generation_requests",
        "trtllm_num_paused_requests",
        "trtllm_num_scheduled_requests",
        "trtllm_total_context_tokens",
        "trtllm_prefill_batch_tokens",
        "trtllm_prefill_batch_occupancy",
        "trtllm_avg_decoded_tokens_per_iter",
        "trtllm_spec_decode_acceptance_length",
        "trtllm_spec_decode_draft_overhead",
        "trtllm_kv_cache_host_utilization",
        "trtllm_kv_cache_iter_reuse_rate",
        "trtllm_kv_cache_iter_reused_blocks",
        "trtllm_kv_cache_iter_full_reused_blocks",
        "trtllm_kv_cache_iter_partial_reused_blocks",
        "trtllm_kv_cache_iter_missed_blocks",
        "trtllm_kv_cache_gen_alloc_blocks",
        "trtllm_kv_cache_onboard_bytes",
        "trtllm_kv_cache_offload_bytes",
        "trtllm_kv_cache_intra_device_copy_bytes",
        "trtllm_kv_cache_disk_prefetch_blocks",
        "trtllm_model_config_info",
        "trtllm_parallel_config_info",
        "trtllm_speculative_config_info",
        "trtllm_scheduled_batch_size",
    }
)


JSON_SIGNALS = frozenset(
    {
        V.REQUESTS_RUNNING,
        V.REQUESTS_WAITING,
        V.KV_CACHE_USAGE,
        V.KV_CACHE_CAPACITY,
        V.PREFIX_CACHE_HIT_TOKENS,
        V.PREFIX_CACHE_QUERIED_TOKENS,
        V.SPEC_DECODE_DRAFT_TOKENS,
        V.SPEC_DECODE_ACCEPTED_TOKENS,
        V.ENGINE_INFO,
    }
)
"""every canonical metric :meth:`IterationStatsAccumulator.apply` can add (each only where the
Prometheus text lacks it): a text page with all of them (Gen C) leaves the JSON stats nothing to add."""


class IterationStatsAccumulator:
    """State kept across destructive reads of trtllm-serve's JSON ``/metrics``.

    Per attention-DP rank: the latest iteration (gauges and cumulative KV block counts) and the
    running sums of per-iteration counts (speculative-decoding drafts and acceptances). Iterations
    already seen (same or lower ``iter``) are skipped, so a re-read never double counts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latest: dict[int, dict[str, Any]] = {}
        self.last_iter: dict[int, int] = {}
        self.draft_tokens: dict[int, float] = {}
        self.accepted_tokens: dict[int, float] = {}
        self.iterations = 0

    def feed(self, stats: Iterable[Any]) -> int:
        """Take one JSON read (a list of iteration dicts); returns how many iterations were new."""
        new = 0
        with self._lock:
            for item in sorted((s for s in stats if isinstance(s, dict)), key=lambda s: int(s.get("iter", 0))):
                rank = int(item.get("attentionDpRank", 0) or 0)
                it = int(item.get("iter", 0))
                if it <= self.last_iter.get(rank, -1):
                    continue
                self.last_iter[rank] = it
                self.latest[rank] = item
                spec = item.get("specDecodingStats") or {}
                self.draft_tokens[rank] = self.draft_tokens.get(rank, 0.0) + float(spec.get("numDraftTokens", 0))
                self.accepted_tokens[rank] = self.accepted_tokens.get(rank, 0.0) + float(
                    spec.get("numAcceptedTokens", 0)
                )
                new += 1
            self.iterations += new
        return new

    def apply(self, ctx: TranslateContext, snap: Snapshot, present: set[V.MetricSpec] | None = None) -> None:
        """Add the JSON-derived signals that the Prometheus payload (``present``: its metrics, by
        default the snapshot's) did not provide; they are :data:`JSON_SIGNALS`."""
        present = snap.metrics() if present is None else present
        with self._lock:
            multi_rank = any(rank != 0 for rank in self.latest)
            for rank, item in sorted(self.latest.items()):
                base = {V.LABEL_DP_RANK: str(rank)} if multi_rank else {}

                def put(spec: V.MetricSpec, value: float, base: dict[str, str] = base) -> None:
                    if spec not in present:
                        snap.add_value(spec, ctx.key(dict(base)), value)

                put(V.REQUESTS_RUNNING, float(item.get("numActiveRequests", 0)))
                put(V.REQUESTS_WAITING, float(item.get("numQueuedRequests", 0)))
                kv = item.get("kvCacheStats") or {}
                per = float(kv.get("tokensPerBlock", 0) or 0)
                max_blocks = float(kv.get("maxNumBlocks", 0) or 0)
                if max_blocks:
                    put(V.KV_CACHE_USAGE, float(kv.get("usedNumBlocks", 0)) / max_blocks)
                    put(V.KV_CACHE_CAPACITY, max_blocks * per)
                if per and "reusedBlocks" in kv:
                    reused = float(kv.get("reusedBlocks", 0))
                    put(V.PREFIX_CACHE_HIT_TOKENS, reused * per)
                    put(V.PREFIX_CACHE_QUERIED_TOKENS, (reused + float(kv.get("missedBlocks", 0))) * per)
                if item.get("specDecodingStats") is not None or self.draft_tokens.get(rank):
                    put(V.SPEC_DECODE_DRAFT_TOKENS, self.draft_tokens.get(rank, 0.0))
                    put(V.SPEC_DECODE_ACCEPTED_TOKENS, self.accepted_tokens.get(rank, 0.0))
                if V.ENGINE_INFO not in present:
                    info = {
                        **base,
                        V.LABEL_BLOCK_SIZE: str(int(per)) if per else "",
                        V.LABEL_MAX_CONCURRENCY: str(item.get("maxNumActiveRequests", "")),
                    }
                    snap.set_value(V.ENGINE_INFO, info_key(ctx, info), 1.0)
            if self.latest and V.PREFIX_CACHE_HIT_TOKENS not in present:
                snap.notes[V.PREFIX_CACHE_HIT_TOKENS] = "[trtllm: reused KV blocks x tokens per block.]"


def _label_value(value: float) -> str:
    return V.format_value(value).removesuffix(".0")


VALUE_NAMES = (MAX_BLOCKS, TOKENS_PER_BLOCK, MAX_ACTIVE, PROMPT_TOKENS, PROMPT_CACHED)
"""the samples whose values the hook reads (per model, the largest)."""


@dataclass(frozen=True)
class HookLayout:
    """What the hook makes of a page's label sets alone, once per shape (:func:`derive`)."""

    picks: tuple[tuple[str, tuple[str, ...]], ...]
    """per name of :data:`VALUE_NAMES`, each of its samples' model."""
    config: dict[str, dict[str, str]]
    """per model, the labels of its cache configuration's info series."""
    keys: dict[str, SeriesKey]
    """each model's series key."""


def _layout(parsed: ParsedText, ctx: TranslateContext) -> HookLayout:
    picks = tuple(
        (name, tuple(dict(labels).get("model_name", "") for labels, _ in parsed.get(name))) for name in VALUE_NAMES
    )
    config: dict[str, dict[str, str]] = {}
    for name in CACHE_INFO:
        for labels, _ in parsed.get(name):
            d = dict(labels)
            config[d.get("model_name", "")] = d
    models = {model for _, of in picks for model in of} | set(config)
    return HookLayout(picks, config, {model: ctx.key({V.LABEL_MODEL: model}) for model in models})


def hook(parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
    """Capacity, prefix-cache lookups and the info series (the session adds the JSON-derived signals)."""
    layout = derive(ctx.memo, hook, parsed, lambda: _layout(parsed, ctx))
    per_model: dict[str, dict[str, float]] = {}
    for name, models in layout.picks:
        for model, (_, value) in zip(models, parsed.get(name), strict=True):
            slot = per_model.setdefault(model, {})
            slot[name] = max(slot.get(name, value), value)
    config = layout.config
    for model, vals in sorted(per_model.items()):
        key = layout.keys[model]
        if MAX_BLOCKS in vals and TOKENS_PER_BLOCK in vals:
            snap.add_value(V.KV_CACHE_CAPACITY, key, vals[MAX_BLOCKS] * vals[TOKENS_PER_BLOCK])
        if PROMPT_CACHED in vals and PROMPT_TOKENS in vals:
            # Every prompt token is looked up when block reuse is on (the cached-token counter exists).
            snap.add_value(V.PREFIX_CACHE_QUERIED_TOKENS, key, vals[PROMPT_TOKENS])
    for model in sorted(set(per_model) | set(config)):
        cfg = config.get(model, {})
        vals = per_model.get(model, {})
        if not cfg and TOKENS_PER_BLOCK not in vals and MAX_ACTIVE not in vals:
            continue
        reuse = cfg.get("enable_block_reuse")
        block = cfg.get("page_size") or cfg.get("block_size")
        if not block and TOKENS_PER_BLOCK in vals:
            block = _label_value(vals[TOKENS_PER_BLOCK])
        info = {
            V.LABEL_MODEL: model,
            V.LABEL_BLOCK_SIZE: block or "",
            V.LABEL_GPU_MEMORY_UTILIZATION: cfg.get("free_gpu_memory_fraction", ""),
            V.LABEL_PREFIX_CACHING: "" if reuse is None else (V.TRUE if reuse.lower() == "true" else V.FALSE),
            V.LABEL_KV_CACHE_DTYPE: cfg.get("cache_dtype", ""),
            V.LABEL_MAX_CONCURRENCY: _label_value(vals[MAX_ACTIVE]) if MAX_ACTIVE in vals else "",
        }
        snap.set_value(V.ENGINE_INFO, info_key(ctx, info), 1.0)


JSON_PATH = "/metrics"
PROMETHEUS_PATH = "/prometheus/metrics"


def _is_json(body: str) -> bool:
    return body.lstrip()[:1] in ("[", "{")


def claims_json(body: JsonValue) -> bool:
    """A JSON array or object is trtllm-serve's iteration stats (no other engine serves JSON metrics)."""
    return isinstance(body, list | dict)


SCRAPE_GRACE = 1.25
"""after a scrape's drain, a poll waits this many intervals for the next scrape (which drains) before
it drains itself: scrapes exactly as frequent as the interval would otherwise race the poll."""
POLL_SLACK_SECONDS = 0.01
"""a poll that wakes this much early still drains (timers may fire a little before their time)."""
COVERED_RECHECK_INTERVALS = 10.0
"""while the text page carries all :data:`JSON_SIGNALS`, the background poll wakes only this many
intervals after the last scrape or wake (measured on Gen C's page at one scrape a second: the
wake that every scrape pushed back cost 0.26 of the exporter's 1.56 ms of CPU per scrape)."""


class TrtllmOptions(EngineOptions):
    """A trtllm-serve target's options."""

    json_poll_interval_seconds: float = Field(
        1.0,
        gt=0,
        description="How often to drain the JSON iteration stats at /metrics (a destructive read of a "
        "bounded buffer), between scrapes too; scrapes at least this frequent do the draining, and after "
        "a scrape's drain a poll waits 1.25 times this for the next scrape. Not drained while the "
        "Prometheus text carries every signal the JSON stats give (Gen C).",
    )


class TrtllmSession(EngineSession):
    """A trtllm-serve target: Prometheus text at ``/prometheus/metrics`` (mounted only with
    ``return_perf_metrics``) and JSON iteration stats at ``/metrics``, drained into :attr:`stats`.

    The drains are skipped while the last text page translated carried all :data:`JSON_SIGNALS`
    (*covered*): the JSON stats would then add nothing to a scrape, and each drain is one more engine
    request per scrape. A page without them (Gen A and B, or Gen C without speculative decoding) makes
    the next scrape drain again."""

    Options = TrtllmOptions

    def __init__(self, adapter: EngineAdapter, options: TrtllmOptions) -> None:
        super().__init__(adapter, options)
        self.options = options
        self.stats = IterationStatsAccumulator()
        self._drained_at = -math.inf
        """when the JSON stats were last drained (``time.monotonic``)."""
        self._by_scrape = False
        """whether the last drain was a scrape's."""
        self.covered = False
        """whether the last text page translated carried all :data:`JSON_SIGNALS`."""
        self._checked_at = -math.inf
        """while covered: the last scrape or poll (``time.monotonic``)."""

    @property
    def poll_interval(self) -> float:
        return self.options.json_poll_interval_seconds

    def poll_delay(self) -> float:
        """Until the interval after the last drain, or :data:`SCRAPE_GRACE` times it after a scrape's:
        a target scraped about as often as the interval is drained by its scrapes alone (one engine
        request less per scrape), and polls fill the gaps when scrapes are rarer or stop. While covered,
        :data:`COVERED_RECHECK_INTERVALS` after the last scrape or poll."""
        if self.covered:
            return max(0.0, self._checked_at + self.poll_interval * COVERED_RECHECK_INTERVALS - time.monotonic())
        wait = self.poll_interval * (SCRAPE_GRACE if self._by_scrape else 1.0)
        return max(0.0, self._drained_at + wait - time.monotonic())

    def fetch(self, get: Fetch, path: str, body: str | None = None) -> str:
        """The Prometheus text; JSON stats met on the way (at ``/metrics``) are fed to :attr:`stats`."""
        if body is None:
            # /prometheus/metrics may be missing (no return_perf_metrics): the JSON stats still work
            body = get(path or self.adapter.default_path, allow_404=not path)
        if _is_json(body):
            self._feed(body)
            return get(self.adapter.default_path, allow_404=True) if path in ("", JSON_PATH) else ""
        if self.covered:
            self._checked_at = time.monotonic()
            return body
        # a scrape drains the stats too unless a drain came within half the interval: then a poll is due
        # only an interval after the scrape's drain, and scrapes at least that frequent do all the draining
        fresh = time.monotonic() - self._drained_at < self.poll_interval / 2
        if path in ("", self.adapter.default_path) and not fresh:
            with contextlib.suppress(ScrapeError):  # the stats are extra; the text is the scrape
                self._drain(get)
            self._by_scrape = True
        return body

    def poll(self, get: Fetch) -> None:
        """Drain the JSON iteration stats into :attr:`stats`, unless a scrape did within the interval
        or the text is covered."""
        if self.covered:
            self._checked_at = time.monotonic()
            return
        wait = self.poll_interval * (SCRAPE_GRACE if self._by_scrape else 1.0)
        if time.monotonic() - self._drained_at >= wait - POLL_SLACK_SECONDS:
            self._by_scrape = False
            self._drain(get)

    def _drain(self, get: Fetch) -> None:
        try:
            body = get(JSON_PATH, allow_404=True)
        finally:  # a failed drain is tried again an interval later, as a poll, not at once
            self._drained_at = time.monotonic()
        if _is_json(body):
            self._feed(body)

    def _feed(self, body: str) -> None:
        try:
            stats = json.loads(body)
        except ValueError as exc:
            raise ScrapeError(f"trtllm-serve JSON stats are not valid JSON: {exc}") from None
        self.stats.feed(stats if isinstance(stats, list) else [stats])

    def translate(self, payload: str, ctx: TranslateContext) -> Snapshot:
        """Prometheus text, or one captured JSON read on its own (``inferwatch exporter translate metrics.json``)."""
        if not _is_json(payload):
            return super().translate(payload, ctx)
        stats = json.loads(payload)
        self.stats.feed(stats if isinstance(stats, list) else [stats])
        snap = Snapshot()
        self.stats.apply(ctx, snap)
        return snap

    def extend(self, parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
        """The JSON-derived signals the Prometheus payload did not provide; notes whether it was covered."""
        present = snap.metrics()
        covered = JSON_SIGNALS <= present
        if covered and not self.covered:
            self._checked_at = time.monotonic()
        self.covered = covered
        if not covered:  # (covered: the stats have nothing to add)
            self.stats.apply(ctx, snap, present)


ADAPTER = EngineAdapter(
    name=V.ENGINE_TRTLLM,
    rows=ROWS,
    prefixes=("trtllm_",),
    unsupported=trtllm_facts.PROFILE.unsupported,
    ignored=IGNORED,
    extra_samples=(MAX_BLOCKS, TOKENS_PER_BLOCK, MAX_ACTIVE, *CACHE_INFO),
    hook=hook,
    hook_metrics=(V.KV_CACHE_CAPACITY, V.PREFIX_CACHE_QUERIED_TOKENS, V.ENGINE_INFO),
    default_path=PROMETHEUS_PATH,
    info_path="/version",
    parse_info=version_info,
    detect_markers=("trtllm_", 'engine_type="'),
    claims_json=claims_json,
    session=TrtllmSession,
)
