"""Autoscaling the engines on headroom: a KEDA ScaledObject, or an HPA on a prometheus-adapter external metric.

Both scale a Deployment to the replicas-needed record (:data:`V.REPLICAS_NEEDED_RECORD`) of the model and role
it serves: the replicas that hold the SLO file's SLOs at the current load (docs/headroom.md). For each
example engine of :mod:`.sidecars` (a Deployment named after the engine, serving
:data:`~.sidecars.EXAMPLE_MODEL` as one unified role):

* ``autoscaling/<engine>-keda/``: a kustomize Component adding a ScaledObject (keda.sh/v1alpha1) with a
  ``prometheus`` trigger on the record, read from :attr:`KubeOptions.prometheus_url` (written only when
  that is set);
* ``autoscaling/<engine>-hpa/``: a Component adding an ``autoscaling/v2`` HorizontalPodAutoscaler on the
  External metric ``inferwatch-<engine>-replicas-needed``, for clusters without KEDA;
* ``autoscaling/prometheus-adapter/``: a ConfigMap whose ``config.yaml`` holds prometheus-adapter's
  ``externalRules`` serving those metrics (one per Deployment: a model name such as ``Qwen/Qwen2.5-7B-Instruct``
  is not a valid Kubernetes label value, so the HPA cannot select it; the rule holds it instead).

**The arithmetic.** The HPA's target is ``AverageValue`` 1 (KEDA's ``metricType: AverageValue``, threshold 1):
for an External metric it divides the metric by the current replica count and compares the average with
the target, so the desired count is ``ceil(metric / 1)``, the record itself, whatever the current
count. ``Value`` would multiply instead: ``ceil(current x metric / 1)``, 3 replicas needing 3 would ask for 9.

**Slow down, prompt up.** The record is estimated over the headroom window (``headroom.window`` of the SLO
file, 30m by default): a scale-down waits for the whole window to agree (the scale-down stabilization, kept
within the HPA's 10 min to 1 h), then removes one replica per 5 minutes; a scale-up is not delayed.

**No value, no change.** With no traffic (or no rules) the record is absent: KEDA's ``ignoreNullValues:
"false"`` makes that an error and the adapter returns no metric, so the HPA keeps the current count rather
than scaling to the minimum on missing data.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile, duration_seconds
from inferwatch.kubernetes.kube_objects import NAME_LABEL, KubeOptions, dump, inline, metadata
from inferwatch.kubernetes.sidecars import COMPONENT_KIND, EXAMPLE_MODEL, KUSTOMIZATION_KIND

MIN_REPLICAS: Final = 1
"""never zero: an engine takes minutes to load its model, and an idle one has no headroom to read."""
MAX_REPLICAS: Final = 8
"""a GPU budget for the examples: patch it to yours."""
TARGET_PER_REPLICA: Final = "1"
"""the HPA target (KEDA threshold): one replica per unit of the replicas-needed record."""
METRIC_TYPE: Final = "AverageValue"
SCALE_DOWN_MIN_SECONDS: Final = 600
SCALE_DOWN_MAX_SECONDS: Final = 3600
"""the HPA's largest stabilization window."""
SCALE_DOWN_PODS: Final = 1
SCALE_DOWN_PERIOD_SECONDS: Final = 300
SCALE_UP_PODS: Final = 2
SCALE_UP_PERCENT: Final = 100
SCALE_UP_PERIOD_SECONDS: Final = 60
POLLING_SECONDS: Final = 30
ADAPTER_CONFIG_MAP: Final = "inferwatch-prometheus-adapter"
ADAPTER_CONFIG_KEY: Final = "config.yaml"
KEDA_API: Final = "keda.sh/v1alpha1"


@dataclass(frozen=True)
class Target:
    """A Deployment and the (model, role) whose replicas-needed record sizes it."""

    deployment: str
    model: str
    role: str = V.ROLE_UNIFIED

    def metric_name(self) -> str:
        """The External metric the adapter serves for this Deployment."""
        return f"inferwatch-{self.deployment}-replicas-needed"


