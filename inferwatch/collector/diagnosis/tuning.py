"""The tuning checklist per target: pass, fail or unknown, each with its evidence (pure: no I/O).

Evidence comes from what the engine exposes (its info series, speculative-decoding counters, the
window's preemptions and queue), the GPUs beneath it (throttling, XID errors) and, when the user gives
it, the launch line (:func:`inferwatch.core.engines.launch.parse_launch`), whose absent flags count at
the engine's defaults. What neither reveals is ``unknown``, never assumed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.collector.diagnosis import dcgm, gpu
from inferwatch.collector.diagnosis.evaluate import remedy_text
from inferwatch.collector.diagnosis.report import CheckResult, TargetChecklist
from inferwatch.collector.diagnosis.signals import TargetSignals
from inferwatch.core import vocabulary as V
from inferwatch.core.capacity import ModelShape, supported_concurrency
from inferwatch.core.causes import xid_meaning
from inferwatch.core.checklist import CHECKLIST, MIN_GPU_MEMORY_UTILIZATION, Check, CheckSpec, Verdict
from inferwatch.core.engines.launch import LaunchConfig, Setting
from inferwatch.core.engines.profile import EngineProfile, Knob
from inferwatch.core.symptoms import Signal, Symptom, catalogue

QUANTIZED_NAME = re.compile(r"(awq|gptq|fp8|fp4|nvfp4|int4|int8|w4a16|w8a8|gguf|bnb|4bit|8bit|exl2|marlin|mxfp4)", re.I)
FP8_METHODS = ("fp8", "fbgemm_fp8", "modelopt", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel")
INT4_METHODS = (
    "awq",
    "auto_awq",
    "awq_marlin",
    "gptq",
    "auto_gptq",
    "gptq_marlin",
    "marlin",
    "compressed-tensors",
    "eetq",
)
BNB_METHODS = ("bitsandbytes", "bitsandbytes-nf4", "bitsandbytes-fp4")
FP8_GPUS = ("h100", "h200", "h800", "gh200", "b100", "b200", "gb200", "b300", "l4", "l40", "rtx 40", "rtx 50", "ada")
"""GPUs with FP8 tensor cores (compute capability 8.9 and newer)."""
LOW_MEMORY_GB = 24


@dataclass(frozen=True)
class Context:
    target: TargetSignals
    profile: EngineProfile | None
    launch: LaunchConfig | None
    gpu: str | None
    shape: ModelShape | None


Result = tuple[Verdict, list[str], str | None]
"""verdict, evidence, and an extra remark for the remedy."""


def _setting_text(setting: Setting) -> str:
    value = setting.value
    if value is True or value is False:
        shown: object = "on" if value else "off"
    elif value is None:
        shown = "unset"
    elif isinstance(value, float) and value.is_integer():
        shown = int(value)
    else:
        shown = value
    where = setting.source if setting.source not in ("default", "fixed") else f"{setting.source}"
    note = f" ({setting.note})" if setting.note else ""
    return f"{setting.knob.value} = {shown} [{where}]{note}"


def _info(ctx: Context, label: str) -> str | None:
    value = ctx.target.info.get(label)
    return None if value in (None, "", V.UNKNOWN) else value


def _quantized(ctx: Context) -> Result:
    setting = ctx.launch.get(Knob.QUANTIZATION) if ctx.launch else None
    if setting is not None and setting.source == "fixed":
        return Verdict.UNKNOWN, [_setting_text(setting)], None
    if setting is not None and setting.explicit and setting.value:
        return Verdict.PASS, [_setting_text(setting)], None
    model = (ctx.launch.model if ctx.launch and ctx.launch.model else None) or ctx.target.key.model
    match = QUANTIZED_NAME.search(model or "")
    if match:
        return Verdict.PASS, [f"the model name {model!r} says {match.group(1)}"], None
    if ctx.launch is not None:
        return Verdict.FAIL, [f"no quantization flag and the model name {model!r} names no quantized format"], None
    return Verdict.UNKNOWN, ["not in the engine's metrics; give the launch line"], None


def _batching(ctx: Context) -> Result:
    if ctx.profile is not None and Knob.CONTINUOUS_BATCHING in ctx.profile.always_on:
        return Verdict.PASS, [f"{ctx.profile.title}: {ctx.profile.always_on[Knob.CONTINUOUS_BATCHING]}"], None
    setting = ctx.launch.get(Knob.CONTINUOUS_BATCHING) if ctx.launch else None
    if setting is not None and isinstance(setting.value, bool):  # a switch (llama.cpp --cont-batching)
        return (Verdict.PASS if setting.value else Verdict.FAIL), [_setting_text(setting)], None
    if setting is not None and isinstance(setting.value, str):  # a batching mode (TensorRT-LLM's)
        ok = setting.value.lower().startswith("inflight")
        return (Verdict.PASS if ok else Verdict.FAIL), [_setting_text(setting)], None
    return Verdict.UNKNOWN, ["the batching mode is not exposed; give the launch line"], None


def _prefix(ctx: Context) -> Result:
    info = _info(ctx, V.LABEL_PREFIX_CACHING)
    if info is not None:
        ok = info == V.TRUE
        return (
            (Verdict.PASS if ok else Verdict.FAIL),
            [f"{V.LABEL_PREFIX_CACHING}={info} ({ctx.target.info_query})"],
            None,
        )
    if ctx.profile is not None and Knob.PREFIX_CACHING in ctx.profile.always_on:
        return Verdict.PASS, [f"{ctx.profile.title}: {ctx.profile.always_on[Knob.PREFIX_CACHING]}"], None
    setting = ctx.launch.get(Knob.PREFIX_CACHING) if ctx.launch else None
    if setting is not None and isinstance(setting.value, bool):
        return (Verdict.PASS if setting.value else Verdict.FAIL), [_setting_text(setting)], None
    return Verdict.UNKNOWN, ["prefix caching is not exposed by this engine's metrics; give the launch line"], None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _concurrency(ctx: Context) -> Result:
    t = ctx.target
    evidence: list[str] = []
    preempting = t.get(Signal.PREEMPTION_RATE)
    capacity = t.get(Signal.KV_CAPACITY)
    prompt = t.get(Signal.PROMPT_TOKENS_MEAN)
    rate, generated = t.get(Signal.REQUEST_RATE), t.get(Signal.GENERATION_RATE)
    setting = ctx.launch.get(Knob.CONCURRENCY) if ctx.launch else None
    limit = _number(setting.value) if setting else None
    if limit is None and t.get(Signal.MAX_CONCURRENCY) is not None:
        limit = t.values[Signal.MAX_CONCURRENCY].value
        evidence.append(f"concurrency limit {limit:g} ({t.info_query})")
    elif setting is not None and limit is not None:
        evidence.append(_setting_text(setting))
    fits: int | None = None
    if capacity and prompt and rate and generated and rate.value > 0:
        per_request = prompt.value + generated.value / rate.value
        fits = supported_concurrency(capacity.value, per_request)
        evidence.append(
            f"the KV cache ({capacity.value:g} tokens) holds about {fits} sequences of {per_request:.0f} tokens "
            "(this window's mean prompt + output)"
        )
    if preempting is not None and preempting.value > 0:
        evidence.insert(0, f"{preempting.value:.3g} preemptions/s in the window ({preempting.query})")
        hint = f"lower it to about {fits}" if fits else "lower it"
        return Verdict.FAIL, evidence, hint
    waiting, running, kv = t.get(Signal.WAITING), t.get(Signal.RUNNING), t.get(Signal.KV_USAGE)
    if limit and waiting and running and kv and waiting.value > 0.5 and running.value >= 0.9 * limit and kv.value < 0.7:
        evidence.insert(
            0, f"{waiting.value:.3g} waiting while {running.value:.3g} run at the limit with KV {kv.value:.0%}"
        )
        return Verdict.FAIL, evidence, "raise it: the KV cache has room for more sequences"
    if limit is not None and fits is not None and limit > 2 * fits:
        evidence.insert(0, f"the limit {limit:g} is more than twice what the KV cache holds ({fits})")
        return Verdict.FAIL, evidence, f"lower it to about {fits} before load makes the engine preempt"
    if preempting is not None and (waiting is not None or running is not None):
        evidence.insert(0, "no preemptions in the window")
        return Verdict.PASS, evidence, None
    return Verdict.UNKNOWN, evidence or ["no preemption or queue signals for this target"], None


def _memory(ctx: Context) -> Result:
    info = _info(ctx, V.LABEL_GPU_MEMORY_UTILIZATION)
    source = f"{V.LABEL_GPU_MEMORY_UTILIZATION}={info} ({ctx.target.info_query})" if info else None
    value = None
    if info is not None:
        try:
            value = float(info)
        except ValueError:
            value = None
    setting = ctx.launch.get(Knob.GPU_MEMORY) if ctx.launch else None
    if value is None and setting is not None:
        value = _number(setting.value)
        source = _setting_text(setting)
    if value is None or source is None:
        return Verdict.UNKNOWN, ["the GPU memory share is not exposed; give the launch line"], None
    verdict = Verdict.PASS if value >= MIN_GPU_MEMORY_UTILIZATION else Verdict.FAIL
    return verdict, [source], None


def _speculative(ctx: Context) -> Result:
    setting = ctx.launch.get(Knob.SPECULATIVE_DECODING) if ctx.launch else None
    if setting is not None and setting.explicit and setting.value not in (None, 0, 0.0, False):
        return Verdict.PASS, [_setting_text(setting)], None
    if ctx.target.spec_decode is not None:
        obs = ctx.target.spec_decode
        return Verdict.PASS, [f"speculative-decoding drafts counted: {obs.value:g} ({obs.query})"], None
    if setting is not None and setting.source == "fixed":
        return Verdict.UNKNOWN, [_setting_text(setting)], None
    if setting is not None:
        return Verdict.FAIL, [_setting_text(setting)], None
    reason = ctx.profile.unsupported.get(V.SPEC_DECODE_DRAFT_TOKENS.key) if ctx.profile else None
    if reason:
        return Verdict.UNKNOWN, [reason], None
    return Verdict.FAIL, ["no speculative-decoding counters: the engine registers them only when it is on"], None


def _tensor_parallel(ctx: Context) -> Result:
    setting = ctx.launch.get(Knob.TENSOR_PARALLEL) if ctx.launch else None
    if setting is None:
        return Verdict.UNKNOWN, ["the tensor-parallel size is not exposed; give the launch line"], None
    if setting.source == "fixed":
        return Verdict.UNKNOWN, [_setting_text(setting)], None
    tp = _number(setting.value)
    if tp is None:
        return Verdict.UNKNOWN, [_setting_text(setting)], None
    size = int(tp)
    evidence = [_setting_text(setting)]
    problems = []
    if size & (size - 1):
        problems.append(f"{size} is not a power of two (attention heads split unevenly)")
    if size > 8:
        problems.append(f"{size} GPUs spans more than one 8-GPU node: use pipeline parallelism across nodes")
    if ctx.shape is not None and ctx.shape.kv_heads % size and size % ctx.shape.kv_heads:
        problems.append(f"{size} does not divide the model's {ctx.shape.kv_heads} KV heads")
    if problems:
        return Verdict.FAIL, evidence + problems, None
    return Verdict.PASS, evidence, None


def _method(ctx: Context) -> Result:
    setting = ctx.launch.get(Knob.QUANTIZATION) if ctx.launch else None
    method = str(setting.value).lower() if setting is not None and setting.explicit and setting.value else None
    if method is None:
        model = (ctx.launch.model if ctx.launch and ctx.launch.model else None) or ctx.target.key.model
        match = QUANTIZED_NAME.search(model or "")
        method = match.group(1).lower() if match else None
    if method is None:
        return Verdict.UNKNOWN, ["no quantization method known (unquantized, or give the launch line)"], None
    if ctx.gpu is None:
        return Verdict.UNKNOWN, [f"method {method}; give the GPU model (e.g. --gpu H100) to judge it"], None
    gpu = ctx.gpu.lower()
    fp8_capable = any(name in gpu for name in FP8_GPUS)
    evidence = [f"method {method} on {ctx.gpu}"]
    if method in FP8_METHODS or method.startswith("fp8"):
        if fp8_capable:
            return Verdict.PASS, evidence, None
        return Verdict.FAIL, [*evidence, "FP8 needs FP8 tensor cores (Ada, Hopper or newer)"], None
    if method in BNB_METHODS or method in ("bnb", "4bit", "8bit"):
        memory = re.search(r"(\d+)\s*g", gpu)
        if memory and int(memory.group(1)) <= LOW_MEMORY_GB:
            return Verdict.PASS, [*evidence, "bitsandbytes suits very low memory"], None
        return Verdict.FAIL, [*evidence, "bitsandbytes is slow; AWQ INT4 (or FP8 on Hopper) serves faster"], None
    if fp8_capable and (method in INT4_METHODS or method in ("int4", "w4a16")):
        return Verdict.PASS, [*evidence, "works; FP8 is native on this GPU and keeps more accuracy"], None
    return Verdict.PASS, evidence, None


def _gpu(ctx: Context) -> Result:
    """The GPU findings' verdicts at the catalogue's thresholds: throttled, or a critical XID, fails."""
    t = ctx.target
    if not gpu.has_gpus(t):
        return Verdict.UNKNOWN, [dcgm.NO_GPU], None
    share, critical = t.get(Signal.GPU_THROTTLED_SHARE), t.get(Signal.GPU_XID_CRITICAL)
    limit = catalogue()[Symptom.GPU_THROTTLED].threshold.warning
    problems = [
        f"{r.gpu}: XID {r.what} ({xid_meaning(r.what)}) ({r.query})"
        for r in t.gpus.xids
        if r.what in V.GPU_XID_CRITICAL
    ]
    if share is not None and share.value > limit:
        worst = max((*t.gpus.clock_events, *t.gpus.throttle_time), key=lambda r: r.value)
        problems.append(f"{worst.gpu} throttled ({worst.what}) {share.value:.0%} of the window ({share.query})")
    if problems:
        remark = "a critical XID: drain the replica first" if critical is not None and critical.value > 0 else None
        return Verdict.FAIL, problems, remark
    if share is None:
        return Verdict.UNKNOWN, [dcgm.CANNOT_TELL_THROTTLE], None
    return (
        Verdict.PASS,
        [f"throttled {share.value:.0%} of the window (at most {limit:.0%}); no critical XID ({share.query})"],
        None,
    )


CHECKS: dict[Check, Callable[[Context], Result]] = {
    Check.QUANTIZED: _quantized,
    Check.CONTINUOUS_BATCHING: _batching,
    Check.PREFIX_CACHING: _prefix,
    Check.CONCURRENCY_LIMIT: _concurrency,
    Check.GPU_MEMORY_UTILIZATION: _memory,
    Check.SPECULATIVE_DECODING: _speculative,
    Check.TENSOR_PARALLEL: _tensor_parallel,
    Check.QUANTIZATION_METHOD: _method,
    Check.GPU_HEALTHY: _gpu,
}


def _result(spec: CheckSpec, ctx: Context) -> CheckResult:
    verdict, evidence, remark = CHECKS[spec.id](ctx)
    remedy = None
    if verdict is not Verdict.PASS:
        remedy = remedy_text(spec.remedy, ctx.profile)
        if remark:
            remedy = f"{remark}: {remedy}"
    return CheckResult(check=spec.id, question=spec.question, verdict=verdict, evidence=evidence, remedy=remedy)


def evaluate(
    target: TargetSignals,
    profile: EngineProfile | None,
    *,
    launch: LaunchConfig | None = None,
    gpu: str | None = None,
    shape: ModelShape | None = None,
) -> TargetChecklist:
    """The checklist for one target."""
    ctx = Context(target, profile, launch, gpu, shape)
    key = target.key
    items = [_result(spec, ctx) for spec in CHECKLIST]
    return TargetChecklist(engine=key.engine, model=key.model, instance=key.instance, items=items)
