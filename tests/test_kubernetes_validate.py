"""The Kubernetes manifests checked against the real schemas and tools (issue 31, deliverable 2).

* The validator first (``tests/support/kube_schemas.py``): hand-written good objects of each kind pass,
  and bad ones (a misspelled field, a wrong type, a removed API version, an unknown kind ...) fail, so
  that a green run over the generated tree means something.
* Then every YAML document of ``deploy/kubernetes/`` (``inferwatch generate kubernetes``): each object
  validates (Kubernetes 1.32 strict schemas, the Prometheus Operator and grafana-operator CRDs); ``kubectl
  kustomize`` builds the same objects, and what it builds (the patches applied) validates too; the
  PrometheusRule's groups pass ``promtool check rules`` and the rule unit tests of ``tests/alerts/``; the
  AlertmanagerConfig, rendered as the operator renders it, passes ``amtool check-config`` and routes every
  inferwatch alert to the collector's webhook.

A document is a strategic-merge patch (checked with ``partial=True``: names and types strict, required
fields left to the target) when a kustomization or Component of the tree names it as a patch (the sidecar
Components' ``patch.yaml``; the inline patches of a kustomization are checked the same way); every other
file must be a resource of some kustomization, so that nothing escapes the full check.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import load
from inferwatch.kubernetes.kube_objects import KubeOptions
from inferwatch.kubernetes.manifests import generate
from inferwatch.stack import WEBHOOK_PATH
from tests.conftest import ROOT, require_tool
from tests.support import kube_schemas as K

TREE = ROOT / "deploy" / "kubernetes"
ALERT_TESTS = ROOT / "tests" / "alerts"
PROMOP = "monitoring.coreos.com"


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


# --- the validator, proven on hand-written objects -----------------------------------------------
LABELS = {"app.kubernetes.io/name": "x"}
CONTAINER = {
    "name": "c",
    "image": "example/c:1",
    "ports": [{"name": "metrics", "containerPort": 9400}],
    "readinessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}},
    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
    "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
}
DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "x", "labels": LABELS},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": LABELS},
        "template": {"metadata": {"labels": LABELS}, "spec": {"containers": [CONTAINER]}},
    },
}
POD_MONITOR = {
    "apiVersion": f"{PROMOP}/v1",
    "kind": "PodMonitor",
    "metadata": {"name": "x", "labels": {"release": "kube-prometheus-stack"}},
    "spec": {
        "selector": {"matchLabels": LABELS},
        "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s", "honorLabels": False}],
    },
}
SERVICE_MONITOR = {
    "apiVersion": f"{PROMOP}/v1",
    "kind": "ServiceMonitor",
    "metadata": {"name": "x"},
    "spec": {"selector": {"matchLabels": LABELS}, "endpoints": [{"port": "http", "interval": "30s"}]},
}
PROMETHEUS_RULE = {
    "apiVersion": f"{PROMOP}/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "x"},
    "spec": {
        "groups": [
            {
                "name": "g",
                "interval": "30s",
                "rules": [
                    {"record": "job:up:sum", "expr": "sum by (job) (up)", "labels": {"service": "s"}},
                    {
                        "alert": "Down",
                        "expr": "job:up:sum == 0",
                        "for": "5m",
                        "labels": {"severity": "page"},
                        "annotations": {"summary": "down"},
                    },
                ],
            }
        ]
    },
}
ALERTMANAGER_CONFIG = {
    "apiVersion": f"{PROMOP}/v1alpha1",
    "kind": "AlertmanagerConfig",
    "metadata": {"name": "amc", "namespace": "obs"},
    "spec": {
        "route": {
            "receiver": "hook",
            "groupBy": ["alertname"],
            "groupWait": "30s",
            "matchers": [{"name": "alertname", "matchType": "=~", "value": "Down|Up"}],
            "routes": [{"receiver": "hook-page", "matchers": [{"name": "severity", "value": "page"}]}],
        },
        "receivers": [
            {
                "name": name,
                "webhookConfigs": [
                    {
                        "url": f"http://collector:4318{WEBHOOK_PATH}",
                        "sendResolved": True,
                        "httpConfig": {"authorization": {"credentials": {"name": "tokens", "key": "webhook"}}},
                    }
                ],
            }
            for name in ("hook", "hook-page")
        ],
    },
}
DASHBOARD = {
    "apiVersion": "grafana.integreatly.org/v1beta1",
    "kind": "GrafanaDashboard",
    "metadata": {"name": "x", "labels": LABELS},
    "spec": {"instanceSelector": {"matchLabels": {"dashboards": "grafana"}}, "configMapRef": {"name": "x", "key": "x"}},
}
DASHBOARD_BAD: dict[str, tuple[str, Any, str]] = {  # id: (path, value or None to delete it, what the error says)
    "dashboard-misspelled-field": ("spec.configMapRef.keys", "x.json", "'keys' was unexpected"),
    "dashboard-bool-as-string": ("spec.allowCrossNamespaceImport", "true", "spec.allowCrossNamespaceImport"),
    "dashboard-no-instance-selector": ("spec.instanceSelector", None, "'instanceSelector' is a required property"),
    "dashboard-not-a-duration": ("spec.resyncPeriod", "10 minutes", "spec.resyncPeriod"),
    "dashboard-not-base64": ("spec.gzipJson", "{}", "spec.gzipJson: '{}' is not a 'byte'"),
    "dashboard-unknown-metadata-field": ("metadata.label", {}, "metadata: Additional properties"),
    "dashboard-old-api-version": ("apiVersion", "grafana.integreatly.org/v1alpha1", "no schema for GrafanaDashboard"),
}
GOOD = {
    "Deployment": DEPLOYMENT,
    "Service": {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"selector": LABELS, "ports": [{"name": "http", "port": 4318, "targetPort": "http"}]},
    },
    "Job": {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "x"},
        "spec": {"template": {"spec": {"restartPolicy": "OnFailure", "containers": [CONTAINER]}}},
    },
    "PodDisruptionBudget": {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "x"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": LABELS}},
    },
    "HorizontalPodAutoscaler": {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "x"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
            "minReplicas": 2,
            "maxReplicas": 5,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}],
        },
    },
    "NetworkPolicy": {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "x"},
        "spec": {"podSelector": {"matchLabels": LABELS}, "ingress": [{"from": [{"podSelector": {}}]}]},
    },
    "ConfigMap": {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "labels": {"grafana_dashboard": "1"}},
        "data": {"x.json": "{}"},
    },
    "PodMonitor": POD_MONITOR,
    "ServiceMonitor": SERVICE_MONITOR,
    "PrometheusRule": PROMETHEUS_RULE,
    "AlertmanagerConfig": ALERTMANAGER_CONFIG,
    "GrafanaDashboard": DASHBOARD,
}


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_a_good_object_of_each_kind_validates(kind: str) -> None:
    assert K.validate_object(GOOD[kind]) == []


CONTAINER_PATH = "spec.template.spec.containers.0"
BAD = [
    # core kinds: Kubernetes' strict OpenAPI schemas
    pytest.param(
        K.changed(DEPLOYMENT, "spec.replica", 2), "'replica' was unexpected", id="deployment-misspelled-field"
    ),
    pytest.param(K.changed(DEPLOYMENT, "spec.replicas", "2"), "spec.replicas", id="deployment-replicas-as-string"),
    pytest.param(
        K.changed(DEPLOYMENT, f"{CONTAINER_PATH}.readinessProbe.httpGet.paht", "/readyz"),
        "'paht' was unexpected",
        id="deployment-probe-misspelled-deep",
    ),
    pytest.param(
        K.changed(DEPLOYMENT, f"{CONTAINER_PATH}.ports.0.containerPort", "9400"),
        "containerPort",
        id="deployment-port-as-string",
    ),
    pytest.param(K.changed(DEPLOYMENT, "spec.selector", delete=True), "'selector' is a required", id="no-selector"),
    pytest.param(K.changed(DEPLOYMENT, "metadata.name", delete=True), "metadata.name: required", id="no-name"),
    pytest.param(K.changed(GOOD["Service"], "spec.ports.0.port", "4318"), "spec.ports[0].port", id="service-port-str"),
    pytest.param(
        K.changed(GOOD["HorizontalPodAutoscaler"], "spec.targetCPUUtilizationPercentage", 70),
        "'targetCPUUtilizationPercentage' was unexpected",
        id="hpa-v1-field-in-v2",
    ),
    pytest.param(
        K.changed(GOOD["PodDisruptionBudget"], "apiVersion", "policy/v1beta1"),
        "no schema for PodDisruptionBudget (policy/v1beta1)",
        id="pdb-removed-api-version",
    ),
    pytest.param(
        K.changed(GOOD["HorizontalPodAutoscaler"], "apiVersion", "autoscaling/v2beta2"),
        "no schema for HorizontalPodAutoscaler",
        id="hpa-removed-api-version",
    ),
    pytest.param(K.changed(DEPLOYMENT, "kind", "DeploymentSpec"), "no schema for DeploymentSpec", id="not-an-object"),
    # Prometheus Operator kinds: cloudcoil's models, strict, nothing lost
    pytest.param(
        K.changed(POD_MONITOR, "spec.podMetricsEndpoints.0.interval", 30),
        "spec.podMetricsEndpoints[0].interval",
        id="podmonitor-interval-as-int",
    ),
    pytest.param(
        K.changed(POD_MONITOR, "spec.podMetricsEndpoints.0.interval", "30 seconds"),
        "spec.podMetricsEndpoints[0].interval",
        id="podmonitor-interval-not-a-duration",
    ),
    pytest.param(
        K.changed(POD_MONITOR, "spec.podMetricsEndpoints.0.honorLabels", "false"),
        "honorLabels",
        id="podmonitor-bool-as-string",
    ),
    pytest.param(
        K.changed(POD_MONITOR, "spec.podMetricsEndpoints.0.scrapeIntervall", "15s"),
        "scrapeIntervall: unknown field",
        id="podmonitor-unknown-field",
    ),
    pytest.param(
        K.changed(POD_MONITOR, "spec.podMetricsEndpoints.0.scrape_timeout", "10s"),
        "scrape_timeout: unknown field",
        id="podmonitor-python-name-of-a-field",
    ),
    pytest.param(K.changed(POD_MONITOR, "spec.selector", delete=True), "spec.selector", id="podmonitor-no-selector"),
    pytest.param(
        K.changed(SERVICE_MONITOR, "spec.podMetricsEndpoints", []),
        "spec.podMetricsEndpoints: unknown field",
        id="servicemonitor-podmonitor-field",
    ),
    pytest.param(
        K.changed(PROMETHEUS_RULE, "spec.groups.0.rules.1.for", 300),
        "spec.groups[0].rules[1].for",
        id="rule-for-as-int",
    ),
    pytest.param(
        K.changed(PROMETHEUS_RULE, "spec.groups.0.rules.1.annotation", {"summary": "x"}),
        "annotation: unknown field",
        id="rule-misspelled-annotations",
    ),
    pytest.param(
        K.changed(PROMETHEUS_RULE, "spec.groups.0.name", delete=True), "spec.groups[0].name", id="group-without-name"
    ),
    pytest.param(
        K.changed(PROMETHEUS_RULE, "apiVersion", f"{PROMOP}/v1alpha1"),
        "no schema for PrometheusRule",
        id="rule-wrong-api-version",
    ),
    pytest.param(
        K.changed(ALERTMANAGER_CONFIG, "spec.route.matchers.0.matchType", "=="),
        "spec.route.matchers[0].matchType",
        id="amc-bad-match-type",
    ),
    pytest.param(
        K.changed(ALERTMANAGER_CONFIG, "spec.receivers.0.webhookConfigs.0.sendResolved", "yes"),
        "sendResolved",
        id="amc-bool-as-string",
    ),
    pytest.param(
        K.changed(ALERTMANAGER_CONFIG, "spec.receivers.0.webhook_configs", []),
        "webhook_configs: unknown field",
        id="amc-alertmanager-yml-spelling",
    ),
    *(pytest.param(K.changed(DASHBOARD, p, v, delete=v is None), e, id=i) for i, (p, v, e) in DASHBOARD_BAD.items()),
    # no schema at all
    pytest.param(
        {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "x"}},
        "no schema for Widget",
        id="unknown-kind",
    ),
    pytest.param({"kind": "ConfigMap", "metadata": {"name": "x"}}, "apiVersion: required", id="no-api-version"),
]


@pytest.mark.parametrize(("doc", "expected"), BAD)
def test_a_bad_object_fails_and_says_where(doc: dict[str, Any], expected: str) -> None:
    errors = K.validate_object(doc)
    assert errors, "the validator accepted a bad object"
    assert any(expected in e for e in errors), errors


def test_a_patch_is_checked_without_the_required_fields_but_with_names_and_types() -> None:
    patch = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vllm"},
        "spec": {"template": {"spec": {"containers": [CONTAINER]}}},
    }
    assert K.validate_object(patch)  # a full object needs its selector
    assert K.validate_object(patch, partial=True) == []
    bad = K.changed(patch, "spec.template.spec.containers.0.imagePullPolicyy", "Always")
    assert any("'imagePullPolicyy' was unexpected" in e for e in K.validate_object(bad, partial=True))
    assert K.validate_object(POD_MONITOR, partial=True), "CRD kinds have no partial check"


def test_the_stated_versions() -> None:
    assert K.KUBERNETES_VERSION == "1.32"
    assert K.schema_dir().startswith("v1.32.")
    assert K.PROMETHEUS_OPERATOR_VERSION.startswith("0.")


# --- the operator's rendering of an AlertmanagerConfig, checked by amtool ------------------------
def render(amc: dict[str, Any], tmp_path: Path, namespace_matcher: str | None = None) -> Path:
    """``amc`` rendered to tmp_path/alertmanager.yml, its Secret keys as files beside it."""
    secrets = tmp_path / "secrets"
    config = K.alertmanager_yml(amc, secrets_dir=str(secrets), namespace_matcher=namespace_matcher)
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            if "http_config" in hook:
                token = Path(hook["http_config"]["authorization"]["credentials_file"])
                token.parent.mkdir(parents=True, exist_ok=True)
                token.write_text("test-token\n")
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def routes_to(config: Path, labels: dict[str, str]) -> list[str]:
    """The receivers ``amtool config routes test`` sends an alert with ``labels`` to."""
    args = (f"--config.file={config}", *(f"{k}={v}" for k, v in labels.items()))
    result = run(require_tool("amtool"), "config", "routes", "test", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().split(",")


def check_config(config: Path) -> None:
    result = run(require_tool("amtool"), "check-config", str(config))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_the_rendering_of_an_alertmanager_config_routes_and_is_not_vacuous(tmp_path: Path) -> None:
    config = render(ALERTMANAGER_CONFIG, tmp_path)
    check_config(config)
    assert routes_to(config, {"alertname": "Down", "severity": "ticket"}) == ["obs/amc/hook"]
    assert routes_to(config, {"alertname": "Down", "severity": "page"}) == ["obs/amc/hook-page"]
    assert routes_to(config, {"alertname": "Watchdog"}) == [K.NULL_RECEIVER]


def test_with_the_operators_default_matcher_strategy_only_the_namespace_is_routed(tmp_path: Path) -> None:
    """``OnNamespace``: the route also matches ``namespace="obs"``; an alert without that label (one of a
    rule that aggregates ``namespace`` away) goes nowhere."""
    config = render(ALERTMANAGER_CONFIG, tmp_path, namespace_matcher="obs")
    check_config(config)
    assert routes_to(config, {"alertname": "Down", "namespace": "obs"}) == ["obs/amc/hook"]
    assert routes_to(config, {"alertname": "Down"}) == [K.NULL_RECEIVER]


def test_the_rendering_refuses_what_it_does_not_know() -> None:
    slack = K.changed(ALERTMANAGER_CONFIG, "spec.receivers.0.slackConfigs", [{"channel": "#x"}])
    with pytest.raises(ValueError, match="slackConfigs"):
        K.alertmanager_yml(slack, secrets_dir="s")
    with pytest.raises(ValueError, match="tlsConfig"):
        K.alertmanager_yml(
            K.changed(ALERTMANAGER_CONFIG, "spec.receivers.0.webhookConfigs.0.httpConfig.tlsConfig", {}),
            secrets_dir="s",
        )


# --- the generated tree --------------------------------------------------------------------------
T = K.Tree(TREE)
KUSTOMIZE_MAJOR = 4
"""Components and ``patches`` need kustomize v4 or later (kubectl 1.21+); Debian 12's kubernetes-client
is kubectl 1.20 (kustomize v2)."""


def require_kustomize() -> str:
    """kubectl with a kustomize that builds Components; skip without it, but fail under CI."""
    kubectl = require_tool("kubectl")
    version = run(kubectl, "version", "--client").stdout
    found = re.search(r"Kustomize Version: v(\d+)", version)
    if found is None or int(found[1]) < KUSTOMIZE_MAJOR:
        message = f"{kubectl}'s kustomize is older than v{KUSTOMIZE_MAJOR} ({version.strip()[:120]})"
        if os.environ.get("CI"):
            pytest.fail(message + " and CI is set: this test must not be skipped")
        pytest.skip(message)
    return kubectl


REQUIRED_KINDS = {"Deployment", "Service", "Job", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy"}
REQUIRED_KINDS |= {"ConfigMap", "PrometheusRule", "AlertmanagerConfig"}


def test_the_tree_is_there_with_every_kind_the_issue_asks_for() -> None:
    assert (TREE / "kustomization.yaml").is_file(), f"{TREE.relative_to(ROOT)}: no kustomization.yaml"
    kinds = {doc.get("kind") for doc in T.objects()}
    assert REQUIRED_KINDS <= kinds, f"missing: {sorted(REQUIRED_KINDS - kinds)}"
    assert kinds & {"PodMonitor", "ServiceMonitor"}, "no PodMonitor or ServiceMonitor"


@pytest.mark.parametrize(("path", "doc"), [pytest.param(p, d, id=i) for i, p, d in T.documents()])
def test_every_document_of_the_tree_validates(path: Path | None, doc: dict[str, Any]) -> None:
    assert K.validate_object(doc, partial=path is None or T.is_patch(path)) == []


def test_the_grafana_dashboards_of_the_grafana_operator_option_validate(tmp_path: Path) -> None:
    """``--grafana-operator`` (off in the committed tree): its tree, written out, has GrafanaDashboards, valid."""
    spec = load(ROOT / "inferwatch" / "alerts" / "slos.yaml", V.Vocabulary())
    tree = K.Tree.written(tmp_path, generate(spec, V.Vocabulary(), KubeOptions(grafana_operator=True)))
    errors = {d["metadata"]["name"]: K.validate_object(d) for d in tree.objects("GrafanaDashboard")}
    assert errors and {k: v for k, v in errors.items() if v} == {}


def test_every_file_of_the_tree_is_named_by_a_kustomization() -> None:
    """A manifest no kustomization lists is applied by nothing (and would be checked as a full object)."""
    named = {p for k in T.kustomization_files() for part in K.referenced(k.parent) for p in part}
    orphans = [p.relative_to(TREE).as_posix() for p in T.manifest_files() if p.resolve() not in named]
    assert orphans == []


def test_kubectl_kustomize_builds_the_top_of_the_tree() -> None:
    assert TREE in T.builds()


@pytest.mark.parametrize("directory", T.builds(), ids=lambda d: d.relative_to(TREE).as_posix() or ".")
def test_kubectl_kustomize_builds_the_same_objects_and_they_validate(directory: Path) -> None:
    """``kubectl kustomize`` succeeds, builds the objects of the files its kustomization reaches (no more,
    no fewer: configMapGenerator/secretGenerator objects aside), and every built object (the patches
    applied) validates in full."""
    kubectl = require_kustomize()
    result = run(kubectl, "kustomize", str(directory.relative_to(ROOT)))
    assert result.returncode == 0, result.stderr
    built = K.load_all(result.stdout)
    spec = K.kustomization(directory)
    prefix, suffix = spec.get("namePrefix", ""), spec.get("nameSuffix", "")
    files = K.referenced(directory)[0]
    expected = {
        (a, k, f"{prefix}{n}{suffix}")
        for path in sorted(files)
        for a, k, n in map(K.identity, K.load_all(path.read_text()))
    }
    generated = [f"{prefix}{g['name']}" for key in ("configMapGenerator", "secretGenerator") for g in spec.get(key, [])]
    got = {K.identity(doc) for doc in built}
    assert len(got) == len(built), "kustomize built an object twice"
    extra = {i for i in got - expected if not any(i[2].startswith(name) for name in generated)}
    assert got >= expected and not extra, f"missing: {sorted(expected - got)}; not in the tree: {sorted(extra)}"
    errors = {"/".join(K.identity(doc)): K.validate_object(doc) for doc in built}
    assert {k: v for k, v in errors.items() if v} == {}


@pytest.mark.parametrize("component", T.components(), ids=lambda d: d.relative_to(TREE).as_posix())
def test_each_component_applies_to_the_examples_and_the_result_validates(component: Path, tmp_path: Path) -> None:
    """A sidecar Component (the patch a user lists in their own kustomization) applied to every Kustomization
    of the tree it fits (the example engines): ``kubectl kustomize`` builds, and the patched objects validate."""
    kubectl = require_kustomize()
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree)
    fits = 0
    for base in T.builds():
        check = tmp_path / "check"
        check.mkdir(exist_ok=True)
        spec = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [(Path("..") / "tree" / base.relative_to(TREE)).as_posix()],
            "components": [(Path("..") / "tree" / component.relative_to(TREE)).as_posix()],
        }
        (check / "kustomization.yaml").write_text(yaml.safe_dump(spec))
        result = run(kubectl, "kustomize", str(check), cwd=tmp_path)
        if result.returncode != 0 and "no matches for" in result.stderr:
            continue  # the patch's target is not among this base's objects
        assert result.returncode == 0, f"{base}: {result.stderr}"
        fits += 1
        errors = {"/".join(K.identity(doc)): K.validate_object(doc) for doc in K.load_all(result.stdout)}
        assert {k: v for k, v in errors.items() if v} == {}, base
    assert fits, f"{component.relative_to(TREE)} patches no object of the tree's kustomizations"


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file (rules.yml in a directory of its own)."""
    rules = T.objects("PrometheusRule")
    assert len(rules) == 1, f"expected one PrometheusRule, found {len(rules)}"
    path = tmp_path_factory.mktemp("prometheusrule") / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rules[0]["spec"]["groups"]}, sort_keys=False))
    return path


