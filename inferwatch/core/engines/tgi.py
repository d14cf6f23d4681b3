"""Hugging Face TGI 3.x (``text-generation-launcher``, v3 backend): launch flags, knobs, defaults.

Every flag also reads an environment variable (``--max-concurrent-requests`` /
``MAX_CONCURRENT_REQUESTS``); prefix caching and prefill chunking are environment-only. The
launcher accepts only the kebab-case spellings. ``GET /info`` reveals few of these settings
(``max_concurrent_requests``, ``max_input_tokens``, ``max_total_tokens``) since v2.3.
"""

from __future__ import annotations

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile, Flag, FlagKind, Knob

FLAGS: tuple[Flag, ...] = (
    Flag(
        Knob.QUANTIZATION,
        ("--quantize",),
        FlagKind.STR,
        None,
        "weight quantization (awq, gptq, marlin, eetq, exl2, fp8, bitsandbytes-nf4, ...)",
        env="QUANTIZE",
        default_note="unset: the checkpoint's quantization_config",
    ),
    Flag(
        Knob.KV_CACHE_DTYPE,
        ("--kv-cache-dtype",),
        FlagKind.STR,
        None,
        "KV-cache dtype: fp8_e4m3fn or fp8_e5m2 (CUDA)",
        env="KV_CACHE_DTYPE",
        choices=("fp8_e4m3fn", "fp8_e5m2"),
        default_note="unset: the model's dtype",
    ),
    Flag(
        Knob.PREFIX_CACHING,
        ("PREFIX_CACHING",),
        FlagKind.BOOL,
        True,
        "prefix caching (environment variable only)",
        env="PREFIX_CACHING",
        default_note="on unless the model or attention backend rules it out (VLMs, LoRA, paged attention)",
    ),
    Flag(
        Knob.ADMISSION,
        ("--max-concurrent-requests",),
        FlagKind.INT,
        128,
        "requests in flight at most; beyond it HTTP 429 (overloaded)",
        env="MAX_CONCURRENT_REQUESTS",
    ),
    Flag(
        Knob.CONCURRENCY,
        ("--max-batch-size",),
        FlagKind.INT,
        None,
        "requests per batch at most",
        env="MAX_BATCH_SIZE",
        default_note="unset: limited by --max-batch-total-tokens (KV tokens) only",
    ),
    Flag(
        Knob.GPU_MEMORY,
        ("--cuda-memory-fraction",),
        FlagKind.FLOAT,
        1.0,
        "share of the visible GPU memory the shard may use",
        env="CUDA_MEMORY_FRACTION",
    ),
    Flag(
        Knob.SPECULATIVE_DECODING,
        ("--speculate",),
        FlagKind.INT,
        None,
        "tokens speculated per step (n-gram, or Medusa/MLP-speculator heads)",
        env="SPECULATE",
    ),
    Flag(
        Knob.TENSOR_PARALLEL,
        ("--num-shard",),
        FlagKind.INT,
        None,
        "shards (tensor-parallel ranks)",
        env="NUM_SHARD",
        default_note="unset: every visible GPU",
    ),
    Flag(
        Knob.CHUNKED_PREFILL,
        ("PREFILL_CHUNKING",),
        FlagKind.BOOL,
        True,
        "prefill chunking (environment variable only; on since 3.0)",
        env="PREFILL_CHUNKING",
    ),
    Flag(
        Knob.PREFILL_BUDGET,
        ("--max-batch-prefill-tokens",),
        FlagKind.INT,
        None,
        "tokens per prefill step",
        env="MAX_BATCH_PREFILL_TOKENS",
        default_note="unset: estimated at start-up, else 4096",
    ),
    Flag(
        Knob.MAX_CONTEXT,
        ("--max-total-tokens",),
        FlagKind.INT,
        None,
        "prompt + max_new_tokens per request at most",
        env="MAX_TOTAL_TOKENS",
    ),
)

UNSUPPORTED: dict[str, str] = {
    V.TIME_TO_FIRST_TOKEN.key: "TGI has no time-to-first-token metric; per-request TTFT comes from its "
    "traces (collector). Left absent rather than estimated.",
    V.REQUEST_PREFILL.key: "TGI records prefill time per batch step (tgi_batch_inference_duration), not per request.",
    V.REQUEST_DECODE.key: "TGI has no per-request decode time.",
    V.PREEMPTIONS.key: "TGI does not count preemptions.",
    V.PREFIX_CACHE_QUERIED_TOKENS.key: "TGI exposes no prefix-cache metric.",
    V.PREFIX_CACHE_HIT_TOKENS.key: "TGI exposes no prefix-cache metric.",
    V.SPEC_DECODE_DRAFT_TOKENS.key: "TGI reports only accepted speculative tokens, not drafts.",
    V.LORA_ADAPTER_ACTIVE.key: "TGI's metrics name no LoRA adapter; the collector stores each request's "
    "adapter_id from its traces.",
    V.LORA_ADAPTERS_MAX.key: "TGI's metrics name no LoRA adapter; the collector stores each request's "
    "adapter_id from its traces.",
}

UNLABELLED: dict[str, str] = {
    V.LABEL_DP_RANK: "TGI has no data-parallel ranks: one router serves one model, sharded by tensor "
    "parallelism (--num-shard); scale out with replicas (instances) instead.",
}


PROFILE = EngineProfile(
    name=V.ENGINE_TGI,
    title="TGI",
    commands=(("text-generation-launcher",),),
    images=("text-generation-inference",),
    model_flags=("--model-id",),
    flags=FLAGS,
    unsupported=UNSUPPORTED,
    unlabelled=UNLABELLED,
    knobs={
        Knob.QUANTIZATION: "--quantize awq (or gptq, marlin, fp8; bitsandbytes-nf4 for very low memory)",
        Knob.KV_CACHE_DTYPE: "--kv-cache-dtype fp8_e4m3fn",
        Knob.PREFIX_CACHING: "PREFIX_CACHING=1 (needs the flashinfer or flashdecoding attention)",
        Knob.CONCURRENCY: "--max-batch-size (and --max-batch-total-tokens on non-flash models)",
        Knob.ADMISSION: "--max-concurrent-requests",
        Knob.GPU_MEMORY: "--cuda-memory-fraction (TGI_WIGGLE_ROOM keeps 10 % spare)",
        Knob.SPECULATIVE_DECODING: "--speculate 2 (or a Medusa model)",
        Knob.TENSOR_PARALLEL: "--num-shard",
        Knob.CHUNKED_PREFILL: "PREFILL_CHUNKING=1 with --max-batch-prefill-tokens",
        Knob.PREFILL_BUDGET: "--max-batch-prefill-tokens",
        Knob.MAX_CONTEXT: "--max-input-tokens and --max-total-tokens",
    },
    always_on={Knob.CONTINUOUS_BATCHING: "always on (the router batches continuously)"},
)
