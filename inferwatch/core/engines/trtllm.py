"""TensorRT-LLM's ``trtllm-serve`` (LLM API, PyTorch backend): launch flags, knobs, defaults.

Options are click options spelled with underscores, exactly as listed. Most tuning lives in the
YAML given with ``--config``/``--extra_llm_api_options`` (``kv_cache_config.enable_block_reuse``,
``enable_chunked_prefill``, ``speculative_config``); those keys are accepted here as ``key=value``
too. Quantization comes from a pre-quantized checkpoint, not from a flag.
"""

from __future__ import annotations

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile, Flag, FlagKind, Knob

FLAGS: tuple[Flag, ...] = (
    Flag(
        Knob.KV_CACHE_DTYPE,
        ("--kv_cache_dtype", "kv_cache_config.dtype"),
        FlagKind.STR,
        "auto",
        "KV-cache dtype: auto, fp8 or nvfp4",
        choices=("auto", "fp8", "nvfp4"),
    ),
    Flag(
        Knob.PREFIX_CACHING,
        ("kv_cache_config.enable_block_reuse",),
        FlagKind.BOOL,
        True,
        "reuse KV blocks across requests (YAML key)",
    ),
    Flag(
        Knob.CONCURRENCY,
        ("--max_batch_size", "max_batch_size"),
        FlagKind.INT,
        2048,
        "requests scheduled per iteration at most",
    ),
    Flag(
        Knob.GPU_MEMORY,
        (
            "--kv_cache_free_gpu_memory_fraction",
            "--free_gpu_memory_fraction",
            "kv_cache_config.free_gpu_memory_fraction",
        ),
        FlagKind.FLOAT,
        0.9,
        "share of the memory left free after the weights that the KV cache takes",
    ),
    Flag(
        Knob.SPECULATIVE_DECODING,
        ("speculative_config",),
        FlagKind.JSON,
        None,
        "speculative decoding (YAML: decoding_type, max_draft_len, speculative_model)",
    ),
    Flag(
        Knob.TENSOR_PARALLEL,
        ("--tp_size", "--tensor_parallel_size", "tensor_parallel_size"),
        FlagKind.INT,
        1,
        "GPUs the model is sharded over",
    ),
    Flag(
        Knob.CHUNKED_PREFILL,
        ("--enable_chunked_prefill", "enable_chunked_prefill"),
        FlagKind.BOOL,
        False,
        "split long prompts across iterations",
    ),
    Flag(
        Knob.PREFILL_BUDGET,
        ("--max_num_tokens", "max_num_tokens"),
        FlagKind.INT,
        8192,
        "tokens batched per iteration at most",
    ),
    Flag(Knob.MAX_CONTEXT, ("--max_seq_len", "max_seq_len"), FlagKind.INT, None, "sequence length at most"),
)

UNSUPPORTED: dict[str, str] = {
    V.INTER_TOKEN_LATENCY.key: "trtllm-serve exports only the per-request mean (time per output token).",
    V.REQUEST_PROMPT_TOKENS.key: "trtllm-serve has token counters but no per-request token histogram.",
    V.REQUEST_GENERATION_TOKENS.key: "trtllm-serve has token counters but no per-request token histogram.",
    V.PREEMPTIONS.key: "No TensorRT-LLM metric counts preemptions (num_paused_requests is a gauge).",
    V.LORA_ADAPTER_ACTIVE.key: "Neither trtllm-serve's metrics nor its iteration stats name LoRA adapters.",
    V.LORA_ADAPTERS_MAX.key: "Neither trtllm-serve's metrics nor its iteration stats name LoRA adapters.",
}

UNLABELLED: dict[str, str] = {
    V.LABEL_DP_RANK: "trtllm-serve's Prometheus metrics carry no data-parallel rank; only its JSON iteration "
    "stats are per attention-DP rank, and they label just the signals the Prometheus page lacks, and only "
    "when several ranks report.",
}


PROFILE = EngineProfile(
    name=V.ENGINE_TRTLLM,
    title="TensorRT-LLM (trtllm-serve)",
    commands=(("trtllm-serve", "serve"), ("trtllm-serve",)),
    model_flags=(),
    flags=FLAGS,
    unsupported=UNSUPPORTED,
    unlabelled=UNLABELLED,
    knobs={
        Knob.QUANTIZATION: "serve a pre-quantized checkpoint (ModelOpt FP8 on Hopper, NVFP4 on Blackwell, INT4 AWQ)",
        Knob.KV_CACHE_DTYPE: "--kv_cache_dtype fp8 (YAML kv_cache_config.dtype: fp8)",
        Knob.PREFIX_CACHING: "YAML kv_cache_config.enable_block_reuse: true",
        Knob.CONCURRENCY: "--max_batch_size",
        Knob.GPU_MEMORY: "--kv_cache_free_gpu_memory_fraction (YAML kv_cache_config.free_gpu_memory_fraction)",
        Knob.SPECULATIVE_DECODING: "YAML speculative_config: {decoding_type: Eagle3, max_draft_len: 3, ...}",
        Knob.TENSOR_PARALLEL: "--tp_size",
        Knob.CHUNKED_PREFILL: "--enable_chunked_prefill with --max_num_tokens",
        Knob.PREFILL_BUDGET: "--max_num_tokens",
        Knob.MAX_CONTEXT: "--max_seq_len",
    },
    always_on={Knob.CONTINUOUS_BATCHING: "always on (in-flight batching)"},
)
