"""The autoscaling objects of ``inferwatch generate kubernetes`` (issue 33): KEDA ScaledObjects, HPAs and the
prometheus-adapter rules that feed them, for every example engine.

What is checked: the objects exist for each example and point at its Deployment; they validate (KEDA's CRDs
through cloudcoil-models-keda, the HPA against Kubernetes' strict schemas, the adapter's config.yaml against
its documented structure); the queries read the vocabulary's record for the model the example's exporter
publishes, and promtool evaluates them on synthetic series; the HPA arithmetic (replayed as the controller
does it) turns the record into exactly that many replicas; the scale-down waits for the headroom window;
``kubectl kustomize`` builds an example with each Component.
"""

from __future__ import annotations

import functools
import math
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile, duration_seconds, load
from inferwatch.kubernetes import autoscaling as A
from inferwatch.kubernetes.kube_objects import KubeOptions
from inferwatch.kubernetes.manifests import KUSTOMIZATION, generate
from tests.conftest import ROOT, require_tool
from tests.support import kube_schemas as K
from tests.support.promql_check import expr_test

TREE = ROOT / "deploy" / "kubernetes"
SLOS = ROOT / "inferwatch" / "alerts" / "slos.yaml"
HPA_TOLERANCE = 0.1
"""kube-controller-manager's --horizontal-pod-autoscaler-tolerance default: no change within 10 %."""


def spec() -> SLOFile:
    return load(SLOS, V.Vocabulary())


@functools.cache
def _default_tree() -> dict[str, bytes]:
    return generate(spec(), V.Vocabulary(), KubeOptions())


def tree(options: KubeOptions | None = None, slo: SLOFile | None = None) -> dict[str, bytes]:
    """The tree for ``options`` and ``slo`` (the default one built once; callers do not change it)."""
    if options is None and slo is None:
        return dict(_default_tree())
    return generate(slo or spec(), V.Vocabulary(), options or KubeOptions())


def one(files: dict[str, bytes], path: str) -> dict[str, Any]:
    (doc,) = K.load_all(files[path].decode())
    return doc


def scaled_object(engine: str, files: dict[str, bytes] | None = None) -> dict[str, Any]:
    return one(files or tree(), f"autoscaling/{engine}-keda/scaledobject.yaml")


def hpa(engine: str, files: dict[str, bytes] | None = None) -> dict[str, Any]:
    return one(files or tree(), f"autoscaling/{engine}-hpa/horizontalpodautoscaler.yaml")


def adapter_config(files: dict[str, bytes] | None = None) -> dict[str, Any]:
    config_map = one(files or tree(), "autoscaling/prometheus-adapter/configmap.yaml")
    config: dict[str, Any] = yaml.safe_load(config_map["data"][A.ADAPTER_CONFIG_KEY])
    return config


def example(engine: str) -> dict[str, Any]:
    (deployment,) = [
        d for d in K.load_all(tree()[f"examples/engines/{engine}.yaml"].decode()) if d["kind"] == "Deployment"
    ]
    return deployment


def published_model(deployment: dict[str, Any]) -> str:
    """The ``model`` label the example's exporter publishes: its ``--model``, else the name the engine serves."""
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    exporter = containers.pop("inferwatch-exporter")
    for arg in exporter["args"]:
        if arg.startswith("--model="):
            return str(arg.removeprefix("--model="))
    ((engine, container),) = containers.items()
    args: list[str] = container["args"]
    flag = {V.ENGINE_VLLM: "--model", V.ENGINE_TGI: "--model-id", V.ENGINE_SGLANG: "--model-path"}
    flag[V.ENGINE_LLAMACPP] = "--alias"  # llama-server reports its alias (else a file path) as the model
    if engine == V.ENGINE_TRTLLM:
        return args[0]  # trtllm-serve MODEL
    return args[args.index(flag[engine]) + 1]


SELECTOR = re.compile(r"^(?P<func>\w+)\((?P<name>[\w:]+)\{(?P<matchers>.*)\}\)$")
MATCHER = re.compile(r'(?P<label>\w+)(?P<op>=~|!=|=)"(?P<value>(?:[^"\\]|\\.)*)",?')


