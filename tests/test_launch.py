"""Launch command lines read as the engines read them: flags, spellings, environment, defaults."""

from __future__ import annotations

import pytest

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.engines.launch import LaunchError, parse_launch
from inferwatch.core.engines.profile import Knob

PROFILES = builtin_profiles()


def test_vllm_serve_flags_and_defaults() -> None:
    cfg = parse_launch(
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 512 --gpu-memory-utilization 0.7 "
        "--kv-cache-dtype fp8 -tp 2 --no-enable-prefix-caching --port 8000",
        PROFILES,
    )
    assert cfg.engine == V.ENGINE_VLLM
    assert cfg.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert cfg.value(Knob.CONCURRENCY) == 512
    assert cfg.value(Knob.GPU_MEMORY) == 0.7
    assert cfg.value(Knob.KV_CACHE_DTYPE) == "fp8"
    assert cfg.value(Knob.TENSOR_PARALLEL) == 2
    assert cfg.value(Knob.PREFIX_CACHING) is False
    prefix = cfg.get(Knob.PREFIX_CACHING)
    assert prefix is not None and prefix.source == "--no-enable-prefix-caching"
    # absent flags take vLLM's defaults
    chunked = cfg.get(Knob.CHUNKED_PREFILL)
    assert chunked is not None and chunked.value is True and not chunked.explicit
    assert cfg.value(Knob.CONTINUOUS_BATCHING) is True
    assert "--port" in cfg.unknown


def test_vllm_underscore_spellings_equals_form_and_json() -> None:
    cfg = parse_launch(
        "python3 -m vllm.entrypoints.openai.api_server --model m --max_num_seqs=64 "
        """--speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'""",
        PROFILES,
    )
    assert cfg.engine == V.ENGINE_VLLM and cfg.model == "m"
    assert cfg.value(Knob.CONCURRENCY) == 64
    assert cfg.value(Knob.SPECULATIVE_DECODING) == {"method": "ngram", "num_speculative_tokens": 4}


def test_tgi_launcher_env_and_docker() -> None:
    cfg = parse_launch(
        "PREFIX_CACHING=0 text-generation-launcher --model-id bigscience/bloom-560m --max-concurrent-requests 256 "
        "--quantize awq --num-shard 2",
        PROFILES,
    )
    assert cfg.engine == V.ENGINE_TGI and cfg.model == "bigscience/bloom-560m"
    assert cfg.value(Knob.ADMISSION) == 256
    assert cfg.value(Knob.QUANTIZATION) == "awq"
    assert cfg.value(Knob.PREFIX_CACHING) is False
    assert cfg.value(Knob.CHUNKED_PREFILL) is True  # PREFILL_CHUNKING's default since 3.0
    docker = parse_launch(
        "docker run --gpus all --shm-size 1g -p 8080:80 -e MAX_CONCURRENT_REQUESTS=64 -v $PWD/data:/data "
        "ghcr.io/huggingface/text-generation-inference:3.3.4 --model-id HuggingFaceH4/zephyr-7b-beta",
        PROFILES,
    )
    assert docker.engine == V.ENGINE_TGI and docker.model == "HuggingFaceH4/zephyr-7b-beta"
    admission = docker.get(Knob.ADMISSION)
    assert admission is not None and admission.value == 64 and admission.source == "env MAX_CONCURRENT_REQUESTS"


def test_llama_server_flags_env_and_docker() -> None:
    cfg = parse_launch(
        "llama-server -m model.gguf --parallel 4 --ctx-size 8192 -ngl 99 --cont-batching --cache-type-k q8_0 "
        "--metrics --port 8080",
        PROFILES,
    )
    assert cfg.engine == V.ENGINE_LLAMACPP and cfg.model == "model.gguf"
    assert cfg.value(Knob.CONCURRENCY) == 4
    assert cfg.value(Knob.MAX_CONTEXT) == 8192
    assert cfg.value(Knob.GPU_MEMORY) == 99
    assert cfg.value(Knob.CONTINUOUS_BATCHING) is True
    assert cfg.value(Knob.KV_CACHE_DTYPE) == "q8_0"
    assert "--port" in cfg.unknown
    short = parse_launch("./llama-server -hf ggml-org/gemma-3-1b-it-GGUF -np 2 -c 4096 -nocb -ub 256", PROFILES)
    assert short.engine == V.ENGINE_LLAMACPP and short.model == "ggml-org/gemma-3-1b-it-GGUF"
    assert short.value(Knob.CONCURRENCY) == 2 and short.value(Knob.MAX_CONTEXT) == 4096
    assert short.value(Knob.CONTINUOUS_BATCHING) is False
    assert short.value(Knob.CHUNKED_PREFILL) == 256
    batch = short.get(Knob.PREFILL_BUDGET)  # absent: llama-server's default logical batch
    assert batch is not None and batch.value == 2048 and not batch.explicit
    docker = parse_launch(
        "docker run --gpus all -p 8080:8080 -v /models:/models -e LLAMA_ARG_N_PARALLEL=8 "
        "ghcr.io/ggml-org/llama.cpp:server-cuda -m /models/qwen2.5-7b-instruct-q4_k_m.gguf -ngl 99 --metrics",
        PROFILES,
    )
    assert docker.engine == V.ENGINE_LLAMACPP and docker.model == "/models/qwen2.5-7b-instruct-q4_k_m.gguf"
    parallel = docker.get(Knob.CONCURRENCY)
    assert parallel is not None and parallel.value == 8 and parallel.source == "env LLAMA_ARG_N_PARALLEL"


