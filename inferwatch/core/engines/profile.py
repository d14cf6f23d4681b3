"""The shape of an engine profile: knobs, launch flags and what the engine cannot tell."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Knob(StrEnum):
    """A kind of tuning knob; each engine spells it its own way (or lacks it)."""

    QUANTIZATION = "quantization"
    """weight quantization method."""
    KV_CACHE_DTYPE = "kv_cache_dtype"
    CONTINUOUS_BATCHING = "continuous_batching"
    PREFIX_CACHING = "prefix_caching"
    CONCURRENCY = "concurrency"
    """the cap on sequences in the running batch (vLLM max_num_seqs)."""
    ADMISSION = "admission"
    """the cap on requests accepted at once, beyond which the engine refuses (shed load early)."""
    GPU_MEMORY = "gpu_memory"
    """the share of GPU memory the engine (or its KV cache) may use."""
    SPECULATIVE_DECODING = "speculative_decoding"
    TENSOR_PARALLEL = "tensor_parallel"
    CHUNKED_PREFILL = "chunked_prefill"
    PREFILL_BUDGET = "prefill_budget"
    """tokens per scheduler step (the chunk size of chunked prefill)."""
    MAX_CONTEXT = "max_context"
    PRIORITY = "priority"
    """request priority in the scheduler."""


class FlagKind(StrEnum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"
    JSON = "json"


@dataclass(frozen=True)
class Flag:
    """One launch option (a command-line flag, an environment variable, or a config-file key)."""

    knob: Knob
    names: tuple[str, ...]
    """every spelling the engine accepts (``--tensor-parallel-size``, ``-tp``); none for a switch that can only
    be turned off (its ``negations``)."""
    kind: FlagKind
    default: str | float | bool | None
    """the engine's default (``None``: unset, or it depends on the hardware; see ``default_note``)."""
    meaning: str
    env: str | None = None
    negations: tuple[str, ...] = ()
    """spellings that set a boolean to false (``--no-enable-prefix-caching``)."""
    choices: tuple[str, ...] = ()
    default_note: str = ""

    @property
    def name(self) -> str:
        """The first spelling (of a negation when only the off switch exists: SGLang's --disable-radix-cache)."""
        return (self.names or self.negations)[0]


@dataclass(frozen=True)
class EngineProfile:
    """Everything about one engine that is not a metric mapping."""

    name: str
    """the canonical engine name (the ``engine`` label)."""
    title: str
    commands: tuple[tuple[str, ...], ...]
    """the command lines that start it (``("vllm", "serve")``); the first is the usual one."""
    images: tuple[str, ...] = ()
    """substrings of container image names whose entrypoint is the engine (``docker run IMAGE ARGS``)."""
    model_flags: tuple[str, ...] = ()
    """flags that name the model (``--model-id``); otherwise the first positional argument does."""
    flags: tuple[Flag, ...] = ()
    knobs: Mapping[Knob, str] = field(default_factory=dict)
    """how to turn each knob on this engine, as an operator would type it."""
    always_on: Mapping[Knob, str] = field(default_factory=dict)
    """knobs that cannot be turned off, and why (continuous batching)."""
    build_time: Mapping[Knob, str] = field(default_factory=dict)
    """knobs fixed when the engine is built, not at launch (Triton's TensorRT engines)."""
    unsupported: Mapping[str, str] = field(default_factory=dict)
    """canonical metric key -> why this engine cannot provide it (the coverage matrix's reasons)."""
    unlabelled: Mapping[str, str] = field(default_factory=dict)
    """canonical label (beyond ``engine`` and ``model``) -> why this engine's series do not carry it."""
    bucketless: Mapping[str, str] = field(default_factory=dict)
    """canonical histogram key -> why only its sum and count come through (no buckets): its mean can be
    drawn, its percentiles and distribution cannot."""
    flag_style: Callable[[str], str] = str
    """normalises a typed flag name to the spelling in ``flags`` (vLLM accepts ``_`` for ``-``)."""
    concurrency_not_a_batch_cap: str | None = None
    """why the ``max_concurrency`` this engine reports does not cap its running batch (``None``: it does);
    the headroom model then does not bound the latency limits by it."""

    def flag(self, knob: Knob) -> Flag | None:
        return next((f for f in self.flags if f.knob is knob), None)

    def knob(self, knob: Knob) -> str | None:
        return self.knobs.get(knob)