def test_promtool_checks_the_prometheus_rules(promtool: str, rules_file: Path) -> None:
    result = run(promtool, "check", "rules", rules_file.name, cwd=rules_file.parent)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", sorted(ALERT_TESTS.glob("*.yaml")), ids=lambda p: p.name)
def test_the_rule_unit_tests_pass_on_the_prometheus_rules(promtool: str, rules_file: Path, test_file: Path) -> None:
    """tests/alerts/'s unit tests (written for the rules of ``generate alerts``), pointed at the extracted file."""
    unit = yaml.safe_load(test_file.read_text())
    unit["rule_files"] = [rules_file.name]
    pointed = rules_file.parent / f"unit_{test_file.name}"
    pointed.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = run(promtool, "test", "rules", pointed.name, cwd=rules_file.parent)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


@pytest.fixture(scope="module")
def alertmanager_config(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The tree's AlertmanagerConfig rendered as the operator does (matcher strategy ``None``), and the config."""
    configs = T.objects("AlertmanagerConfig")
    assert len(configs) == 1, f"expected one AlertmanagerConfig, found {len(configs)}"
    amc = configs[0]
    namespace = (yaml.safe_load((TREE / "kustomization.yaml").read_text()) or {}).get("namespace")
    if namespace and "namespace" not in amc["metadata"]:
        amc = K.changed(amc, "metadata.namespace", namespace)
    path = render(amc, tmp_path_factory.mktemp("alertmanager"))
    return path, yaml.safe_load(path.read_text())


def test_amtool_checks_the_alertmanager_config(alertmanager_config: tuple[Path, dict[str, Any]]) -> None:
    check_config(alertmanager_config[0])


def alert_label_sets() -> list[dict[str, str]]:
    """alertname and the rule's labels of every alert of the PrometheusRule, once each."""
    seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for rule in T.objects("PrometheusRule"):
        for group in rule["spec"]["groups"]:
            for r in group["rules"]:
                if "alert" in r:
                    labels = {"alertname": r["alert"], **r.get("labels", {})}
                    seen.setdefault(tuple(sorted(labels.items())), labels)
    return list(seen.values())


def test_every_inferwatch_alert_is_routed_to_the_collectors_webhook(
    alertmanager_config: tuple[Path, dict[str, Any]],
) -> None:
    """Each alert (its name and its rule's labels) reaches a receiver whose webhooks all post to the
    collector's webhook path, and one whose URL names a severity gets that severity only.

    Routed as an Alertmanager whose ``alertmanagerConfigMatcherStrategy`` is ``None`` routes it: with the
    operator's default (``OnNamespace``) only alerts carrying the AlertmanagerConfig's namespace as a
    label are routed, and the SLO alerts aggregate ``namespace`` away."""
    path, config = alertmanager_config
    hooks = {r["name"]: [h["url"] for h in r.get("webhook_configs", [])] for r in config["receivers"]}
    collector = {name for name, urls in hooks.items() if urls and all(WEBHOOK_PATH in u for u in urls)}
    assert collector, f"no receiver posts to the collector's {WEBHOOK_PATH}: {hooks}"
    label_sets = alert_label_sets()
    names = {labels["alertname"] for labels in label_sets}
    assert set(V.ALERTS) <= names, f"alerts missing from the PrometheusRule: {sorted(set(V.ALERTS) - names)}"
    for labels in label_sets:
        receivers = routes_to(path, labels)
        assert set(receivers) <= collector, f"{labels} -> {receivers}, not the collector ({sorted(collector)})"
        for receiver in receivers:
            for url in hooks[receiver]:
                severity = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("severity")
                assert severity in (None, [labels.get("severity")]), f"{labels} -> {url}"


def test_other_alerts_of_the_cluster_do_not_reach_the_collector(
    alertmanager_config: tuple[Path, dict[str, Any]],
) -> None:
    """With the matcher strategy ``None`` the AlertmanagerConfig's route sees every alert of the cluster:
    only inferwatch's may be taken (kube-prometheus-stack's own go on to their receivers)."""
    path = alertmanager_config[0]
    for labels in (
        {"alertname": "Watchdog", "severity": "none"},
        {"alertname": "KubePodCrashLooping", "severity": "page"},
    ):
        assert routes_to(path, labels) == [K.NULL_RECEIVER], labels