def example_targets(options: KubeOptions) -> list[Target]:
    return [Target(engine, EXAMPLE_MODEL) for engine in options.engines]


def _quote(value: str) -> str:
    """A PromQL string literal (JSON's escapes are PromQL's for these)."""
    return json.dumps(value)


def matchers(target: Target) -> str:
    """``model="M",role=...``: a unified replica carries no role label (or ``unified``), the others theirs."""
    role = (
        f"{V.LABEL_ROLE}=~{_quote('|' + V.ROLE_UNIFIED)}"
        if target.role == V.ROLE_UNIFIED
        else f"{V.LABEL_ROLE}={_quote(target.role)}"
    )
    return f"{V.LABEL_MODEL}={_quote(target.model)},{role}"


def replicas_query(target: Target) -> str:
    """The replicas ``target`` needs; ``max`` over the SLO files (``service``) that cover its model."""
    return f"max({V.REPLICAS_NEEDED_RECORD}{{{matchers(target)}}})"


def scale_down_seconds(spec: SLOFile) -> int:
    window = duration_seconds(spec.headroom.window)
    return min(max(window, SCALE_DOWN_MIN_SECONDS), SCALE_DOWN_MAX_SECONDS)


def behavior(spec: SLOFile) -> dict[str, Any]:
    """The HPA ``behavior`` of both objects: prompt scale-up, a window-long wait and one pod at a time down."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Pods", "value": SCALE_UP_PODS, "periodSeconds": SCALE_UP_PERIOD_SECONDS},
                {"type": "Percent", "value": SCALE_UP_PERCENT, "periodSeconds": SCALE_UP_PERIOD_SECONDS},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": scale_down_seconds(spec),
            "selectPolicy": "Min",
            "policies": [{"type": "Pods", "value": SCALE_DOWN_PODS, "periodSeconds": SCALE_DOWN_PERIOD_SECONDS}],
        },
    }


def _target_ref(target: Target) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": target.deployment}


def scaled_object(target: Target, spec: SLOFile, prometheus_url: str) -> dict[str, Any]:
    return {
        "apiVersion": KEDA_API,
        "kind": "ScaledObject",
        "metadata": metadata(target.deployment, {NAME_LABEL: target.deployment}),
        "spec": {
            "scaleTargetRef": _target_ref(target),
            "pollingInterval": POLLING_SECONDS,
            "cooldownPeriod": scale_down_seconds(spec),
            "minReplicaCount": MIN_REPLICAS,
            "maxReplicaCount": MAX_REPLICAS,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(spec)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "name": "replicas-needed",
                    "metricType": METRIC_TYPE,
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": replicas_query(target),
                        "threshold": TARGET_PER_REPLICA,
                        "ignoreNullValues": "false",
                    },
                }
            ],
        },
    }


def autoscaler(target: Target, spec: SLOFile) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(target.deployment, {NAME_LABEL: target.deployment}),
        "spec": {
            "scaleTargetRef": _target_ref(target),
            "minReplicas": MIN_REPLICAS,
            "maxReplicas": MAX_REPLICAS,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": target.metric_name()},
                        "target": {"type": METRIC_TYPE, "averageValue": TARGET_PER_REPLICA},
                    },
                }
            ],
            "behavior": behavior(spec),
        },
    }


def adapter_rule(target: Target) -> dict[str, Any]:
    """One prometheus-adapter external rule: ``target``'s record under its metric name, in no namespace (the
    record has none). The HPA's own matchers (``<<.LabelMatchers>>``, empty here) go last: PromQL takes a
    trailing comma, not a leading one."""
    record = V.REPLICAS_NEEDED_RECORD
    return {
        "seriesQuery": f"{record}{{{V.LABEL_MODEL}={_quote(target.model)}}}",
        "resources": {"namespaced": False},
        "name": {"matches": f"^{re.escape(record)}$", "as": target.metric_name()},
        "metricsQuery": f"max(<<.Series>>{{{matchers(target)},<<.LabelMatchers>>}})",
    }


def adapter_config(targets: list[Target]) -> dict[str, Any]:
    """prometheus-adapter's ``config.yaml``: the external rules (its chart's ``rules.external`` takes the list)."""
    return {"externalRules": [adapter_rule(t) for t in targets]}


def adapter_config_map(targets: list[Target]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(ADAPTER_CONFIG_MAP, {NAME_LABEL: "prometheus-adapter"}),
        "data": {ADAPTER_CONFIG_KEY: inline(adapter_config(targets))},
    }


def _component(resource: str, note: str) -> bytes:
    return dump([{**COMPONENT_KIND, "resources": [resource]}], note)


def _arithmetic() -> str:
    return (
        "metricType AverageValue, target 1: the HPA divides the metric by the current replicas and compares the\n"
        f"average with 1, so it asks for ceil({V.REPLICAS_NEEDED_RECORD}) replicas whatever their current number\n"
        "(Value would ask for ceil(current x metric)). Within the HPA's 10 % tolerance nothing changes: above 10\n"
        "replicas, one short is within it."
    )


def files(spec: SLOFile, options: KubeOptions) -> dict[str, bytes]:
    """The autoscaling Components and the prometheus-adapter ConfigMap by path relative to the output directory."""
    out: dict[str, bytes] = {}
    targets = example_targets(options)
    down = scale_down_seconds(spec)
    slow = (
        f"Scale-down: after {down} s of lower readings (the headroom window, {spec.headroom.window}), then one\n"
        f"replica per {SCALE_DOWN_PERIOD_SECONDS} s; scale-up at once. Remove `replicas` from the Deployment you\n"
        "autoscale, or each `kubectl apply` resets it. Use the KEDA Component or the HPA one, not both."
    )
    for target in targets:
        name = target.deployment
        what = f"{name} to {replicas_query(target)}"
        if options.prometheus_url:
            out[f"autoscaling/{name}-keda/scaledobject.yaml"] = dump(
                [scaled_object(target, spec, options.prometheus_url)],
                f"KEDA scales the Deployment {what}.\n{_arithmetic()}\n{slow}\n"
                "The record absent (no traffic, no rules): ignoreNullValues false makes it an error and KEDA keeps\n"
                "the count. cooldownPeriod only applies when scaling to zero, which minReplicaCount rules out.",
            )
            out[f"autoscaling/{name}-keda/kustomization.yaml"] = _component(
                "scaledobject.yaml",
                f"Adds a KEDA ScaledObject sizing the Deployment {name}: list this directory in your kustomization's"
                " components.",
            )
        out[f"autoscaling/{name}-hpa/horizontalpodautoscaler.yaml"] = dump(
            [autoscaler(target, spec)],
            f"The HPA scales the Deployment {name} on the External metric {target.metric_name()}, which the\n"
            f"prometheus-adapter rule of autoscaling/prometheus-adapter/ serves as {replicas_query(target)}.\n"
            f"{_arithmetic()}\n{slow}",
        )
        out[f"autoscaling/{name}-hpa/kustomization.yaml"] = _component(
            "horizontalpodautoscaler.yaml",
            f"Adds an HPA sizing the Deployment {name} (clusters without KEDA; needs autoscaling/prometheus-adapter/)"
            ": list this directory in your kustomization's components.",
        )
    out["autoscaling/prometheus-adapter/configmap.yaml"] = dump(
        [adapter_config_map(targets)],
        "prometheus-adapter's external rules for the HPAs of autoscaling/*-hpa/: in the adapter's namespace, its\n"
        f"Helm chart reads this ConfigMap with rules.existing={ADAPTER_CONFIG_MAP} (which replaces its other\n"
        "rules), or take the externalRules list into the chart's rules.external.",
    )
    out["autoscaling/prometheus-adapter/kustomization.yaml"] = dump(
        [{**KUSTOMIZATION_KIND, "resources": ["configmap.yaml"]}],
        "kubectl apply -n <prometheus-adapter's namespace> -k autoscaling/prometheus-adapter",
    )
    return out
