"""The serving model shared by every simulated engine: continuous batching over a paged KV cache.

It is a pure, deterministic state machine driven by explicit times, in the manner of vLLM's V1
scheduler: each engine step takes a token budget, continues running sequences first (decode, or the
next chunk of a chunked prefill), preempts the newest running sequence when a sequence needs a KV
block and none is free (the victim loses its KV and is recomputed later), then admits waiting
requests while sequence slots, budget and blocks allow. A step's duration grows with the prefill
tokens and the number of decoding sequences in it; the host's share of it (``host_step``) leaves the
GPU idle, and the GPU's share grows when the simulated GPU lowers its clock. A request may first wait
for the host's input stage (``input_rate``). Prefix caching: prompts that share a prefix key
reuse the prefix's full blocks, which are then not recomputed.

Nothing here sleeps or does I/O: :class:`simulator.runtime.EngineLoop` drives it in (scaled) real
time, and tests drive it in virtual time.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum


class Finish(StrEnum):
    """Why a sequence finished (engine-neutral; each engine renders its own words)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass
class EngineParams:
    """Capacity and speed of a simulated engine (per-step time model in seconds)."""

    block_size: int = 16
    num_blocks: int = 1024
    max_num_seqs: int = 64
    max_model_len: int = 4096
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    # Calibrated on the real vLLM CPU run of tests/fixtures/engines/vllm/0.32.0-cpu (docs/simulator.md).
    step_base: float = 0.0045
    step_per_prefill_token: float = 0.00015
    step_per_decode_seq: float = 0.0002
    decode_slowdown: float = 1.0
    """multiplies the fixed cost of a step, which reading the weights dominates: a model too big for the GPU
    makes every step slow whatever the batch (slow TPOT)."""
    error_rate: float = 0.0
    """share of admitted requests that fail in the engine."""
    prefix_cache_entries: int = 256
    host_step: float = 0.0
    """seconds of host (CPU) work in every step during which the GPU waits: scheduling, sampling and
    detokenising on a starved CPU (the GPU profile ``client_bound``)."""
    input_rate: float = 0.0
    """prompt tokens/s of the host's input stage (tokenising, templating), one request after another,
    that a request passes before it can be admitted; 0: instant. Requests wait for it in the queue."""


@dataclass(eq=False)
class Sequence:
    """One engine request (one of the ``n`` samples of a user request); equal only to itself (the scheduler
    looks sequences up in its queues by identity, which field-by-field equality made quadratic)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    """tokens it generates before it stops by itself (EOS); ``>= max_tokens`` means it hits the limit."""
    arrival: float
    prefix_key: str | None = None
    prefix_tokens: int = 0
    seq_index: int = 0
    ready_at: float = 0.0
    """when the host's input stage is done with it (``EngineParams.input_rate``): not admitted before."""
    # scheduling state
    computed: int = 0
    """tokens whose KV is computed (prompt, then prompt + generated)."""
    generated: int = 0
    blocks: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished_at: float | None = None
    finish: Finish | None = None
    token_times: list[float] = field(default_factory=list)
    listener: Callable[[Sequence, str], None] | None = None
    """called with ("token" | "finish") as the sequence progresses."""

    @property
    def target_len(self) -> int:
        """Tokens the sequence must have computed before it emits its next token."""
        return self.prompt_tokens + self.generated

    @property
    def limit(self) -> int:
        return min(self.max_tokens, self.output_tokens)

    @property
    def queue_time(self) -> float:
        return (self.first_scheduled or self.arrival) - self.arrival

    @property
    def prefill_time(self) -> float:
        if self.first_token is None or self.first_scheduled is None:
            return 0.0
        return self.first_token - self.first_scheduled

    @property
    def decode_time(self) -> float:
        if self.first_token is None or self.last_token is None:
            return 0.0
        return self.last_token - self.first_token

    @property
    def e2e(self) -> float:
        return (self.finished_at or self.arrival) - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        """(e2e - TTFT) / (output tokens - 1), 0 for single-token outputs."""
        if self.generated <= 1 or self.first_token is None or self.last_token is None:
            return 0.0
        return (self.last_token - self.first_token) / (self.generated - 1)