def parse(query: str) -> tuple[str, str, dict[str, tuple[str, str]]]:
    """``max(name{l="v",...})`` -> (function, metric name, {label: (operator, value)})."""
    found = SELECTOR.match(query)
    assert found, query
    rest, labels = found["matchers"], {}
    while rest:
        m = MATCHER.match(rest)
        assert m, f"cannot read the matchers of {query}: {rest}"
        labels[m["label"]] = (m["op"], m["value"])
        rest = rest[m.end() :]
    return found["func"], found["name"], labels


# --- the objects, per example ---------------------------------------------------------------------------
@pytest.mark.parametrize("engine", V.ENGINES)
def test_each_example_engine_has_a_scaled_object_and_an_hpa_on_its_deployment(engine: str) -> None:
    files = tree()
    deployment = example(engine)
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    assert deployment["metadata"]["name"] == engine
    keda, auto = scaled_object(engine, files), hpa(engine, files)
    assert keda["spec"]["scaleTargetRef"] == target
    assert auto["spec"]["scaleTargetRef"] == target
    for directory, resource in (
        (f"{engine}-keda", "scaledobject.yaml"),
        (f"{engine}-hpa", "horizontalpodautoscaler.yaml"),
    ):
        component = one(files, f"autoscaling/{directory}/{KUSTOMIZATION}")
        assert component["kind"] == "Component" and component["resources"] == [resource]
    assert (keda["spec"]["minReplicaCount"], keda["spec"]["maxReplicaCount"]) == (A.MIN_REPLICAS, A.MAX_REPLICAS)
    assert (auto["spec"]["minReplicas"], auto["spec"]["maxReplicas"]) == (A.MIN_REPLICAS, A.MAX_REPLICAS)
    assert 1 <= A.MIN_REPLICAS < A.MAX_REPLICAS


