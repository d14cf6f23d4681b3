"""Triton Inference Server with the TensorRT-LLM backend: the knobs of its model configuration.

Runtime knobs are ``parameters`` of the ``tensorrt_llm`` model's ``config.pbtxt`` (filled with
``tools/fill_template.py key:value,...``, accepted here as ``key=value``); quantization, the KV
dtype, tensor parallelism, batch size and context length are fixed when the engine is built.
"""

from __future__ import annotations

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile, Flag, FlagKind, Knob

FLAGS: tuple[Flag, ...] = (
    Flag(
        Knob.CONTINUOUS_BATCHING,
        ("gpt_model_type",),
        FlagKind.STR,
        None,
        "inflight_fused_batching or inflight_batching (continuous), V1 (static batches)",
        choices=("inflight_fused_batching", "inflight_batching", "V1", "v1"),
    ),
    Flag(
        Knob.PREFIX_CACHING,
        ("enable_kv_cache_reuse",),
        FlagKind.BOOL,
        True,
        "reuse KV blocks across requests",
        default_note="false up to backend v0.18, true from v0.19",
    ),
    Flag(
        Knob.GPU_MEMORY,
        ("kv_cache_free_gpu_mem_fraction",),
        FlagKind.FLOAT,
        0.9,
        "share of the memory left free after the engine loads that the KV cache takes",
    ),
    Flag(Knob.CONCURRENCY, ("triton_max_batch_size", "max_batch_size"), FlagKind.INT, None, "Triton's batch size"),
    Flag(Knob.ADMISSION, ("max_queue_size",), FlagKind.INT, None, "queued requests at most; beyond it rejected"),
    Flag(
        Knob.CHUNKED_PREFILL,
        ("enable_chunked_context",),
        FlagKind.BOOL,
        False,
        "chunked context (needs an engine built with paged context FMHA)",
    ),
    Flag(
        Knob.SPECULATIVE_DECODING,
        ("decoding_mode",),
        FlagKind.STR,
        None,
        "top_k_top_p, beam_search, medusa, redrafter, lookahead, eagle",
    ),
)

UNSUPPORTED: dict[str, str] = {
    V.TIME_PER_OUTPUT_TOKEN.key: "Triton's TensorRT-LLM backend exports no per-token latency.",
    V.INTER_TOKEN_LATENCY.key: "Triton's TensorRT-LLM backend exports no per-token latency.",
    V.REQUEST_PREFILL.key: "Only per-request output tensors carry phase timestamps.",
    V.REQUEST_DECODE.key: "Only per-request output tensors carry phase timestamps.",
    V.PREEMPTIONS.key: "Not counted (paused_requests is a gauge of the current iteration).",
    V.PREFIX_CACHE_QUERIED_TOKENS.key: "Only reused blocks are exported, no lookups or misses.",
    V.SPEC_DECODE_DRAFT_TOKENS.key: "Speculative-decoding stats are not exported by the backend.",
    V.SPEC_DECODE_ACCEPTED_TOKENS.key: "Speculative-decoding stats are not exported by the backend.",
    V.LORA_ADAPTER_ACTIVE.key: "The TensorRT-LLM backend's metrics name no LoRA adapter.",
    V.LORA_ADAPTERS_MAX.key: "The TensorRT-LLM backend's metrics name no LoRA adapter.",
}

UNLABELLED: dict[str, str] = {
    V.LABEL_DP_RANK: "The TensorRT-LLM backend labels its metrics by model and version, not by data-parallel rank.",
}

BUCKETLESS: dict[str, str] = {
    V.REQUEST_DURATION.key: "Triton reports the request duration as cumulative microseconds (sum and count), "
    "without buckets: its mean is exact, but no percentile, distribution or latency-SLO share can be computed.",
    V.REQUEST_QUEUE.key: "Triton reports the queue time as cumulative microseconds (sum and count), without "
    "buckets: its mean is exact, but no percentile, distribution or latency-SLO share can be computed.",
}


PROFILE = EngineProfile(
    name=V.ENGINE_TRITON,
    title="Triton (TensorRT-LLM backend)",
    commands=(
        ("tritonserver",),
        ("python3", "scripts/launch_triton_server.py"),
        ("python", "scripts/launch_triton_server.py"),
    ),
    images=("tritonserver", "tensorrtllm_backend"),
    model_flags=("--model-repository", "--model_repo", "--model-repo"),
    flags=FLAGS,
    unsupported=UNSUPPORTED,
    unlabelled=UNLABELLED,
    bucketless=BUCKETLESS,
    knobs={
        Knob.QUANTIZATION: "rebuild the engine from a quantized checkpoint (quantize.py --qformat fp8 or int4_awq)",
        Knob.KV_CACHE_DTYPE: "rebuild with quantize.py --kv_cache_dtype fp8",
        Knob.PREFIX_CACHING: "enable_kv_cache_reuse:true in the tensorrt_llm config.pbtxt",
        Knob.CONCURRENCY: "rebuild with trtllm-build --max_batch_size; triton_max_batch_size",
        Knob.ADMISSION: "max_queue_size in the tensorrt_llm config.pbtxt",
        Knob.GPU_MEMORY: "kv_cache_free_gpu_mem_fraction (or max_tokens_in_paged_kv_cache)",
        Knob.SPECULATIVE_DECODING: "build with --speculative_decoding_mode and set decoding_mode",
        Knob.TENSOR_PARALLEL: "rebuild with --tp_size and launch with --world_size",
        Knob.CHUNKED_PREFILL: "enable_chunked_context:true (engine built with paged context FMHA)",
        Knob.MAX_CONTEXT: "rebuild with --max_seq_len / --max_input_len",
        Knob.PRIORITY: "batch_scheduler_policy (capacity policy only, no request priority)",
    },
    build_time={
        Knob.QUANTIZATION: "fixed when the TensorRT engine is built (quantize.py --qformat)",
        Knob.KV_CACHE_DTYPE: "fixed when the TensorRT engine is built (quantize.py --kv_cache_dtype)",
        Knob.TENSOR_PARALLEL: "fixed when the TensorRT engine is built (--tp_size)",
        Knob.MAX_CONTEXT: "fixed when the TensorRT engine is built (--max_seq_len)",
    },
)