def test_trtllm_serve_and_yaml_keys() -> None:
    cfg = parse_launch(
        "trtllm-serve nvidia/Llama-3.1-8B-Instruct-FP8 --max_batch_size 128 --tp_size 2 "
        "--kv_cache_free_gpu_memory_fraction 0.85 kv_cache_config.enable_block_reuse=false",
        PROFILES,
    )
    assert cfg.engine == V.ENGINE_TRTLLM and cfg.model == "nvidia/Llama-3.1-8B-Instruct-FP8"
    assert cfg.value(Knob.CONCURRENCY) == 128
    assert cfg.value(Knob.GPU_MEMORY) == 0.85
    assert cfg.value(Knob.PREFIX_CACHING) is False
    assert cfg.value(Knob.CHUNKED_PREFILL) is False  # trtllm-serve's default


def test_triton_config_parameters_and_build_time_knobs() -> None:
    cfg = parse_launch(
        "tritonserver --model-repository=/models gpt_model_type=inflight_fused_batching enable_kv_cache_reuse=true",
        PROFILES,
    )
    assert cfg.engine == V.ENGINE_TRITON and cfg.model == "/models"
    assert cfg.value(Knob.CONTINUOUS_BATCHING) == "inflight_fused_batching"
    quant = cfg.get(Knob.QUANTIZATION)
    assert quant is not None and quant.source == "fixed" and "built" in quant.note


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("vllm serve m --max-num-seqs lots", "--max-num-seqs: expected an integer, got 'lots'"),
        ("vllm serve m --gpu-memory-utilization", "--gpu-memory-utilization: expected a value"),
        ("vllm serve m --speculative-config '[1]'", "--speculative-config: expected a JSON object"),
        ("vllm serve m --scheduling-policy lifo", "not one of fcfs, priority"),
        ("trtllm-serve m --kv_cache_dtype int3", "--kv_cache_dtype: 'int3' is not one of"),
        ("ollama serve", "cannot tell which engine"),
        ("docker run -p 1:1 busybox:latest", "not a known engine image"),
        ("vllm serve 'unclosed", "cannot split"),
        ("", "empty"),
    ],
)
def test_errors_name_the_flag(line: str, message: str) -> None:
    with pytest.raises(LaunchError, match=message.replace("(", r"\(")):
        parse_launch(line, PROFILES)


def test_sglang_launch_server_flags_and_defaults() -> None:
    cfg = parse_launch(
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --tp 2 "
        "--mem-fraction-static 0.8 --max-running-requests 64 --chunked-prefill-size 4096 "
        "--kv-cache-dtype fp8_e4m3 --speculative-algorithm EAGLE --disable-radix-cache --port 30000",
        PROFILES,
    )
    assert cfg.engine == V.ENGINE_SGLANG
    assert cfg.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert cfg.value(Knob.TENSOR_PARALLEL) == 2
    assert cfg.value(Knob.GPU_MEMORY) == 0.8
    assert cfg.value(Knob.CONCURRENCY) == 64
    assert cfg.value(Knob.PREFILL_BUDGET) == 4096
    assert cfg.value(Knob.KV_CACHE_DTYPE) == "fp8_e4m3"
    assert cfg.value(Knob.SPECULATIVE_DECODING) == "EAGLE"
    # sized at start-up when unset: no made-up default
    budget = parse_launch("python3 -m sglang.launch_server --model m", PROFILES).get(Knob.CONCURRENCY)
    assert budget is not None and budget.value is None and not budget.explicit
    # prefix caching has no enabling flag, only the one that turns it off; on by default
    assert cfg.value(Knob.PREFIX_CACHING) is False and "--disable-radix-cache" not in cfg.unknown
    default = parse_launch("python3 -m sglang.launch_server --model m", PROFILES).get(Knob.PREFIX_CACHING)
    assert default is not None and default.value is True and not default.explicit
    assert "--disable-radix-cache" in (PROFILES[V.ENGINE_SGLANG].knob(Knob.PREFIX_CACHING) or "")
    assert cfg.value(Knob.CONTINUOUS_BATCHING) is True


def test_sglang_serve_and_docker_image() -> None:
    cfg = parse_launch("sglang serve --model-path Qwen/Qwen2.5-7B-Instruct --tensor-parallel-size 4", PROFILES)
    assert cfg.engine == V.ENGINE_SGLANG and cfg.model == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg.value(Knob.TENSOR_PARALLEL) == 4
    docker = parse_launch(
        "docker run --gpus all -p 30000:30000 lmsysorg/sglang:latest python3 -m sglang.launch_server "
        "--model Qwen/Qwen2.5-7B-Instruct --tp-size 2 --max-queued-requests 128",
        PROFILES,
    )
    assert docker.engine == V.ENGINE_SGLANG and docker.model == "Qwen/Qwen2.5-7B-Instruct"
    assert docker.value(Knob.ADMISSION) == 128


def test_engine_given_for_an_unknown_wrapper() -> None:
    cfg = parse_launch("./start-server.sh --max-num-seqs 32", PROFILES, engine=V.ENGINE_VLLM)
    assert cfg.value(Knob.CONCURRENCY) == 32
    with pytest.raises(LaunchError, match="unknown engine"):
        parse_launch("x", PROFILES, engine="lmdeploy")


def test_every_profile_spells_every_remedy_knob_it_claims() -> None:
    for profile in PROFILES.values():
        assert profile.commands, profile.name
        for flag in profile.flags:
            assert (flag.names or flag.negations) and flag.meaning, (profile.name, flag)
        assert Knob.CONTINUOUS_BATCHING in profile.always_on or profile.flag(Knob.CONTINUOUS_BATCHING), profile.name
