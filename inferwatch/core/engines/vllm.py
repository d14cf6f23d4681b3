"""vLLM (V1 engine, 0.11–0.33): launch flags, knobs and defaults.

``FlexibleArgumentParser`` accepts ``_`` for ``-`` in flag names (``--max_num_seqs``) and every
boolean has a ``--no-`` form. Defaults that moved between releases say so in ``default_note``.
"""

from __future__ import annotations

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile, Flag, FlagKind, Knob


def _flag_style(name: str) -> str:
    if not name.startswith("--"):
        return name
    head, dot, rest = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


FLAGS: tuple[Flag, ...] = (
    Flag(
        Knob.QUANTIZATION,
        ("--quantization", "-q"),
        FlagKind.STR,
        None,
        "weight quantization method (awq, gptq, fp8, compressed-tensors, ...)",
        default_note="unset: the checkpoint's quantization_config, else unquantized",
    ),
    Flag(
        Knob.KV_CACHE_DTYPE,
        ("--kv-cache-dtype",),
        FlagKind.STR,
        "auto",
        "KV-cache storage dtype (auto = the model's; fp8 halves the cache)",
    ),
    Flag(
        Knob.PREFIX_CACHING,
        ("--enable-prefix-caching",),
        FlagKind.BOOL,
        True,
        "reuse KV blocks of shared prompt prefixes",
        negations=("--no-enable-prefix-caching",),
        default_note="on for generative models in V1",
    ),
    Flag(
        Knob.CONCURRENCY,
        ("--max-num-seqs",),
        FlagKind.INT,
        256,
        "sequences in one scheduler step (the running batch) at most",
        default_note="256; 1024 on GPUs with >= 70 GiB other than A100; 128 x TP x PP on CPU",
    ),
    Flag(
        Knob.ADMISSION,
        ("--max-num-queued-reqs",),
        FlagKind.INT,
        None,
        "waiting + running requests at most; beyond it HTTP 503 (0.33)",
    ),
    Flag(
        Knob.GPU_MEMORY,
        ("--gpu-memory-utilization", "--device-memory-utilization"),
        FlagKind.FLOAT,
        0.92,
        "share of the GPU's total memory this instance may use (weights, activations, KV cache)",
        default_note="0.9 up to 0.19, 0.92 from 0.20",
    ),
    Flag(
        Knob.SPECULATIVE_DECODING,
        ("--speculative-config", "-sc"),
        FlagKind.JSON,
        None,
        'speculative decoding, e.g. {"method": "ngram", "num_speculative_tokens": 4}',
    ),
    Flag(Knob.TENSOR_PARALLEL, ("--tensor-parallel-size", "-tp"), FlagKind.INT, 1, "GPUs the model is sharded over"),
    Flag(
        Knob.CHUNKED_PREFILL,
        ("--enable-chunked-prefill",),
        FlagKind.BOOL,
        True,
        "split long prompts across scheduler steps",
        negations=("--no-enable-chunked-prefill",),
        default_note="on for generative models in V1",
    ),
    Flag(
        Knob.PREFILL_BUDGET,
        ("--max-num-batched-tokens",),
        FlagKind.INT,
        2048,
        "tokens per scheduler step (the prefill chunk budget)",
        default_note="2048; 8192 on GPUs with >= 70 GiB other than A100",
    ),
    Flag(Knob.MAX_CONTEXT, ("--max-model-len",), FlagKind.STR, None, "prompt + output tokens per request at most"),
    Flag(
        Knob.PRIORITY,
        ("--scheduling-policy",),
        FlagKind.STR,
        "fcfs",
        "fcfs, or priority (the request's priority field, lower first)",
        choices=("fcfs", "priority"),
    ),
)

PROFILE = EngineProfile(
    name=V.ENGINE_VLLM,
    title="vLLM",
    commands=(
        ("vllm", "serve"),
        ("python", "-m", "vllm.entrypoints.openai.api_server"),
        ("python3", "-m", "vllm.entrypoints.openai.api_server"),
    ),
    images=("vllm/vllm-openai", "vllm-openai"),
    model_flags=("--model",),
    flags=FLAGS,
    knobs={
        Knob.QUANTIZATION: "serve a quantized checkpoint (AWQ/GPTQ INT4, or FP8 on Hopper) or --quantization fp8",
        Knob.KV_CACHE_DTYPE: "--kv-cache-dtype fp8",
        Knob.PREFIX_CACHING: "--enable-prefix-caching",
        Knob.CONCURRENCY: "--max-num-seqs",
        Knob.ADMISSION: "--max-num-queued-reqs (0.33)",
        Knob.GPU_MEMORY: "--gpu-memory-utilization (or --kv-cache-memory-bytes)",
        Knob.SPECULATIVE_DECODING: '--speculative-config \'{"method": "ngram", "num_speculative_tokens": 4}\'',
        Knob.TENSOR_PARALLEL: "--tensor-parallel-size",
        Knob.CHUNKED_PREFILL: "--enable-chunked-prefill with --max-num-batched-tokens",
        Knob.PREFILL_BUDGET: "--max-num-batched-tokens",
        Knob.MAX_CONTEXT: "--max-model-len",
        Knob.PRIORITY: "--scheduling-policy priority",
    },
    always_on={Knob.CONTINUOUS_BATCHING: "always on (the V1 scheduler batches per iteration)"},
    flag_style=_flag_style,
    concurrency_not_a_batch_cap="cache_config_info's kv_cache_max_concurrency is the KV cache's room for requests "
    "of the full context length; shorter requests run far more at once (max_num_seqs is not exported)",
)
