"""The tuning checklist per target, from exposed signals and from launch lines."""

from __future__ import annotations

from inferwatch.collector.diagnosis.report import TargetChecklist
from inferwatch.collector.diagnosis.signals import Observation, TargetKey, TargetSignals
from inferwatch.collector.diagnosis.tuning import evaluate
from inferwatch.core import vocabulary as V
from inferwatch.core.capacity import ModelShape
from inferwatch.core.checklist import Check, Verdict
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.engines.launch import parse_launch
from inferwatch.core.symptoms import Signal

PROFILES = builtin_profiles()


def vllm_target(**signals: float) -> TargetSignals:
    target = TargetSignals(TargetKey(V.ENGINE_VLLM, "meta-llama/Llama-3.1-8B-Instruct", "h:9400"))
    target.info = {
        V.LABEL_PREFIX_CACHING: V.TRUE,
        V.LABEL_GPU_MEMORY_UTILIZATION: "0.92",
        V.LABEL_KV_CACHE_DTYPE: "auto",
    }
    target.info_query = "info query"
    for name, value in signals.items():
        target.put(Signal(name), value, f"q:{name}")
    return target


def verdicts(result: TargetChecklist) -> dict[Check, Verdict]:
    return {item.check: item.verdict for item in result.items}


def test_from_metrics_alone() -> None:
    got = verdicts(evaluate(vllm_target(preemption_rate=0.0, waiting=0.0, running=3.0), PROFILES[V.ENGINE_VLLM]))
    assert got[Check.CONTINUOUS_BATCHING] is Verdict.PASS
    assert got[Check.PREFIX_CACHING] is Verdict.PASS
    assert got[Check.GPU_MEMORY_UTILIZATION] is Verdict.PASS
    assert got[Check.CONCURRENCY_LIMIT] is Verdict.PASS
    assert got[Check.SPECULATIVE_DECODING] is Verdict.FAIL  # vLLM registers its counters only when on
    assert got[Check.QUANTIZED] is Verdict.UNKNOWN  # not in the metrics, no launch line
    assert got[Check.TENSOR_PARALLEL] is Verdict.UNKNOWN
    assert got[Check.QUANTIZATION_METHOD] is Verdict.UNKNOWN


def test_preempting_fails_the_concurrency_check_with_a_number() -> None:
    target = vllm_target(
        preemption_rate=2.0, kv_capacity=16384, prompt_tokens_mean=400, request_rate=8, generation_rate=5600
    )
    result = evaluate(target, PROFILES[V.ENGINE_VLLM])
    item = next(i for i in result.items if i.check is Check.CONCURRENCY_LIMIT)
    assert item.verdict is Verdict.FAIL
    assert item.remedy is not None and "lower it to about 14" in item.remedy and "--max-num-seqs" in item.remedy
    assert any("preemptions/s" in e for e in item.evidence)


def test_launch_line_with_defaults() -> None:
    launch = parse_launch(
        "vllm serve Qwen/Qwen2.5-7B-Instruct-AWQ --max-num-seqs 512 --gpu-memory-utilization 0.7 "
        "--no-enable-prefix-caching -tp 3",
        PROFILES,
    )
    target = TargetSignals(TargetKey(V.ENGINE_VLLM, "qwen", "h:9400"))
    result = evaluate(
        target,
        PROFILES[V.ENGINE_VLLM],
        launch=launch,
        gpu="A100 80GB",
        shape=ModelShape(layers=28, kv_heads=4, head_dim=128),
    )
    got = verdicts(result)
    assert got[Check.QUANTIZED] is Verdict.PASS  # the model name says AWQ
    assert got[Check.PREFIX_CACHING] is Verdict.FAIL
    assert got[Check.GPU_MEMORY_UTILIZATION] is Verdict.FAIL
    assert got[Check.SPECULATIVE_DECODING] is Verdict.FAIL
    assert got[Check.TENSOR_PARALLEL] is Verdict.FAIL
    assert got[Check.QUANTIZATION_METHOD] is Verdict.PASS
    tp = next(i for i in result.items if i.check is Check.TENSOR_PARALLEL)
    assert any("power of two" in e for e in tp.evidence) and any("KV heads" in e for e in tp.evidence)
    memory = next(i for i in result.items if i.check is Check.GPU_MEMORY_UTILIZATION)
    assert memory.remedy is not None and "--gpu-memory-utilization" in memory.remedy


def test_fp8_on_an_older_gpu_fails() -> None:
    launch = parse_launch("vllm serve m --quantization fp8", PROFILES)
    target = TargetSignals(TargetKey(V.ENGINE_VLLM, "m", "h"))
    a100 = verdicts(evaluate(target, PROFILES[V.ENGINE_VLLM], launch=launch, gpu="A100"))
    h100 = verdicts(evaluate(target, PROFILES[V.ENGINE_VLLM], launch=launch, gpu="H100"))
    assert a100[Check.QUANTIZATION_METHOD] is Verdict.FAIL
    assert h100[Check.QUANTIZATION_METHOD] is Verdict.PASS


def test_triton_build_time_knobs_are_unknown() -> None:
    launch = parse_launch("tritonserver --model-repository=/m gpt_model_type=V1", PROFILES)
    target = TargetSignals(TargetKey(V.ENGINE_TRITON, "ensemble", "h"))
    got = verdicts(evaluate(target, PROFILES[V.ENGINE_TRITON], launch=launch))
    assert got[Check.CONTINUOUS_BATCHING] is Verdict.FAIL  # V1 = static batching
    assert got[Check.QUANTIZED] is Verdict.UNKNOWN
    assert got[Check.TENSOR_PARALLEL] is Verdict.UNKNOWN


def test_spec_decode_counters_pass() -> None:
    target = vllm_target()
    target.spec_decode = Observation(120.0, "drafts query")
    got = verdicts(evaluate(target, PROFILES[V.ENGINE_VLLM]))
    assert got[Check.SPECULATIVE_DECODING] is Verdict.PASS
