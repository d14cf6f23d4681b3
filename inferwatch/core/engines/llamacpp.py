"""llama.cpp's HTTP server (``llama-server``): launch flags, knobs, defaults, and what it cannot tell.

Flag spellings and environment variables follow ggml-org/llama.cpp ``common/arg.cpp``, read at the
stored version 145b6280d6aa1890e22457143dad0badb3fd6820 (``-c``, ``-b``, ``-ub``, ``-np``,
``-cb``/``-nocb``, ``-ngl``, ``--cache-reuse``, ``--metrics`` and their ``LLAMA_ARG_*`` variables;
``--cache-type-k``, ``--model-draft``, ``-m`` and ``-hf`` were not re-read there). The server of the
fixtures is ``tools/server/server.cpp`` at aa6192d38defc9a5d9fb2987413f71b18f214270. A flag on the
command line wins over its environment variable. Defaults that moved between builds (``--ctx-size``,
``--parallel``, ``--n-gpu-layers``) are left unset with a note.

The server's ``/metrics`` (``--metrics``) has no labels at all, no latency histograms and, since the
metrics rework, no KV-cache gauge; ``inferwatch proxy`` in front of it measures what it lacks.
"""

from __future__ import annotations

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile, Flag, FlagKind, Knob

FLAGS: tuple[Flag, ...] = (
    Flag(
        Knob.CONCURRENCY,
        ("--parallel", "-np"),
        FlagKind.INT,
        None,
        "server slots: requests decoded together; the others wait (requests_deferred)",
        env="LLAMA_ARG_N_PARALLEL",
        default_note="1 in older builds; newer builds pick it automatically (-1)",
    ),
    Flag(
        Knob.MAX_CONTEXT,
        ("--ctx-size", "-c"),
        FlagKind.INT,
        None,
        "KV-cache cells for all slots together (each slot gets ctx-size / parallel unless --kv-unified)",
        env="LLAMA_ARG_CTX_SIZE",
        default_note="4096 in older builds; 0 (the model's training context) in newer ones",
    ),
    Flag(
        Knob.KV_CACHE_DTYPE,
        ("--cache-type-k", "-ctk"),
        FlagKind.STR,
        "f16",
        "K-cache data type",
        env="LLAMA_ARG_CACHE_TYPE_K",
        choices=("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
    ),
    Flag(
        Knob.GPU_MEMORY,
        ("--n-gpu-layers", "-ngl", "--gpu-layers"),
        FlagKind.INT,
        None,
        "layers offloaded to the GPU (the rest run on the CPU)",
        env="LLAMA_ARG_N_GPU_LAYERS",
        default_note="unset: none in older builds, all that fit in newer ones",
    ),
    Flag(
        Knob.CONTINUOUS_BATCHING,
        ("--cont-batching", "-cb"),
        FlagKind.BOOL,
        True,
        "continuous (dynamic) batching across slots",
        env="LLAMA_ARG_CONT_BATCHING",
        negations=("--no-cont-batching", "-nocb"),
    ),
    Flag(
        Knob.PREFILL_BUDGET,
        ("--batch-size", "-b"),
        FlagKind.INT,
        2048,
        "logical batch: prompt tokens submitted per llama_decode() call",
        env="LLAMA_ARG_BATCH",
    ),
    Flag(
        Knob.CHUNKED_PREFILL,
        ("--ubatch-size", "-ub"),
        FlagKind.INT,
        512,
        "physical batch: tokens computed per step (prompts are processed in chunks of this size)",
        env="LLAMA_ARG_UBATCH",
    ),
    Flag(
        Knob.SPECULATIVE_DECODING,
        ("--model-draft", "-md"),
        FlagKind.STR,
        None,
        "draft model for speculative decoding (with --draft-max / --draft-min)",
        env="LLAMA_ARG_MODEL_DRAFT",
    ),
    Flag(
        Knob.PREFIX_CACHING,
        ("--cache-reuse",),
        FlagKind.INT,
        0,
        "minimum chunk to reuse from the slot's cache by KV shifting (the prompt prefix is always "
        "reused unless a request sets cache_prompt=false)",
        env="LLAMA_ARG_CACHE_REUSE",
    ),
)

UNSUPPORTED: dict[str, str] = {
    V.TIME_TO_FIRST_TOKEN.key: "llama-server has no latency histogram; inferwatch proxy in front of it measures TTFT.",
    V.TIME_PER_OUTPUT_TOKEN.key: "llama-server has no per-request latency; inferwatch proxy measures TPOT.",
    V.REQUEST_DURATION.key: "llama-server has no per-request latency; inferwatch proxy measures the duration.",
    V.REQUEST_QUEUE.key: "llama-server counts deferred requests (a gauge) but not how long they waited.",
    V.REQUEST_PREFILL.key: "llama-server sums prompt time over all prompt tokens (prompt_seconds_total), with "
    "no count of requests: a time per prompt token, not per request.",
    V.REQUEST_DECODE.key: "llama-server sums generation time with a count of tokens, not of requests; it comes "
    "through as the inter-token latency's sum and count.",
    V.REQUEST_PROMPT_TOKENS.key: "llama-server has no per-request token histograms.",
    V.REQUEST_GENERATION_TOKENS.key: "llama-server has no per-request token histograms.",
    V.REQUESTS.key: "llama-server counts no finished requests (nor their outcomes); inferwatch proxy counts them.",
    V.PREEMPTIONS.key: "llama-server does not preempt: a request keeps its slot until it ends (a full context is "
    "shifted or truncated, not evicted).",
    V.KV_CACHE_CAPACITY.key: "llama-server exports no KV capacity; it is --ctx-size (per slot: /props "
    "default_generation_settings.n_ctx).",
    V.LORA_ADAPTER_ACTIVE.key: "llama-server's metrics name no LoRA adapter (adapters are global, /lora-adapters).",
    V.LORA_ADAPTERS_MAX.key: "llama-server's metrics name no LoRA adapter (adapters are global, /lora-adapters).",
}

UNLABELLED: dict[str, str] = {
    V.LABEL_MODEL: "llama-server's series carry no labels at all; the model comes from /props "
    "(model_alias, else model_path), as /v1/models names it.",
    V.LABEL_DP_RANK: "llama-server has no data-parallel ranks: one process serves one model with --parallel "
    "slots; scale out with instances.",
    V.LABEL_ROLE: "llama-server has no prefill/decode disaggregation: every instance is unified.",
}

BUCKETLESS: dict[str, str] = {
    V.INTER_TOKEN_LATENCY.key: "llama-server reports generation time and generated tokens as two counters "
    "(tokens_predicted_seconds_total, tokens_predicted_total): the mean time per generated token is exact, "
    "no percentile, distribution or latency-SLO share can be computed.",
}


PROFILE = EngineProfile(
    name=V.ENGINE_LLAMACPP,
    title="llama.cpp server",
    commands=(("llama-server",), ("./llama-server",), ("./build/bin/llama-server",)),
    images=("ggml-org/llama.cpp:server", "ggerganov/llama.cpp:server"),
    model_flags=("--model", "-m", "--hf-repo", "-hf"),
    flags=FLAGS,
    unsupported=UNSUPPORTED,
    unlabelled=UNLABELLED,
    bucketless=BUCKETLESS,
    knobs={
        Knob.QUANTIZATION: "a lower-bit GGUF (llama-quantize to Q4_K_M or Q5_K_M)",
        Knob.KV_CACHE_DTYPE: "--cache-type-k q8_0 --cache-type-v q8_0 (the V cache needs --flash-attn)",
        Knob.PREFIX_CACHING: "cache_prompt=true per request (default) and --cache-reuse 256",
        Knob.CONCURRENCY: "--parallel (each slot gets --ctx-size / --parallel tokens)",
        Knob.GPU_MEMORY: "-ngl 99 (offload every layer), --ctx-size to bound the KV cache",
        Knob.SPECULATIVE_DECODING: "--model-draft with --draft-max 16",
        Knob.CHUNKED_PREFILL: "--ubatch-size",
        Knob.PREFILL_BUDGET: "--batch-size",
        Knob.MAX_CONTEXT: "--ctx-size (divided among --parallel slots)",
        Knob.CONTINUOUS_BATCHING: "--cont-batching (on by default)",
    },
    always_on={
        Knob.PREFIX_CACHING: "each slot reuses the cached prefix of its previous prompt (cache_prompt=true "
        "by default; the real b11312 capture served 2,766 of 4,617 prompt tokens from it)",
    },
)
