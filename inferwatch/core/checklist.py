"""The tuning checklist: the questions to ask of every engine deployment, as data.

The diagnosis answers each per target (``pass``/``fail``/``unknown``) from what the engine exposes
and, when given, its launch line; the runbooks print the questions. Ids are stable API values.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from inferwatch.core.engines.profile import Knob
from inferwatch.core.symptoms import Remedy


class Check(StrEnum):
    QUANTIZED = "quantized"
    CONTINUOUS_BATCHING = "continuous_batching"
    PREFIX_CACHING = "prefix_caching"
    CONCURRENCY_LIMIT = "concurrency_limit"
    GPU_MEMORY_UTILIZATION = "gpu_memory_utilization"
    SPECULATIVE_DECODING = "speculative_decoding"
    TENSOR_PARALLEL = "tensor_parallel"
    QUANTIZATION_METHOD = "quantization_method"
    GPU_HEALTHY = "gpu_healthy"


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CheckSpec:
    id: Check
    question: str
    remedy: Remedy


MIN_GPU_MEMORY_UTILIZATION: Final = 0.85
"""below this share the engine leaves memory idle that the KV cache could use."""

QUANTIZATION_ADVICE: Final = (
    "AWQ INT4 in general, FP8 on Hopper (H100/H200) and newer, bitsandbytes INT4 only for very low memory"
)

CHECKLIST: Final[tuple[CheckSpec, ...]] = (
    CheckSpec(
        Check.QUANTIZED,
        "Is the model quantized?",
        Remedy("serve a quantized checkpoint: more memory for the KV cache, faster decode", (Knob.QUANTIZATION,)),
    ),
    CheckSpec(
        Check.CONTINUOUS_BATCHING,
        "Is continuous batching on?",
        Remedy("use in-flight (continuous) batching", (Knob.CONTINUOUS_BATCHING,)),
    ),
    CheckSpec(
        Check.PREFIX_CACHING,
        "Is prefix caching on?",
        Remedy("enable prefix caching so shared prompt prefixes are computed once", (Knob.PREFIX_CACHING,)),
    ),
    CheckSpec(
        Check.CONCURRENCY_LIMIT,
        "Is the concurrency limit sensible for the KV cache?",
        Remedy("set the concurrency limit to what the KV cache holds without preempting", (Knob.CONCURRENCY,)),
    ),
    CheckSpec(
        Check.GPU_MEMORY_UTILIZATION,
        "Is GPU memory utilization high enough?",
        Remedy(f"raise GPU memory utilization to at least {MIN_GPU_MEMORY_UTILIZATION}", (Knob.GPU_MEMORY,)),
    ),
    CheckSpec(
        Check.SPECULATIVE_DECODING,
        "Is speculative decoding on?",
        Remedy("enable speculative decoding for decode-bound, latency-sensitive traffic", (Knob.SPECULATIVE_DECODING,)),
    ),
    CheckSpec(
        Check.TENSOR_PARALLEL,
        "Is the tensor-parallel split sensible?",
        Remedy(
            "shard over a power of two of GPUs in one node that divides the KV heads; no more GPUs than memory needs",
            (Knob.TENSOR_PARALLEL,),
        ),
    ),
    CheckSpec(
        Check.QUANTIZATION_METHOD,
        "Is the quantization method right for the hardware?",
        Remedy(QUANTIZATION_ADVICE, (Knob.QUANTIZATION,)),
    ),
    CheckSpec(
        Check.GPU_HEALTHY,
        "Do the GPUs hold their clocks, without XID errors?",
        Remedy(
            "fix the cooling or the power cap of a throttled GPU; drain a GPU with a critical XID and reset or "
            "replace it (the gpu_throttled and gpu_errors runbooks)"
        ),
    ),
)
