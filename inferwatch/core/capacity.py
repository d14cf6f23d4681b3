"""KV-cache capacity planning: the sizing formula as code (pure functions, no I/O).

KV bytes = 2 × layers × KV heads × head dim × sequence length × batch × bytes per element: one key
and one value vector per layer, per KV head, per token. Everything here derives from that formula,
a model's ``config.json`` and the memory budget the engine gives the cache.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

GIB: Final = 1024**3
GB: Final = 1000**3

DTYPE_BYTES: Final[dict[str, float]] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "float8": 1,
    "int8": 1,
    "nvfp4": 0.5,
    "fp4": 0.5,
    "int4": 0.5,
}
"""Bytes per element by dtype name, as engines and ``config.json`` spell them."""


class CapacityError(ValueError):
    """The model description or the plan is invalid; the message names the field."""


def dtype_bytes(name: str, *, field_name: str = "dtype") -> float:
    """Bytes per element of ``name`` (``float16``, ``bf16``, ``fp8``...)."""
    key = name.strip().lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise CapacityError(f"{field_name}: unknown dtype {name!r}; known: {known}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache of a transformer depends on."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "float16"
    """the weights' dtype, which is the KV cache's unless the engine is told otherwise."""
    max_position_embeddings: int | None = None
    parameters: int | None = None
    """parameter count, when it can be estimated from the config (for the weights' size)."""
    source: str = "arguments"

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise CapacityError(f"{name}: must be a positive integer, got {value!r}")
        dtype_bytes(self.dtype)


def kv_bytes(*, layers: int, kv_heads: int, head_dim: int, seq_len: int, batch: int, bytes_per_element: float) -> float:
    """The formula: 2 × layers × KV heads × head dim × sequence length × batch × bytes per element."""
    return 2 * layers * kv_heads * head_dim * seq_len * batch * bytes_per_element


def _int(config: dict[str, Any], key: str, source: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CapacityError(f"{source}: {key} must be a positive integer, got {value!r}")
    return value


def shape_from_config(config: dict[str, Any], source: str = "config.json") -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` (Llama, Mistral, Qwen, Gemma... style).

    Multimodal configs keep the language model under ``text_config``. ``num_key_value_heads``
    defaults to ``num_attention_heads`` (no grouped-query attention) and ``head_dim`` to
    ``hidden_size / num_attention_heads``, as in transformers.
    """
    if not isinstance(config, dict):
        raise CapacityError(f"{source}: expected a JSON object")
    text = config.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in config:
        config = {**config, **text}
    layers = _int(config, "num_hidden_layers", source) or _int(config, "n_layer", source)
    heads = _int(config, "num_attention_heads", source) or _int(config, "n_head", source)
    if layers is None:
        raise CapacityError(f"{source}: num_hidden_layers is missing")
    if heads is None:
        raise CapacityError(f"{source}: num_attention_heads is missing")
    kv_heads = _int(config, "num_key_value_heads", source) or heads
    hidden = _int(config, "hidden_size", source) or _int(config, "n_embd", source)
    head_dim = _int(config, "head_dim", source)
    if head_dim is None:
        if hidden is None:
            raise CapacityError(f"{source}: neither head_dim nor hidden_size is given")
        if hidden % heads:
            raise CapacityError(f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        head_dim = hidden // heads
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float16")
    dtype_bytes(dtype, field_name=f"{source}: torch_dtype")
    intermediate = _int(config, "intermediate_size", source)
    vocab = _int(config, "vocab_size", source)
    params = None
    if hidden and intermediate and vocab:
        attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
        mlp = 3 * hidden * intermediate  # gate, up, down (SwiGLU); a slight overestimate for 2-matrix MLPs
        tied = bool(config.get("tie_word_embeddings", False))
        params = layers * (attention + mlp + 2 * hidden) + vocab * hidden * (1 if tied else 2) + hidden
    return ModelShape(
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        max_position_embeddings=_int(config, "max_position_embeddings", source),
        parameters=params,
        source=source,
    )


def load_config(path: Path) -> ModelShape:
    """Read a ``config.json`` file (or the directory holding one)."""
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CapacityError(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise CapacityError(f"{path}: not valid JSON: {exc}") from None
    return shape_from_config(data, source=str(path.name))


@dataclass(frozen=True)
class Plan:
    """A deployment to size: the model, the cache dtype and the memory the engine may use."""

    shape: ModelShape
    kv_dtype: str | None = None
    """``None``/``auto``: the weights' dtype."""
    max_model_len: int | None = None
    gpu_memory_bytes: float | None = None
    """memory of ONE GPU."""
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    weights_bytes: float | None = None
    """all the weights (split across tensor-parallel GPUs); estimated from the config when not given."""
    block_size: int = 16
    average_sequence_tokens: int | None = None
    """prompt + output tokens of a typical request, to turn capacity into concurrent sequences."""
    batch: int | None = None
    """sequences of ``max_model_len`` tokens to size the cache for (the formula's batch)."""

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise CapacityError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.tensor_parallel_size < 1:
            raise CapacityError(f"tensor_parallel_size: must be >= 1, got {self.tensor_parallel_size}")
        if self.block_size < 1:
            raise CapacityError(f"block_size: must be >= 1, got {self.block_size}")
        for name in ("gpu_memory_bytes", "weights_bytes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise CapacityError(f"{name}: must be positive, got {value}")
        for name in ("max_model_len", "average_sequence_tokens", "batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise CapacityError(f"{name}: must be >= 1, got {value}")
        if self.kv_dtype not in (None, "auto"):
            dtype_bytes(self.kv_dtype, field_name="kv_dtype")


@dataclass(frozen=True)
class CapacityReport:
    """What a :class:`Plan` gives: bytes per token, tokens that fit, sequences that fit."""

    kv_dtype: str
    bytes_per_element: float
    kv_bytes_per_token: float
    """for the whole model (all layers, all KV heads), summed over the tensor-parallel GPUs."""
    kv_bytes_per_token_per_gpu: float
    kv_bytes_per_sequence: float | None
    """one sequence of ``max_model_len`` tokens."""
    kv_bytes_for_batch: float | None
    """``batch`` sequences of ``max_model_len`` tokens: the formula's total."""
    weights_bytes: float | None
    weights_estimated: bool
    kv_budget_bytes_per_gpu: float | None
    kv_tokens: int | None
    """KV tokens that fit (the engine's KV capacity), when the memory is known."""
    max_sequences_at_max_len: int | None
    max_sequences_at_average: int | None
    notes: list[str] = field(default_factory=list)


def plan_capacity(plan: Plan) -> CapacityReport:
    """Size the KV cache of ``plan`` (see the module docstring for the formula)."""
    shape = plan.shape
    kv_dtype = shape.dtype if plan.kv_dtype in (None, "auto") else str(plan.kv_dtype)
    elem = dtype_bytes(kv_dtype, field_name="kv_dtype")
    tp = plan.tensor_parallel_size
    per_token = kv_bytes(
        layers=shape.layers,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        seq_len=1,
        batch=1,
        bytes_per_element=elem,
    )
    # KV heads are split across tensor-parallel ranks; with fewer KV heads than ranks they are replicated.
    heads_per_gpu = math.ceil(shape.kv_heads / tp)
    per_token_gpu = kv_bytes(
        layers=shape.layers, kv_heads=heads_per_gpu, head_dim=shape.head_dim, seq_len=1, batch=1, bytes_per_element=elem
    )
    notes: list[str] = []
    if shape.kv_heads < tp:
        notes.append(f"{shape.kv_heads} KV heads on {tp} GPUs: each GPU keeps a replica of a KV head")
    max_len = plan.max_model_len or shape.max_position_embeddings
    per_seq = per_token * max_len if max_len else None
    weights = plan.weights_bytes
    estimated = False
    if weights is None and shape.parameters is not None:
        weights = shape.parameters * dtype_bytes(shape.dtype)
        estimated = True
        notes.append("weights estimated from config.json (parameters × dtype); pass the real size to be exact")
    budget = tokens = at_max = at_avg = None
    if plan.gpu_memory_bytes is not None:
        if weights is None:
            notes.append("the weights' size is unknown: give it to size the cache from the GPU memory")
        else:
            budget = plan.gpu_memory_bytes * plan.gpu_memory_utilization - weights / tp
            if budget <= 0:
                notes.append(
                    "the weights do not fit in the memory the engine may use: lower precision (quantize), more "
                    "tensor parallelism, or a higher GPU memory utilization"
                )
                budget, tokens = max(budget, 0.0), 0
            else:
                blocks = int(budget // (per_token_gpu * plan.block_size))
                tokens = blocks * plan.block_size
    if tokens is not None:
        if max_len:
            at_max = tokens // (math.ceil(max_len / plan.block_size) * plan.block_size)
        if plan.average_sequence_tokens:
            at_avg = tokens // (math.ceil(plan.average_sequence_tokens / plan.block_size) * plan.block_size)
    return CapacityReport(
        kv_dtype=kv_dtype,
        bytes_per_element=elem,
        kv_bytes_per_token=per_token,
        kv_bytes_per_token_per_gpu=per_token_gpu,
        kv_bytes_per_sequence=per_seq,
        kv_bytes_for_batch=per_seq * plan.batch if per_seq is not None and plan.batch else None,
        weights_bytes=weights,
        weights_estimated=estimated,
        kv_budget_bytes_per_gpu=budget,
        kv_tokens=tokens,
        max_sequences_at_max_len=at_max,
        max_sequences_at_average=at_avg,
        notes=notes,
    )


def supported_concurrency(capacity_tokens: float, average_sequence_tokens: float, block_size: int = 1) -> int:
    """Sequences of ``average_sequence_tokens`` that fit in ``capacity_tokens`` at once (before preemption)."""
    if average_sequence_tokens <= 0:
        raise CapacityError("average_sequence_tokens: must be positive")
    per = math.ceil(average_sequence_tokens / block_size) * block_size
    return int(capacity_tokens // per)
