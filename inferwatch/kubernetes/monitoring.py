"""Prometheus Operator objects: PodMonitors, the PrometheusRule and the AlertmanagerConfig.

**PodMonitors, not ServiceMonitors**: the exporter and the proxy are sidecars in the engine's pod and
have no Service of their own (the engine's Service, if any, selects the engine's port); a PodMonitor
selects the pods by label and scrapes the named container port. The collector has a Service, but a
PodMonitor too keeps one kind of object and lets Prometheus see every replica. Each sets Prometheus'
``job`` to the compose stack's job name (:mod:`inferwatch.core.topology`), so queries and dashboards
read the same series in both packagings.

**The PrometheusRule** holds exactly the groups of ``inferwatch generate alerts``' rules file for
the same SLO file, parsed from it: one source, two packagings.

**The AlertmanagerConfig** is ``generate alerts``' Alertmanager routing (same tree, grouping,
timings and inhibition), under a route that matches inferwatch's alert names, delivering to the
collector's webhook with the ingest token from the Secret.
"""

from __future__ import annotations

import re
from typing import Any, Final

import yaml

from inferwatch.alerts.generate import RULES_FILE, alertmanager_document
from inferwatch.alerts.generate import generate as generate_alerts
from inferwatch.core import topology
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile
from inferwatch.kubernetes.kube_objects import (
    EXPORTER_LABEL,
    METRICS_PORT_NAME,
    PROXY_LABEL,
    PROXY_METRICS_PORT_NAME,
    SECRET,
    SECRET_INGEST_TOKEN,
    KubeOptions,
    collector_labels,
    dump,
    metadata,
)

SCRAPE_INTERVAL: Final = "15s"
_MATCHER = re.compile(r'^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>=~|!~|!=|=)"(?P<value>.*)"$')
ALERTMANAGER_NOTE: Final = """\
Alertmanager selects AlertmanagerConfigs by its alertmanagerConfigSelector (kube-prometheus-stack:
alertmanager.alertmanagerSpec.alertmanagerConfigSelector, e.g. matchLabels release: kube-prometheus-stack).
The Prometheus Operator adds a namespace matcher to this route unless Alertmanager's
alertmanagerConfigMatcherStrategy is type None; inferwatch's alerts aggregate over namespaces and carry
none, so set it to None (kube-prometheus-stack: alertmanager.alertmanagerSpec.alertmanagerConfigMatcherStrategy)."""


def _operator_metadata(name: str, options: KubeOptions) -> dict[str, Any]:
    return metadata(name, dict(options.prometheus_operator_labels))


def _pod_monitor(
    name: str, options: KubeOptions, selector: dict[str, str], port: str, job: str, any_namespace: bool
) -> dict[str, Any]:
    endpoint = {
        "port": port,
        "path": topology.METRICS_PATH,
        "interval": SCRAPE_INTERVAL,
        "relabelings": [{"action": "replace", "targetLabel": "job", "replacement": job}],
    }
    namespaces: dict[str, Any] = {"any": True} if any_namespace else {"matchNames": [options.namespace]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _operator_metadata(name, options),
        "spec": {
            "namespaceSelector": namespaces,
            "selector": {"matchLabels": selector},
            "podMetricsEndpoints": [endpoint],
        },
    }


def pod_monitors(options: KubeOptions) -> list[dict[str, Any]]:
    """The exporters and proxies in any namespace (by their labels), the collector in its own."""
    return [
        _pod_monitor(
            topology.EXPORTERS_JOB, options, {EXPORTER_LABEL: "true"}, METRICS_PORT_NAME, topology.EXPORTERS_JOB, True
        ),
        _pod_monitor(
            topology.PROXIES_JOB, options, {PROXY_LABEL: "true"}, PROXY_METRICS_PORT_NAME, topology.PROXIES_JOB, True
        ),
        _pod_monitor(topology.COLLECTOR_JOB, options, collector_labels(), "http", topology.COLLECTOR_JOB, False),
    ]


def rule_groups(spec: SLOFile, vocabulary: V.Vocabulary) -> list[dict[str, Any]]:
    """The groups of ``generate alerts``' rules file, as that file holds them."""
    groups: list[dict[str, Any]] = yaml.safe_load(generate_alerts(spec, vocabulary)[RULES_FILE])["groups"]
    return groups


