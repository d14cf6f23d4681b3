"""SGLang (``python -m sglang.launch_server``): launch flags, knobs, defaults, and the signals it lacks.

Source: sgl-project/sglang ``python/sglang/srt/server_args.py`` at
001067fffe33427bee0ed2f007fb7551a1d76b44 (the ``ServerArgs`` dataclass: each field is a flag, its
name with ``-`` for ``_``, plus the listed aliases). That file is not stored at the metrics
fixtures' commits (44cedc2, 93d0487: the metric declarations of sglang 0.5.9 and 0.5.4 on PyPI); the flags
used here are long-standing ones of both and of sglang 0.5.23 (checked in its wheel, where the fields moved
to ``sglang/srt/arg_groups/fields/``).
``python/sglang/cli/main.py`` at 16c8ff4f96e743ce5a1dbf3f640caadd6ae32e07: ``sglang serve`` (later
releases). SGLang parses with
``argparse``, so a unique prefix of a flag is accepted: ``--tp`` and ``--dp`` (as its own docs write
them) are ``--tp-size`` and ``--dp-size``. Defaults of ``None`` are sized at start-up from the GPU's
memory (``--mem-fraction-static``, ``--max-running-requests``, ``--chunked-prefill-size``).

Prefix caching (RadixAttention) and chunked prefill have no enabling flag: they are on unless
``--disable-radix-cache`` or ``--chunked-prefill-size -1`` turn them off, which the knobs say.
"""

from __future__ import annotations

from inferwatch.core import vocabulary as V
from inferwatch.core.engines.profile import EngineProfile, Flag, FlagKind, Knob

# Time per output token is not listed below: sglang 0.5.22 and later export it
# (request_time_per_output_token_seconds, mapped). Earlier releases have only inter-token latency, so
# there it is absent and the fleet queries fall back on inferwatch proxy's measurement at run time.

FLAGS: tuple[Flag, ...] = (
    Flag(
        Knob.QUANTIZATION,
        ("--quantization",),
        FlagKind.STR,
        None,
        "weight quantization method (fp8, awq, gptq, w8a8_fp8, modelopt_fp4, ...)",
        default_note="unset: the checkpoint's quantization_config, else unquantized",
    ),
    Flag(
        Knob.KV_CACHE_DTYPE,
        ("--kv-cache-dtype",),
        FlagKind.STR,
        "auto",
        "KV-cache storage dtype (auto = the model's; fp8_e4m3 / fp8_e5m2 halve the cache)",
    ),
    Flag(
        Knob.CONCURRENCY,
        ("--max-running-requests",),
        FlagKind.INT,
        None,
        "requests in the running batch at most",
        default_note="unset: sized from the KV pool at start-up",
    ),
    Flag(
        Knob.ADMISSION,
        ("--max-queued-requests",),
        FlagKind.INT,
        None,
        "requests waiting in the queue at most; beyond it the request is rejected (ignored with P/D disaggregation)",
    ),
    Flag(
        Knob.GPU_MEMORY,
        ("--mem-fraction-static",),
        FlagKind.FLOAT,
        None,
        "share of GPU memory for the static allocation (weights and the KV-cache pool)",
        default_note="unset: chosen at start-up from the GPU's memory and the parallelism",
    ),
    Flag(
        Knob.SPECULATIVE_DECODING,
        ("--speculative-algorithm",),
        FlagKind.STR,
        None,
        "speculative decoding (EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM), tuned by the --speculative-* flags",
    ),
    Flag(
        Knob.TENSOR_PARALLEL,
        ("--tp-size", "--tensor-parallel-size", "--tp"),
        FlagKind.INT,
        1,
        "GPUs the model is sharded over",
    ),
    Flag(
        Knob.PREFIX_CACHING,
        (),
        FlagKind.BOOL,
        True,
        "RadixAttention: requests reuse the KV cache of the prefixes they share",
        negations=("--disable-radix-cache",),
        default_note="on unless --disable-radix-cache (there is no flag that turns it on)",
    ),
    Flag(
        Knob.PREFILL_BUDGET,
        ("--chunked-prefill-size",),
        FlagKind.INT,
        None,
        "tokens per prefill chunk (-1 disables chunked prefill)",
        default_note="unset: chosen at start-up from the GPU's memory",
    ),
    Flag(
        Knob.MAX_CONTEXT,
        ("--context-length",),
        FlagKind.INT,
        None,
        "prompt + output tokens per request at most",
        default_note="unset: the model's config.json",
    ),
    Flag(
        Knob.PRIORITY,
        ("--enable-priority-scheduling",),
        FlagKind.BOOL,
        False,
        "schedule by the request's priority field (higher first unless --schedule-low-priority-values-first)",
    ),
)

_STAGES = (
    "SGLang has no per-request {phase} histogram; per_stage_req_latency_seconds times the scheduler's "
    "internal stages and is not turned into one."
)
_SPEC = (
    "SGLang reports speculative decoding only as gauges averaged over the last log interval "
    "(spec_accept_length, spec_accept_rate), not as token counters."
)

UNSUPPORTED: dict[str, str] = {
    V.REQUEST_PREFILL.key: _STAGES.format(phase="prefill-time"),
    V.REQUEST_DECODE.key: _STAGES.format(phase="decode-time"),
    V.SPEC_DECODE_DRAFT_TOKENS.key: _SPEC,
    V.SPEC_DECODE_ACCEPTED_TOKENS.key: _SPEC,
    V.LORA_ADAPTER_ACTIVE.key: "SGLang counts occupied LoRA slots (lora_pool_slots_used) but names no adapter.",
    V.ENGINE_INFO.key: "SGLang's metrics carry no version or configuration series (cache_config_info holds the "
    "page size and page count only).",
}

PROFILE = EngineProfile(
    name=V.ENGINE_SGLANG,
    title="SGLang",
    commands=(
        ("python", "-m", "sglang.launch_server"),
        ("python3", "-m", "sglang.launch_server"),
        ("sglang", "serve"),
    ),
    images=("lmsysorg/sglang",),
    model_flags=("--model-path", "--model"),
    flags=FLAGS,
    knobs={
        Knob.QUANTIZATION: "serve a quantized checkpoint or --quantization fp8",
        Knob.KV_CACHE_DTYPE: "--kv-cache-dtype fp8_e4m3",
        Knob.PREFIX_CACHING: "on by default (RadixAttention); --disable-radix-cache turns it off",
        Knob.CONCURRENCY: "--max-running-requests",
        Knob.ADMISSION: "--max-queued-requests",
        Knob.GPU_MEMORY: "--mem-fraction-static (or --max-total-tokens)",
        Knob.SPECULATIVE_DECODING: "--speculative-algorithm EAGLE with --speculative-draft-model-path, "
        "--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens",
        Knob.TENSOR_PARALLEL: "--tp-size (and --dp-size, --enable-dp-attention for data parallelism)",
        Knob.CHUNKED_PREFILL: "on by default; --chunked-prefill-size sets the chunk (-1 turns it off)",
        Knob.PREFILL_BUDGET: "--chunked-prefill-size (and --max-prefill-tokens per prefill batch)",
        Knob.MAX_CONTEXT: "--context-length",
        Knob.PRIORITY: "--enable-priority-scheduling (or --schedule-policy lpm for prefix-aware order)",
    },
    always_on={Knob.CONTINUOUS_BATCHING: "always on (the scheduler batches per iteration)"},
    unsupported=UNSUPPORTED,
)
