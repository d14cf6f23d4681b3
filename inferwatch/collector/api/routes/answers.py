"""The on-call surface: ``/api/v1/diagnose``, ``/checklist``, ``/capacity``, ``/headroom`` and ``/slos``.

Errors: a malformed parameter is a 422 naming it (as FastAPI's own validation errors do); an
upstream (Prometheus, an exporter) that cannot be read, or none configured, is a 503 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, NoReturn

from fastapi import APIRouter, Depends, HTTPException, Query

from inferwatch.collector.api.deps import READ_RESPONSES, CollectorDep, EngineDep, require_read
from inferwatch.collector.api.routes.request_log import unavailable
from inferwatch.collector.diagnosis.burn import SloReport
from inferwatch.collector.diagnosis.diagnoser import NotConfigured
from inferwatch.collector.diagnosis.headroom_report import HeadroomReport
from inferwatch.collector.diagnosis.report import Capacity, Checklist, Diagnosis
from inferwatch.collector.diagnosis.signals import Filters, UpstreamError
from inferwatch.collector.schemas import ErrorBody
from inferwatch.collector.stats import listing
from inferwatch.core.capacity import GIB, CapacityError, ModelShape, Plan
from inferwatch.core.engines.launch import LaunchError

WINDOW_PATTERN: Final = r"^[1-9][0-9]*(s|m|h|d|w)$"
UPSTREAM_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    503: {
        "model": ErrorBody,
        "description": "Prometheus or an exporter cannot be read, or none is configured (or, for the "
        "example requests of /diagnose, the database cannot be reached)",
    },
}

router = APIRouter(
    tags=["on-call"], dependencies=[Depends(require_read)], responses={**READ_RESPONSES, **UPSTREAM_RESPONSES}
)

Window = Annotated[
    str,
    Query(
        pattern=WINDOW_PATTERN,
        description="Look-back window, e.g. 10m (with exporters only: the seconds between their two scrapes)",
    ),
]
EngineFilter = Annotated[str | None, Query(alias="engine", description="Only this engine (e.g. vllm)")]
ModelFilter = Annotated[str | None, Query(description="Only this model")]
InstanceFilter = Annotated[str | None, Query(description="Only this instance (the exporter's host:port)")]


def _invalid(field: str, message: str) -> NoReturn:
    raise HTTPException(status_code=422, detail=[{"loc": ["query", field], "msg": message, "type": "value_error"}])


def _upstream(exc: Exception) -> NoReturn:
    raise HTTPException(status_code=503, detail=str(exc)) from None


@router.get("/diagnose")
async def diagnose(
    collector: CollectorDep,
    engine: EngineDep,
    window: Window = "10m",
    llm_engine: EngineFilter = None,
    model: ModelFilter = None,
    instance: InstanceFilter = None,
    examples: Annotated[int, Query(ge=0, le=20, description="Slowest matching requests per finding")] = 3,
) -> Diagnosis:
    """Symptom → cause → remedy per target, with the evidence (the exact PromQL) and example requests.

    ``findings`` are ordered most severe first; ``targets`` gives every target's status per
    symptom (``unknown`` with the reason when the engine does not expose the signal).
    """
    try:
        return await collector.oncall.diagnose(
            window, Filters(llm_engine, model, instance), requests=engine, examples=examples
        )
    except listing.DatabaseUnavailable as exc:  # the example requests come from the store
        raise unavailable(exc) from None
    except ValueError as exc:
        _invalid("window", str(exc))
    except (UpstreamError, NotConfigured) as exc:
        _upstream(exc)


@router.get("/checklist")
async def checklist(
    collector: CollectorDep,
    window: Window = "10m",
    llm_engine: EngineFilter = None,
    model: ModelFilter = None,
    instance: InstanceFilter = None,
    launch: Annotated[
        str | None, Query(description="The engine's launch command line, e.g. 'vllm serve m --max-num-seqs 512'")
    ] = None,
    gpu: Annotated[str | None, Query(description="The GPU model, e.g. H100, to judge the quantization method")] = None,
) -> Checklist:
    """The tuning checklist per target: pass, fail or unknown, with evidence and remedy."""
    try:
        return await collector.oncall.checklist(window, Filters(llm_engine, model, instance), launch=launch, gpu=gpu)
    except LaunchError as exc:
        _invalid("launch", str(exc))
    except ValueError as exc:
        _invalid("window", str(exc))
    except (UpstreamError, NotConfigured) as exc:
        _upstream(exc)


@router.get("/capacity")
async def capacity(
    collector: CollectorDep,
    layers: Annotated[int | None, Query(gt=0)] = None,
    kv_heads: Annotated[int | None, Query(gt=0)] = None,
    head_dim: Annotated[int | None, Query(gt=0)] = None,
    dtype: Annotated[str, Query(description="the weights' dtype")] = "float16",
    kv_dtype: Annotated[str | None, Query(description="the KV cache's dtype (default: the weights')")] = None,
    max_model_len: Annotated[int | None, Query(gt=0)] = None,
    gpu_memory_gib: Annotated[float | None, Query(gt=0, description="memory of one GPU")] = None,
    gpu_memory_utilization: Annotated[float, Query(gt=0, le=1)] = 0.9,
    tensor_parallel_size: Annotated[int, Query(ge=1)] = 1,
    weights_gib: Annotated[float | None, Query(gt=0, description="all the weights")] = None,
    block_size: Annotated[int, Query(ge=1)] = 16,
    average_tokens: Annotated[int | None, Query(gt=0, description="prompt + output of a typical request")] = None,
    batch: Annotated[int | None, Query(gt=0, description="sequences of max_model_len to size the cache for")] = None,
    window: Window = "10m",
    llm_engine: EngineFilter = None,
    model: ModelFilter = None,
    instance: InstanceFilter = None,
) -> Capacity:
    """KV bytes per token, the tokens and sequences that fit; with a target, the observed capacity beside it.

    KV bytes = 2 × layers × KV heads × head dim × sequence length × batch × bytes per element.
    """
    plan = None
    given = [v is not None for v in (layers, kv_heads, head_dim)]
    if any(given) and not all(given):
        _invalid("layers" if layers is None else "kv_heads" if kv_heads is None else "head_dim", "give all three")
    try:
        if layers is not None and kv_heads is not None and head_dim is not None:
            shape = ModelShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
            plan = Plan(
                shape=shape,
                kv_dtype=kv_dtype,
                max_model_len=max_model_len,
                gpu_memory_bytes=gpu_memory_gib * GIB if gpu_memory_gib else None,
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                weights_bytes=weights_gib * GIB if weights_gib else None,
                block_size=block_size,
                average_sequence_tokens=average_tokens,
                batch=batch,
            )
        return await collector.oncall.capacity(plan, window, Filters(llm_engine, model, instance))
    except CapacityError as exc:
        _invalid(str(exc).split(":", 1)[0] if ":" in str(exc) else "layers", str(exc))
    except ValueError as exc:
        _invalid("window", str(exc))
    except (UpstreamError, NotConfigured) as exc:
        _upstream(exc)


@router.get("/headroom")
async def headroom(
    collector: CollectorDep,
    window: Annotated[
        str | None,
        Query(
            pattern=WINDOW_PATTERN,
            description="History the model is fitted on (default: the SLO file's headroom.window; from the "
            "exporters alone, 2m, scraped live, at most 10m)",
        ),
    ] = None,
    step: Annotated[
        str | None,
        Query(
            pattern=WINDOW_PATTERN,
            description="One (running batch, TPOT) point of the fit (default: headroom.step; exporters: 15s)",
        ),
    ] = None,
    llm_engine: EngineFilter = None,
    model: ModelFilter = None,
    instance: InstanceFilter = None,
) -> HeadroomReport:
    """Per replica: the load at which each SLO (and the KV cache) breaks, the first one, and the headroom.

    Each replica names its figures as the recording rules do (``headroom_ratio``,
    ``capacity_requests_per_second``, ``capacity_concurrency``, ``limiting_slo``), with every limit,
    the TPOT fit and the query each input came from; ``models`` gives ``replicas_needed`` per model
    and role. Whatever the window cannot support is null with a ``reason``, never a guess.
    """
    try:
        return await collector.oncall.headroom(window, step, Filters(llm_engine, model, instance))
    except ValueError as exc:
        _invalid("window", str(exc))
    except (UpstreamError, NotConfigured) as exc:
        _upstream(exc)


@router.get("/slos")
async def slos(collector: CollectorDep) -> SloReport:
    """Per SLO: objective, SLI over the period, error budget left, burn rate per alert window, firing alerts."""
    try:
        return await collector.oncall.slo_status()
    except (UpstreamError, NotConfigured) as exc:
        _upstream(exc)
