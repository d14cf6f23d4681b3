"""The GPUs beneath an engine target: read the GPU source's page, keep this target's GPUs, translate them
into the canonical ``llm_gpu_*`` families with the target's own ``engine`` and ``model`` labels (and its
extra labels), so that a GPU joins its replica in any query without a join of ours in PromQL.

Which GPUs are the target's is configuration (``targets[].gpus``, :class:`~inferwatch.exporters.targets.
GpuSourceConfig`): their UUIDs (preferred: NVML's index order, which the source's ``gpu`` label follows,
may differ from ``CUDA_VISIBLE_DEVICES``'), a host and NVML indices, or on Kubernetes the pod that holds
them (dcgm-exporter labels each GPU with its pod when run with ``-k``; read straight from the source,
these are its own labels, so the ``exported_pod`` renaming of a Prometheus scrape does not arise). The
one source dialect today is NVIDIA dcgm-exporter's (:mod:`inferwatch.exporters.gpus.dcgm`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from inferwatch.core import topology
from inferwatch.core import vocabulary as V
from inferwatch.exporters import textparse
from inferwatch.exporters.gpus import dcgm
from inferwatch.exporters.samples import Snapshot, series_key

POD_ENV = topology.POD_NAME_ENV
NAMESPACE_ENV = topology.POD_NAMESPACE_ENV


class GpuSelectionError(ValueError):
    """The configuration names the target's GPUs by something the environment does not give."""


@dataclass(frozen=True)
class GpuSelection:
    """Which GPUs of the source's page belong to one engine target."""

    uuids: frozenset[str] = frozenset()
    host: str | None = None
    indices: frozenset[str] = frozenset()
    pod: str | None = None
    namespace: str | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.uuids:
            return _first(labels, dcgm.UUID) in self.uuids
        if self.pod is not None:
            if _first(labels, dcgm.POD) != self.pod:
                return False
            return self.namespace is None or _first(labels, dcgm.NAMESPACE) == self.namespace
        return _first(labels, dcgm.HOSTNAME) == self.host and _first(labels, dcgm.GPU_INDEX) in self.indices


def selection(
    uuids: list[str],
    host: str | None,
    indices: list[int],
    pod: str | None,
    namespace: str | None,
    pod_from_env: bool,
    environ: Mapping[str, str],
) -> GpuSelection:
    """The selection a target's ``gpus`` section states; ``pod_from_env`` reads the downward API's
    ``$POD_NAME`` and ``$POD_NAMESPACE`` from ``environ`` (an explicit pod or namespace wins)."""
    if pod_from_env:
        pod = pod or environ.get(POD_ENV)
        namespace = namespace or environ.get(NAMESPACE_ENV)
        if not pod:
            raise GpuSelectionError(
                f"gpus.pod_from_env: ${POD_ENV} is not set (give the container env {POD_ENV} from "
                "fieldRef metadata.name, or set gpus.pod)"
            )
    return GpuSelection(frozenset(uuids), host, frozenset(str(i) for i in indices), pod, namespace)


def _first(labels: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def translate(
    text: str,
    chosen: GpuSelection,
    replica: Mapping[str, str],
    extra: Mapping[str, str],
    pool: str | None = None,
) -> Snapshot:
    """The ``llm_gpu_*`` series of the GPUs of ``text`` that ``chosen`` selects, labelled with ``replica``
    (``engine``, ``model``), the GPU's own labels, ``pool`` and ``extra`` (the target's labels).

    Raises :class:`~inferwatch.exporters.textparse.ParseError` on a malformed page. A non-finite value
    is skipped (a blank DCGM field is left out by the source itself; a NaN would poison a sum)."""
    parsed = textparse.parse(text, dcgm.SOURCES)
    snap = Snapshot()

    def key(labels: Mapping[str, str], more: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        own = {
            V.LABEL_GPU: _first(labels, dcgm.GPU_INDEX),
            V.LABEL_GPU_UUID: _first(labels, dcgm.UUID),
            V.LABEL_GPU_MODEL: _first(labels, dcgm.MODEL_NAME),
            V.LABEL_HOST: _first(labels, dcgm.HOSTNAME),
            V.LABEL_POOL: pool,
        }
        merged = {**replica, **{k: v for k, v in own.items() if v}, **more}
        return series_key(merged, extra)

    for fld in dcgm.FIELDS:
        for raw, value in parsed.get(fld.source):
            labels = dict(raw)
            if not math.isfinite(value) or not chosen.matches(labels):
                continue
            snap.add_value(fld.metric, key(labels, fld.const), value * fld.scale)
    for raw, value in parsed.get(dcgm.CLOCK_EVENTS):
        labels = dict(raw)
        if not math.isfinite(value) or not chosen.matches(labels):
            continue
        mask = int(value)
        for bit, reason in dcgm.CLOCK_EVENT_BITS.items():
            snap.set_value(V.GPU_CLOCK_EVENT, key(labels, {V.LABEL_REASON: reason}), 1.0 if mask & bit else 0.0)
    for raw, value in parsed.get(dcgm.XID):
        labels = dict(raw)
        if not chosen.matches(labels):
            continue
        code = labels.get(dcgm.XID_CODE_LABEL) or (str(int(value)) if math.isfinite(value) else "")
        if code.isdigit():
            snap.set_value(V.GPU_XID, key(labels, {V.LABEL_XID: code}), 1.0)
    return snap


def models_of(snap: Snapshot) -> set[str]:
    """The ``model`` values of an engine snapshot's series (a GPU serves the model its engine serves)."""
    found: set[str] = set()
    keys = [key for series in snap.values.values() for key in series]
    keys += [key for hseries in snap.histograms.values() for key in hseries]
    for key in keys:
        found.update(v for k, v in key if k == V.LABEL_MODEL)
    return found