@dataclass
class StepReport:
    """What one engine step did (iteration statistics, as TensorRT-LLM and TGI report them)."""

    start: float
    end: float
    prefill_tokens: int = 0
    decode_seqs: int = 0
    context_seqs: int = 0
    scheduled: list[Sequence] = field(default_factory=list)
    new_tokens: list[Sequence] = field(default_factory=list)
    """sequences that emitted one token at the end of the step (repeated per token)."""
    finished: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    running: int = 0
    waiting: int = 0
    used_blocks: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    gpu_weights: float = 0.0
    """seconds of the step the GPU spends on its fixed cost (reading the weights): memory-bound."""
    gpu_prefill: float = 0.0
    """seconds on prefill tokens: matrix work, tensor-core bound."""
    gpu_decode: float = 0.0
    """seconds on the decoding sequences' attention (reading their KV): memory-bound."""
    host: float = 0.0
    """seconds of host work in the step, the GPU idle (the rest of the duration is the GPU's)."""

    @property
    def duration(self) -> float:
        return self.end - self.start


class ServingModel:
    """The scheduler and KV-cache allocator. Call :meth:`plan` then :meth:`complete` per step."""

    def __init__(self, params: EngineParams, rng: random.Random | None = None) -> None:
        self.params = params
        self.rng = rng or random.Random(0)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_blocks = params.num_blocks
        self._prefix_cache: OrderedDict[str, int] = OrderedDict()
        self.step_count = 0
        self.preemptions_total = 0
        self._pending: tuple[StepReport, dict[int, int]] | None = None
        self._input_free = 0.0
        self.gpu_time_scale: Callable[[float], float] | None = None
        """how much longer the GPU's work takes at a step starting at a given time than at full clocks
        (the simulated GPU lowers its clock at its power cap); ``None``: always 1."""

    # -- capacity ---------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        return self.params.num_blocks - self.free_blocks

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.params.num_blocks

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.params.block_size)

    def _free(self, seq: Sequence) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0

    # -- requests ---------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a sequence (arrival time already set)."""
        if seq.prompt_tokens + 1 > self.params.max_model_len:
            raise ValueError(f"prompt of {seq.prompt_tokens} tokens exceeds max_model_len {self.params.max_model_len}")
        if self.params.input_rate > 0:
            start = max(seq.arrival, self._input_free)
            seq.ready_at = self._input_free = start + seq.prompt_tokens / self.params.input_rate
        self.waiting.append(seq)

    def abort(self, seq: Sequence, now: float) -> None:
        """The client went away: drop the sequence wherever it is."""
        if seq.finish is not None:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        seq.finish = Finish.ABORT
        seq.finished_at = now
        if seq.listener:
            seq.listener(seq, "finish")

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def next_ready(self) -> float | None:
        """When the head of the queue leaves the host's input stage (``None``: the queue is empty)."""
        return self.waiting[0].ready_at if self.waiting else None

    @property
    def pending_start(self) -> float | None:
        """The start of the step planned and not yet completed (``None`` between steps)."""
        return self._pending[0].start if self._pending is not None else None

    # -- one step ---------------------------------------------------------------------------
    def _preempt(self, victim: Sequence, report: StepReport) -> None:
        self.running.remove(victim)
        self._free(victim)
        victim.computed = 0  # recompute prompt + generated tokens when rescheduled
        victim.preemptions += 1
        self.preemptions_total += 1
        self.waiting.appendleft(victim)
        report.preempted.append(victim)

    def _grow(self, seq: Sequence, tokens: int, report: StepReport, scheduled: list[Sequence]) -> bool:
        """Make ``seq`` hold blocks for ``tokens``; preempt the newest others if needed."""
        need = self._blocks_for(tokens) - seq.blocks
        while need > self.free_blocks:
            candidates = [s for s in self.running if s is not seq and s not in scheduled]
            if not candidates:
                self._preempt(seq, report)
                return False
            self._preempt(candidates[-1], report)
        if need > 0:
            self.free_blocks -= need
            seq.blocks += need
        return True

    def plan(self, now: float) -> StepReport | None:
        """Schedule the next step starting at ``now``; ``None`` when there is nothing to do."""
        if self._pending is not None:
            raise RuntimeError("complete() the previous step first")
        if self.idle or (not self.running and self.waiting[0].ready_at > now):
            return None  # nothing to run, or only requests still in the host's input stage
        p = self.params
        report = StepReport(start=now, end=now)
        budget = p.max_num_batched_tokens
        chunks: dict[int, int] = {}
        scheduled: list[Sequence] = []
        # 1. running sequences first, in admission order
        for seq in list(self.running):
            if seq not in self.running or budget <= 0:
                continue
            remaining = seq.target_len - seq.computed
            chunk = min(remaining, budget) if remaining > 1 else 1
            if not self._grow(seq, seq.computed + chunk, report, scheduled):
                continue
            scheduled.append(seq)
            chunks[id(seq)] = chunk
            budget -= chunk
        # 2. admit waiting sequences
        while self.waiting and budget > 0 and len(self.running) < p.max_num_seqs:
            seq = self.waiting[0]
            if seq.ready_at > now:
                break  # still in the host's input stage (FIFO: the ones behind it too)
            cached = 0
            if seq.computed == 0 and seq.preemptions == 0:
                cached = self._prefix_lookup(seq, report)
            start_at = max(seq.computed, cached)
            chunk = min(seq.target_len - start_at, budget)
            need = self._blocks_for(start_at + chunk) - seq.blocks
            if self._blocks_for(seq.target_len) - seq.blocks > self.free_blocks:
                # no KV room for its whole prompt: the queue waits. Admitting on the first chunk alone
                # lets a long prompt that cannot finish its prefill preempt itself step after step.
                break
            self.waiting.popleft()
            if p.error_rate and seq.first_scheduled is None and self.rng.random() < p.error_rate:
                seq.finish = Finish.ERROR
                seq.finished_at = now
                seq.first_scheduled = now
                report.finished.append(seq)
                continue
            self.free_blocks -= need
            seq.blocks += need
            seq.computed = start_at
            seq.cached_tokens = max(seq.cached_tokens, cached)
            if seq.first_scheduled is None:
                seq.first_scheduled = now
            self.running.append(seq)
            report.admitted.append(seq)
            scheduled.append(seq)
            chunks[id(seq)] = chunk
            budget -= chunk
        # 3. cost of the step
        for seq in scheduled:
            chunk = chunks[id(seq)]
            if seq.target_len - seq.computed > 1 or seq.generated == 0:
                report.prefill_tokens += chunk
                report.context_seqs += 1
            else:
                report.decode_seqs += 1
        scale = self.gpu_time_scale(now) if self.gpu_time_scale is not None else 1.0
        report.gpu_weights = p.step_base * p.decode_slowdown * scale
        report.gpu_prefill = p.step_per_prefill_token * report.prefill_tokens * scale
        report.gpu_decode = p.step_per_decode_seq * report.decode_seqs * scale
        report.host = p.host_step
        report.end = now + (report.gpu_weights + report.gpu_prefill + report.gpu_decode + report.host)
        report.scheduled = scheduled
        self._pending = (report, chunks)
        return report

    def complete(self) -> StepReport:
        """Finish the planned step at its end time: compute KV, emit tokens, retire sequences."""
        if self._pending is None:
            raise RuntimeError("plan() a step first")
        report, chunks = self._pending
        self._pending = None
        end = report.end
        self.step_count += 1
        for seq in report.scheduled:
            if seq.finish is not None or seq not in self.running:
                continue  # aborted during the step
            seq.computed += chunks[id(seq)]
            if seq.computed < seq.target_len:
                continue  # a prefill chunk that did not reach the end of the prompt
            if seq.generated == 0 and seq.prefix_key and self.params.enable_prefix_caching:
                self._prefix_store(seq)
            seq.generated += 1
            seq.token_times.append(end)
            if seq.first_token is None:
                seq.first_token = end
            seq.last_token = end
            report.new_tokens.append(seq)
            if seq.listener:
                seq.listener(seq, "token")
            if seq.generated >= seq.limit or seq.prompt_tokens + seq.generated >= self.params.max_model_len:
                seq.finish = Finish.STOP if seq.generated >= seq.output_tokens else Finish.LENGTH
                seq.finished_at = end
                self.running.remove(seq)
                self._free(seq)
                report.finished.append(seq)
        for seq in report.finished:
            if seq.listener:
                seq.listener(seq, "finish")
        report.running = len(self.running)
        report.waiting = len(self.waiting)
        report.used_blocks = self.used_blocks
        return report

    # -- prefix cache -----------------------------------------------------------------------
    def _prefix_lookup(self, seq: Sequence, report: StepReport) -> int:
        if not self.params.enable_prefix_caching:
            return 0
        report.prefix_queries += seq.prompt_tokens
        if not seq.prefix_key or seq.prefix_key not in self._prefix_cache:
            return 0
        self._prefix_cache.move_to_end(seq.prefix_key)
        cached = min(self._prefix_cache[seq.prefix_key], seq.prefix_tokens, seq.prompt_tokens - 1)
        cached -= cached % self.params.block_size  # only full blocks are shared
        report.prefix_hits += cached
        return max(cached, 0)

    def _prefix_store(self, seq: Sequence) -> None:
        assert seq.prefix_key is not None
        self._prefix_cache[seq.prefix_key] = max(self._prefix_cache.get(seq.prefix_key, 0), seq.prefix_tokens)
        self._prefix_cache.move_to_end(seq.prefix_key)
        while len(self._prefix_cache) > self.params.prefix_cache_entries:
            self._prefix_cache.popitem(last=False)