@pytest.mark.parametrize("engine", V.ENGINES)
def test_the_queries_read_the_vocabulary_record_for_the_model_the_example_publishes(engine: str) -> None:
    model = published_model(example(engine))
    (trigger,) = scaled_object(engine)["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["serverAddress"] == KubeOptions().prometheus_url
    func, name, labels = parse(trigger["metadata"]["query"])
    assert (func, name) == ("max", V.REPLICAS_NEEDED_RECORD)
    assert labels[V.LABEL_MODEL] == ("=", model)
    assert labels[V.LABEL_ROLE] == ("=~", f"|{V.ROLE_UNIFIED}")
    # the HPA's metric is served by exactly one adapter rule, which selects the same record and model
    metric = hpa(engine)["spec"]["metrics"][0]["external"]["metric"]["name"]
    (rule,) = [r for r in adapter_config()["externalRules"] if r["name"]["as"] == metric]
    assert rule["seriesQuery"] == f'{V.REPLICAS_NEEDED_RECORD}{{{V.LABEL_MODEL}="{model}"}}'
    rendered = rule["metricsQuery"].replace("<<.Series>>", V.REPLICAS_NEEDED_RECORD).replace(",<<.LabelMatchers>>", "")
    assert parse(rendered) == (func, name, labels)


def test_the_record_name_comes_from_the_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """No record spelled in the generator: another name in ``V`` is the name in every object."""
    source = (ROOT / "inferwatch" / "kubernetes" / "autoscaling.py").read_text()
    assert V.REPLICAS_NEEDED_RECORD not in source
    monkeypatch.setattr(V, "REPLICAS_NEEDED_RECORD", "test:renamed_record")
    files = tree(KubeOptions())
    query = scaled_object(V.ENGINE_VLLM, files)["spec"]["triggers"][0]["metadata"]["query"]
    assert parse(query)[1] == "test:renamed_record"
    for rule in adapter_config(files)["externalRules"]:
        assert rule["seriesQuery"].startswith("test:renamed_record{")
        assert re.fullmatch(rule["name"]["matches"], "test:renamed_record")


# --- validation -----------------------------------------------------------------------------------------
def test_every_autoscaling_object_validates_and_a_bad_one_does_not() -> None:
    files = tree()
    docs = [
        d
        for name, content in files.items()
        if name.startswith("autoscaling/") and KUSTOMIZATION not in name
        for d in K.load_all(content.decode())
    ]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ConfigMap"] + ["HorizontalPodAutoscaler", "ScaledObject"] * len(V.ENGINES))
    assert {K.identity(d): K.validate_object(d) for d in docs if K.validate_object(d)} == {}
    keda = scaled_object(V.ENGINE_VLLM, files)
    bad = {
        "spec.triggers.0.metadata.threshold": (1, "valid string"),  # KEDA's metadata values are strings
        "spec.minReplicaCount": ("1", "valid integer"),
        "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindow": (1, "unknown field"),
    }
    for path, (value, expected) in bad.items():
        errors = K.validate_object(K.changed(keda, path, value))
        assert any(expected in e for e in errors), (path, errors)
    assert K.validate_object(K.changed(keda, "spec.scaleTargetRef", delete=True))
    auto = hpa(V.ENGINE_VLLM, files)
    assert K.validate_object(K.changed(auto, "spec.metrics.0.external.metricName", "x"))
    assert K.validate_object(K.changed(auto, "spec.behavior.scaleDown.stabilizationWindowSeconds", "1800"))


ADAPTER_RULE_KEYS = {"seriesQuery", "seriesFilters", "resources", "name", "metricsQuery"}
ADAPTER_CONFIG_KEYS = {"rules", "externalRules", "resourceRules"}


def adapter_errors(config: Any) -> list[str]:
    """prometheus-adapter's config.yaml against its documented structure (docs/config.md, externalmetrics.md):
    the rule lists and each rule's fields, the required ones, the Go-template placeholders of the query."""
    if not isinstance(config, dict) or set(config) - ADAPTER_CONFIG_KEYS:
        return [f"top level: only {sorted(ADAPTER_CONFIG_KEYS)}"]
    errors = []
    for index, rule in enumerate(config.get("externalRules", [])):
        where = f"externalRules[{index}]"
        errors += [f"{where}.{k}: unknown field" for k in set(rule) - ADAPTER_RULE_KEYS]
        errors += [f"{where}.{k}: required" for k in ("seriesQuery", "metricsQuery", "name") if not rule.get(k)]
        name = rule.get("name") or {}
        if set(name) - {"matches", "as"} or not isinstance(name.get("as", ""), str):
            errors.append(f"{where}.name: matches and as only")
        query = str(rule.get("metricsQuery", ""))
        errors += [f"{where}.metricsQuery: no {p}" for p in ("<<.Series>>", "<<.LabelMatchers>>") if p not in query]
        resources = rule.get("resources") or {}
        if set(resources) - {"overrides", "template", "namespaced"}:
            errors.append(f"{where}.resources: overrides, template and namespaced only")
    return errors


def test_the_adapter_config_has_the_documented_structure_and_reads_the_record() -> None:
    config = adapter_config()
    assert adapter_errors(config) == []
    rules = config["externalRules"]
    assert [r["name"]["as"] for r in rules] == [
        hpa(e)["spec"]["metrics"][0]["external"]["metric"]["name"] for e in V.ENGINES
    ]
    for rule in rules:
        assert re.fullmatch(rule["name"]["matches"], V.REPLICAS_NEEDED_RECORD), rule
        assert rule["seriesQuery"].startswith(V.REPLICAS_NEEDED_RECORD + "{")
        # the record carries no namespace label: the HPA's namespace must not be added to the query
        assert rule["resources"] == {"namespaced": False}
    # the check is not vacuous
    broken = [{**rules[0], "metricsQuery": "max(x)"}, {k: v for k, v in rules[0].items() if k != "seriesQuery"}]
    assert len(adapter_errors({"externalRules": broken})) == 3
    assert adapter_errors({"externalRules": [{**rules[0], "seriesquery": "x"}]})
    assert adapter_errors({"externals": []})


def test_no_hpa_selects_the_model_by_label() -> None:
    """A model name like Qwen/Qwen2.5-7B-Instruct is not a valid Kubernetes label value (no ``/``): an HPA whose
    metric selector held it would be refused by the API server, so the adapter rule holds the model instead."""
    for engine in V.ENGINES:
        assert "selector" not in hpa(engine)["spec"]["metrics"][0]["external"]["metric"]
    assert "/" in published_model(example(V.ENGINE_VLLM))


# --- the queries, evaluated -------------------------------------------------------------------------------
SERIES = [
    # the record of the example's model, from two SLO files (service), with and without a role label
    (f'{V.REPLICAS_NEEDED_RECORD}{{model="MODEL",service="a"}}', "3x15"),
    (f'{V.REPLICAS_NEEDED_RECORD}{{model="MODEL",service="b",role="unified"}}', "4x15"),
    # what it must not read: the prefill side of a split fleet, another model
    (f'{V.REPLICAS_NEEDED_RECORD}{{model="MODEL",service="a",role="prefill"}}', "9x15"),
    (f'{V.REPLICAS_NEEDED_RECORD}{{model="other",service="a"}}', "20x15"),
]


def test_promtool_evaluates_the_keda_and_adapter_queries_to_the_replicas_needed(promtool: str, tmp_path: Path) -> None:
    model = published_model(example(V.ENGINE_VLLM))
    series = [(s.replace("MODEL", model), v) for s, v in SERIES]
    query = scaled_object(V.ENGINE_VLLM)["spec"]["triggers"][0]["metadata"]["query"]
    expr_test(promtool, tmp_path, query, series, [{"labels": "{}", "value": 4}])
    rule = adapter_config()["externalRules"][0]
    expr_test(promtool, tmp_path, f"count({rule['seriesQuery']})", series, [{"labels": "{}", "value": 3}])
    template = rule["metricsQuery"].replace("<<.Series>>", V.REPLICAS_NEEDED_RECORD)
    # the adapter's matchers: none (namespaced: false, no selector), or some a user adds with a selector
    for matchers, value in (("", 4), ('service="a"', 3)):
        expr_test(
            promtool,
            tmp_path,
            template.replace("<<.LabelMatchers>>", matchers),
            series,
            [{"labels": "{}", "value": value}],
        )


# --- the arithmetic ---------------------------------------------------------------------------------------
def hpa_desired(current: int, metric: float, target: dict[str, Any], low: int, high: int) -> int:
    """The HPA controller's desired replicas for one External metric, as its replica calculator computes them
    (``GetExternalPerPodMetricReplicas`` / ``GetExternalMetricReplicas``): ``AverageValue`` asks for
    ceil(metric / target), ``Value`` for ceil(current x metric / target); within the tolerance of the usage
    ratio the count stays; the result is clamped to [low, high]."""
    if target["type"] == "AverageValue":
        per_pod = float(target["averageValue"])
        ratio, desired = metric / (per_pod * current), math.ceil(metric / per_pod)
    elif target["type"] == "Value":
        ratio = metric / float(target["value"])
        desired = math.ceil(ratio * current)
    else:
        raise AssertionError(f"not an External metric target: {target}")
    if abs(ratio - 1.0) <= HPA_TOLERANCE:
        desired = current
    return min(max(desired, low), high)


def keda_target(trigger: dict[str, Any]) -> dict[str, Any]:
    """The HPA target KEDA writes for a trigger: ``metricType`` (default AverageValue) with the threshold."""
    kind = trigger.get("metricType", "AverageValue")
    key = {"AverageValue": "averageValue", "Value": "value"}[kind]
    return {"type": kind, key: trigger["metadata"]["threshold"]}


def wrong_replicas(target: dict[str, Any], low: int, high: int) -> list[tuple[int, int, int]]:
    """(current, needed, desired) where the HPA would not land on ``needed`` though it is outside the tolerance."""
    out = []
    for current in range(low, high + 1):
        for needed in range(low, high + 1):
            if abs(needed / current - 1.0) <= HPA_TOLERANCE:
                continue  # the controller's tolerance keeps the count; nothing a target can change
            desired = hpa_desired(current, float(needed), target, low, high)
            if desired != needed:
                out.append((current, needed, desired))
    return out


def test_the_desired_replicas_are_the_replicas_needed() -> None:
    """From any current count, both objects ask for exactly the record's value (what metricType decides)."""
    keda = scaled_object(V.ENGINE_VLLM)
    low, high = keda["spec"]["minReplicaCount"], keda["spec"]["maxReplicaCount"]
    (trigger,) = keda["spec"]["triggers"]
    assert wrong_replicas(keda_target(trigger), low, high) == []
    auto = hpa(V.ENGINE_VLLM)["spec"]
    assert wrong_replicas(auto["metrics"][0]["external"]["target"], auto["minReplicas"], auto["maxReplicas"]) == []
    # the replay is not vacuous: metricType Value (current x metric) would overshoot, e.g. 3 needing 3 -> 8 (max)
    wrong = wrong_replicas(keda_target({**trigger, "metricType": "Value"}), low, high)
    assert (2, 3, 6) in wrong and len(wrong) > 10


def test_the_scale_down_waits_for_the_headroom_window_and_the_scale_up_does_not() -> None:
    window = duration_seconds(spec().headroom.window)
    for engine in V.ENGINES:
        behaviors = (
            scaled_object(engine)["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
            hpa(engine)["spec"]["behavior"],
        )
        for behavior in behaviors:
            assert behavior == behaviors[0]
            down = behavior["scaleDown"]
            assert down["stabilizationWindowSeconds"] == window >= 600
            assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]
            assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    # another window in the SLO file, another wait, within the HPA's 10 min to 1 h
    for text, seconds in (("2h", 3600), ("20m", 1200), ("5m", 600)):
        slo = spec().model_copy(update={"headroom": spec().headroom.model_copy(update={"window": text})})
        assert (
            hpa(V.ENGINE_TGI, tree(slo=slo))["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == seconds
        )


def test_options_shape_the_autoscaling_objects() -> None:
    files = tree(KubeOptions(engines=(V.ENGINE_VLLM,), prometheus_url="http://prom.example:9090"))
    assert sorted(n for n in files if n.startswith("autoscaling/")) == [
        "autoscaling/prometheus-adapter/configmap.yaml",
        f"autoscaling/prometheus-adapter/{KUSTOMIZATION}",
        "autoscaling/vllm-hpa/horizontalpodautoscaler.yaml",
        f"autoscaling/vllm-hpa/{KUSTOMIZATION}",
        f"autoscaling/vllm-keda/{KUSTOMIZATION}",
        "autoscaling/vllm-keda/scaledobject.yaml",
    ]
    assert (
        scaled_object(V.ENGINE_VLLM, files)["spec"]["triggers"][0]["metadata"]["serverAddress"]
        == "http://prom.example:9090"
    )
    # no Prometheus URL: no ScaledObject (it has nothing to ask), the HPA path stays
    without = tree(replace(KubeOptions(), prometheus_url=None))
    assert not [n for n in without if "-keda/" in n]
    assert f"autoscaling/{V.ENGINE_VLLM}-hpa/horizontalpodautoscaler.yaml" in without
    # not part of `kubectl apply -k` of the tree's top
    assert not [r for r in yaml.safe_load(tree()[KUSTOMIZATION])["resources"] if r.startswith("autoscaling/")]


# --- kustomize --------------------------------------------------------------------------------------------
def kubectl_with_components() -> str:
    kubectl = require_tool("kubectl")
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"Kustomize Version: v(\d+)", version)
    if found is None or int(found[1]) < 4:
        if os.environ.get("CI"):
            pytest.fail(f"{kubectl}'s kustomize cannot build Components and CI is set")
        pytest.skip(f"{kubectl}'s kustomize cannot build Components")
    return kubectl


@pytest.mark.parametrize("kind", ["keda", "hpa"])
def test_an_example_with_an_autoscaling_component_builds(kind: str, tmp_path: Path) -> None:
    """Your kustomization: the example engines, the exporter already in, and one autoscaling Component."""
    kubectl = kubectl_with_components()
    user = tmp_path / "user"
    user.mkdir()
    rel = Path("..") / "tree"
    K.Tree.written(tmp_path / "tree", tree())
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "serving",
        "resources": [(rel / "examples" / "engines").as_posix()],
        "components": [(rel / "autoscaling" / f"{V.ENGINE_VLLM}-{kind}").as_posix()],
    }
    (user / KUSTOMIZATION).write_text(yaml.safe_dump(kustomization))
    result = subprocess.run([kubectl, "kustomize", str(user)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    built = K.load_all(result.stdout)
    (scaler,) = [d for d in built if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    deployments = {d["metadata"]["name"]: d for d in built if d["kind"] == "Deployment"}
    assert scaler["metadata"]["namespace"] == "serving" == deployments[V.ENGINE_VLLM]["metadata"]["namespace"]
    assert scaler["spec"]["scaleTargetRef"]["name"] in deployments
    assert {"/".join(K.identity(d)): K.validate_object(d) for d in built if K.validate_object(d)} == {}