def prometheus_rule(spec: SLOFile, vocabulary: V.Vocabulary, options: KubeOptions) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _operator_metadata("inferwatch", options),
        "spec": {"groups": rule_groups(spec, vocabulary)},
    }


def alert_names(spec: SLOFile, vocabulary: V.Vocabulary) -> list[str]:
    """Every alert the rules define, sorted."""
    return sorted({r["alert"] for g in rule_groups(spec, vocabulary) for r in g["rules"] if "alert" in r})


def _matcher(text: str) -> dict[str, str]:
    m = _MATCHER.match(text)
    if m is None:
        raise ValueError(f"not an Alertmanager matcher: {text!r}")
    return {"name": m["name"], "matchType": m["op"], "value": m["value"]}


_TIMINGS: Final = {
    "group_by": "groupBy",
    "group_wait": "groupWait",
    "group_interval": "groupInterval",
    "repeat_interval": "repeatInterval",
}


def _route(route: dict[str, Any]) -> dict[str, Any]:
    """An Alertmanager route (``generate alerts``') as an AlertmanagerConfig route."""
    out: dict[str, Any] = {"receiver": route["receiver"]}
    if "matchers" in route:
        out["matchers"] = [_matcher(m) for m in route["matchers"]]
    out.update({camel: route[key] for key, camel in _TIMINGS.items() if key in route})
    if "routes" in route:
        out["routes"] = [_route(r) for r in route["routes"]]
    return out


def _receiver(receiver: dict[str, Any]) -> dict[str, Any]:
    """A receiver with its webhook URLs, the ingest token from the Secret as bearer credentials."""
    token = {"type": "Bearer", "credentials": {"name": SECRET, "key": SECRET_INGEST_TOKEN}}
    configs = [
        {"url": c["url"], "sendResolved": c["send_resolved"], "httpConfig": {"authorization": token}}
        for c in receiver["webhook_configs"]
    ]
    return {"name": receiver["name"], "webhookConfigs": configs}


def alertmanager_config(spec: SLOFile, vocabulary: V.Vocabulary, options: KubeOptions) -> dict[str, Any]:
    webhook = topology.url(options.collector_host(), topology.COLLECTOR_HTTP_PORT, topology.WEBHOOK_PATH)
    document = alertmanager_document(
        spec.model_copy(update={"alerts": spec.alerts.model_copy(update={"webhook_url": webhook})})
    )
    names = "|".join(alert_names(spec, vocabulary))
    inferwatch_alerts = [{"name": "alertname", "matchType": "=~", "value": names}]
    route = {"receiver": document["route"]["receiver"], "matchers": inferwatch_alerts, **_route(document["route"])}
    inhibit = [
        {
            "sourceMatch": [_matcher(m) for m in rule["source_matchers"]],
            "targetMatch": [_matcher(m) for m in rule["target_matchers"]],
            "equal": rule["equal"],
        }
        for rule in document["inhibit_rules"]
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1alpha1",
        "kind": "AlertmanagerConfig",
        "metadata": _operator_metadata("inferwatch", options),
        "spec": {"route": route, "inhibitRules": inhibit, "receivers": [_receiver(r) for r in document["receivers"]]},
    }


def files(spec: SLOFile, vocabulary: V.Vocabulary, options: KubeOptions) -> dict[str, bytes]:
    """The Prometheus Operator objects by path relative to the output directory."""
    return {
        "monitoring/podmonitors.yaml": dump(
            pod_monitors(options),
            "Exporters: pods labelled inferwatch.io/exporter=true, port metrics; proxies: inferwatch.io/proxy=true,\n"
            "port proxy-metrics (any namespace); the collector: its pods, port http.",
        ),
        "monitoring/prometheusrule.yaml": dump(
            [prometheus_rule(spec, vocabulary, options)], "The groups of `inferwatch generate alerts`' rules.yml."
        ),
        "monitoring/alertmanagerconfig.yaml": dump([alertmanager_config(spec, vocabulary, options)], ALERTMANAGER_NOTE),
    }
