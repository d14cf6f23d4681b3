"""KV-cache capacity planning: the formula, config.json, the memory budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferwatch.core.capacity import (
    GIB,
    CapacityError,
    ModelShape,
    Plan,
    kv_bytes,
    load_config,
    plan_capacity,
    shape_from_config,
    supported_concurrency,
)

# A 13B Llama-style model (Llama-2-13b's config.json, abridged).
LLAMA_13B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "max_position_embeddings": 4096,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "num_key_value_heads": 40,
    "torch_dtype": "float16",
    "vocab_size": 32000,
}


def test_the_worked_13b_example() -> None:
    """40 layers, 40 KV heads, head dim 128, sequence 2048, batch 10, FP16: about 17 GB (16.8e9 bytes)."""
    total = kv_bytes(layers=40, kv_heads=40, head_dim=128, seq_len=2048, batch=10, bytes_per_element=2)
    assert total == 16_777_216_000
    assert round(total / 1e9, 1) == 16.8
    shape = shape_from_config(LLAMA_13B)
    assert (shape.layers, shape.kv_heads, shape.head_dim) == (40, 40, 128)
    report = plan_capacity(Plan(shape=shape, max_model_len=2048))
    assert report.kv_bytes_per_token == 819_200  # 800 KiB per token
    assert report.kv_bytes_per_sequence is not None
    assert report.kv_bytes_per_sequence * 10 == total


def test_parameters_estimated_from_the_config() -> None:
    shape = shape_from_config(LLAMA_13B)
    assert shape.parameters is not None
    assert 12.9e9 < shape.parameters < 13.1e9  # Llama-2-13b has 13.0B parameters


def test_memory_budget_gives_tokens_and_sequences() -> None:
    shape = shape_from_config(LLAMA_13B)
    plan = Plan(
        shape=shape,
        max_model_len=4096,
        gpu_memory_bytes=80 * GIB,
        gpu_memory_utilization=0.9,
        weights_bytes=26e9,
        block_size=16,
        average_sequence_tokens=1000,
    )
    report = plan_capacity(plan)
    budget = 80 * GIB * 0.9 - 26e9
    assert report.kv_budget_bytes_per_gpu == pytest.approx(budget)
    assert report.kv_tokens == int(budget // (819_200 * 16)) * 16
    assert report.max_sequences_at_max_len == report.kv_tokens // 4096
    assert report.max_sequences_at_average == report.kv_tokens // 1008  # 1000 tokens take 63 blocks of 16


def test_fp8_cache_halves_the_bytes_and_tensor_parallel_splits_heads() -> None:
    shape = ModelShape(layers=32, kv_heads=8, head_dim=128, dtype="bfloat16")
    fp16 = plan_capacity(Plan(shape=shape))
    fp8 = plan_capacity(Plan(shape=shape, kv_dtype="fp8"))
    assert fp8.kv_bytes_per_token * 2 == fp16.kv_bytes_per_token
    tp4 = plan_capacity(Plan(shape=shape, tensor_parallel_size=4))
    assert tp4.kv_bytes_per_token_per_gpu * 4 == tp4.kv_bytes_per_token
    tp16 = plan_capacity(Plan(shape=shape, tensor_parallel_size=16))
    assert tp16.kv_bytes_per_token_per_gpu * 8 == tp16.kv_bytes_per_token  # 8 heads on 16 GPUs: replicated
    assert any("replica" in n for n in tp16.notes)


def test_weights_that_do_not_fit_leave_no_cache() -> None:
    shape = shape_from_config(LLAMA_13B)
    report = plan_capacity(Plan(shape=shape, gpu_memory_bytes=16 * GIB, weights_bytes=26e9))
    assert report.kv_tokens == 0
    assert any("quantize" in n for n in report.notes)


def test_grouped_query_attention_and_defaults() -> None:
    cfg = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    shape = shape_from_config(cfg)
    assert (shape.kv_heads, shape.head_dim, shape.dtype) == (8, 128, "float16")
    no_gqa = shape_from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 128})
    assert no_gqa.kv_heads == 4 and no_gqa.head_dim == 32


def test_multimodal_text_config() -> None:
    cfg = {"architectures": ["X"], "text_config": {**LLAMA_13B}}
    assert shape_from_config(cfg).layers == 40


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_attention_heads": 4, "hidden_size": 128}, "num_hidden_layers is missing"),
        ({"num_hidden_layers": 2, "hidden_size": 128}, "num_attention_heads is missing"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4}, "neither head_dim nor hidden_size"),
        ({"num_hidden_layers": "2", "num_attention_heads": 4, "hidden_size": 128}, "num_hidden_layers must be"),
        ({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 128}, "not a multiple"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 128, "torch_dtype": "q9"}, "torch_dtype"),
    ],
)
def test_a_wrong_config_names_the_field(config: dict[str, object], message: str) -> None:
    with pytest.raises(CapacityError, match=message):
        shape_from_config(config)


def test_plan_validation_names_the_field() -> None:
    shape = ModelShape(layers=2, kv_heads=2, head_dim=32)
    with pytest.raises(CapacityError, match="gpu_memory_utilization"):
        Plan(shape=shape, gpu_memory_utilization=1.5)
    with pytest.raises(CapacityError, match="kv_dtype"):
        Plan(shape=shape, kv_dtype="fp7")
    with pytest.raises(CapacityError, match="layers"):
        ModelShape(layers=0, kv_heads=2, head_dim=32)


def test_load_config_file_and_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_13B))
    assert load_config(tmp_path).layers == 40
    assert load_config(tmp_path / "config.json").kv_heads == 40
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(CapacityError, match="not valid JSON"):
        load_config(tmp_path / "bad.json")
    with pytest.raises(CapacityError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_supported_concurrency() -> None:
    # the real vLLM CPU run: 12 blocks of 128 tokens, ~400-token sequences take 4 blocks each
    assert supported_concurrency(12 * 128, 400, block_size=128) == 3
    with pytest.raises(CapacityError):
        supported_concurrency(100, 0)
