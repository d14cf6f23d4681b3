"""``inferwatch generate kubernetes``: plain YAML manifests and a ``kustomization.yaml``.

:func:`generate` is a pure function of (SLO file, vocabulary, :class:`KubeOptions`) returning
``{relative path: bytes}``, each file starting with the "generated, do not edit" header. The tree:

* ``kustomization.yaml``: the namespace, and every object of the tree below except the sidecars and
  examples (``kubectl apply -k DIR``): ``namespace.yaml``, ``collector/`` (:mod:`.workloads`),
  ``monitoring/`` (:mod:`.monitoring`), ``dashboards/`` (:mod:`.dashboard_maps`);
* ``sidecars/<engine>-exporter/`` and ``sidecars/<engine>-proxy/``: kustomize Components patching
  your engine Deployments, and ``examples/``: example engines with the sidecars
  (:mod:`.sidecars`), each its own kustomization, so that applying the tree starts no GPU pod;
* ``autoscaling/<engine>-keda/`` and ``autoscaling/<engine>-hpa/``: Components sizing those Deployments on
  the replicas-needed record, and ``autoscaling/prometheus-adapter/``: the HPAs' external rules
  (:mod:`.autoscaling`).

The labels, the Secret and its keys are described in :mod:`.kube_objects`.
"""

from __future__ import annotations

from typing import Any

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile
from inferwatch.kubernetes import autoscaling, dashboard_maps, monitoring, sidecars, workloads
from inferwatch.kubernetes.kube_objects import KubeOptions, dump, metadata

KUSTOMIZATION = "kustomization.yaml"
SEPARATE = ("sidecars/", "examples/", "autoscaling/")
"""Directories with kustomizations of their own, which the top one leaves out."""


def namespace(options: KubeOptions) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata(options.namespace)}


def kustomization(options: KubeOptions, resources: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": options.namespace,
        "resources": resources,
    }


def generate(spec: SLOFile, vocabulary: V.Vocabulary, options: KubeOptions) -> dict[str, bytes]:
    """Every file of the tree by path relative to the output directory (deterministic)."""
    files: dict[str, bytes] = {"namespace.yaml": dump([namespace(options)])}
    files.update(workloads.files(options))
    files.update(monitoring.files(spec, vocabulary, options))
    files.update(dashboard_maps.files(spec, vocabulary, options))
    resources = sorted(files)
    files.update(sidecars.files(options))
    files.update(autoscaling.files(spec, options))
    note = (
        "kubectl apply -k DIR: the collector (after creating its Secret), the Prometheus Operator objects and\n"
        "the dashboards. sidecars/, examples/ and autoscaling/ are kustomizations of their own."
    )
    files[KUSTOMIZATION] = dump([kustomization(options, resources)], note)
    return dict(sorted(files.items()))
