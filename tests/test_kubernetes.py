"""``inferwatch generate kubernetes``: the committed tree, determinism, one source of rules, the containers'
arguments as inferwatch's own CLI parses them, and what each option changes.

The objects' schemas (Kubernetes' OpenAPI, the CRDs) are tests/test_kubernetes_validate.py's; the ports and
probe paths, asked of running components, tests/test_kubernetes_probes.py's.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from inferwatch.alerts.generate import ALERTMANAGER_FILE, RULES_FILE
from inferwatch.alerts.generate import generate as generate_alerts
from inferwatch.cli import app
from inferwatch.core import topology
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile, load
from inferwatch.kubernetes.kube_objects import HEADER, KubeOptions
from inferwatch.kubernetes.manifests import KUSTOMIZATION, SEPARATE, generate
from tests.conftest import ROOT, require_tool

TREE = ROOT / "deploy" / "kubernetes"
SLOS = ROOT / "inferwatch" / "alerts" / "slos.yaml"


def spec() -> SLOFile:
    return load(SLOS, V.Vocabulary())


@functools.cache
def _default_tree() -> dict[str, bytes]:
    return generate(spec(), V.Vocabulary(), KubeOptions())


def tree(options: KubeOptions | None = None) -> dict[str, bytes]:
    """The tree for ``options`` (the default tree is built once; callers do not change it)."""
    return generate(spec(), V.Vocabulary(), options) if options is not None else dict(_default_tree())


def documents(files: dict[str, bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path, object)`` of every YAML document of the tree."""
    for name, content in files.items():
        for doc in yaml.safe_load_all(content):
            if doc:
                yield name, doc


def objects(files: dict[str, bytes], kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in documents(files) if doc.get("kind") == kind]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    template = (doc.get("spec") or {}).get("template")
    return template.get("spec") if template else None


def containers(files: dict[str, bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path, container)`` of every container and init container, in objects and patches."""
    for name, doc in documents(files):
        spec_ = pod_spec(doc)
        for container in [*(spec_ or {}).get("initContainers", []), *(spec_ or {}).get("containers", [])]:
            yield name, container


def inferwatch_containers(files: dict[str, bytes], image: str) -> list[tuple[str, dict[str, Any]]]:
    return [(name, c) for name, c in containers(files) if c.get("image") == image]


def test_deploy_kubernetes_is_the_generated_tree_byte_for_byte() -> None:
    """deploy/kubernetes/ holds exactly the default tree, current."""
    files = tree()
    on_disk = {p.relative_to(TREE).as_posix() for p in TREE.rglob("*") if p.is_file()}
    assert on_disk == set(files), "run `make goldens` (inferwatch generate kubernetes --out deploy/kubernetes)"
    for name, content in files.items():
        assert (TREE / name).read_bytes() == content, f"{name} is stale: run `make goldens`"
    result = CliRunner().invoke(app, ["generate", "kubernetes", "--slo", str(SLOS), "--out", str(TREE), "--check"])
    assert result.exit_code == 0, result.output


def test_the_tree_is_deterministic_and_says_it_is_generated() -> None:
    first, second = tree(KubeOptions()), tree(KubeOptions())
    assert first == second
    assert list(first) == sorted(first)
    for name, content in first.items():
        assert content.startswith(HEADER.encode()), name


def test_the_kustomization_lists_every_object_file_and_sets_the_namespace() -> None:
    files = tree()
    kustomization = yaml.safe_load(files[KUSTOMIZATION])
    expected = sorted(n for n in files if n != KUSTOMIZATION and not n.startswith(SEPARATE))
    assert kustomization["resources"] == expected
    assert kustomization["namespace"] == "inferwatch"
    examples = yaml.safe_load(files["examples/engines/kustomization.yaml"])
    assert examples["resources"] == [f"{e}.yaml" for e in V.ENGINES]


def test_the_prometheus_rule_holds_generate_alerts_groups_rule_by_rule() -> None:
    """One source, two packagings: the PrometheusRule's groups are those of rules.yml, in order, rule by rule."""
    (rule,) = objects(tree(), "PrometheusRule")
    expected = yaml.safe_load(generate_alerts(spec(), V.Vocabulary())[RULES_FILE])["groups"]
    groups = rule["spec"]["groups"]
    assert [g["name"] for g in groups] == [g["name"] for g in expected]
    for got, want in zip(groups, expected, strict=True):
        assert {k: v for k, v in got.items() if k != "rules"} == {k: v for k, v in want.items() if k != "rules"}
        assert len(got["rules"]) == len(want["rules"]), got["name"]
        for mine, theirs in zip(got["rules"], want["rules"], strict=True):
            assert mine == theirs, (got["name"], theirs.get("record") or theirs.get("alert"))


def _matcher_text(m: dict[str, str]) -> str:
    return f'{m["name"]}{m["matchType"]}"{m["value"]}"'


def _route_tree(route: dict[str, Any]) -> list[tuple[str, list[str]]]:
    return [(r["receiver"], [_matcher_text(m) for m in r.get("matchers", [])]) for r in route.get("routes", [])]


def test_the_alertmanager_config_is_generate_alerts_routing_to_the_collector_service() -> None:
    (config,) = objects(tree(), "AlertmanagerConfig")
    routing = yaml.safe_load(generate_alerts(spec(), V.Vocabulary())[ALERTMANAGER_FILE])
    route = config["spec"]["route"]
    assert route["receiver"] == routing["route"]["receiver"]
    assert route["groupBy"] == routing["route"]["group_by"]
    assert _route_tree(route) == [(r["receiver"], r["matchers"]) for r in routing["route"]["routes"]]
    (alertnames,) = route["matchers"]
    assert set(alertnames["value"].split("|")) == set(V.ALERTS)
    assert [r["name"] for r in config["spec"]["receivers"]] == [r["name"] for r in routing["receivers"]]
    webhook = f"http://inferwatch-collector.inferwatch.svc:{topology.COLLECTOR_HTTP_PORT}{topology.WEBHOOK_PATH}"
    for receiver in config["spec"]["receivers"]:
        for hook in receiver["webhookConfigs"]:
            assert hook["url"].startswith(webhook)
            credentials = hook["httpConfig"]["authorization"]["credentials"]
            assert credentials == {"name": "inferwatch-collector", "key": "ingest-token"}


def _protected(ctx: Any) -> list[str]:
    """A group's subcommand and its arguments, before they are resolved (Click 8.2 made the attribute private)."""
    return list(getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", None) or [])


def _resolve(args: list[str]) -> list[str]:
    """Parse ``args`` as ``inferwatch ARGS`` down the subcommand chain without invoking anything; the chain."""
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("inferwatch", list(args), resilient_parsing=False)
    chain = []
    while hasattr(command, "resolve_command"):
        name, command, rest = command.resolve_command(ctx, [*_protected(ctx), *ctx.args])
        chain.append(name)
        ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)
    assert not ctx.args and not _protected(ctx), (args, ctx.args)
    return chain


def test_every_inferwatch_container_parses_with_inferwatch_s_own_cli() -> None:
    options = KubeOptions()
    found = inferwatch_containers(tree(options), options.image)
    assert len(found) > 10
    chains = set()
    for name, container in found:
        assert "command" not in container, f"{name}: the image's entrypoint is inferwatch"
        try:
            chains.add(tuple(_resolve(container["args"])))
        except Exception as exc:  # a click UsageError names the argument
            pytest.fail(f"{name}: {container['name']} {container['args']}: {exc}")
    assert chains == {("collector", "serve"), ("db", "upgrade"), ("exporter", "serve"), ("proxy",)}


def test_a_bad_argument_fails_the_parser() -> None:
    with pytest.raises(Exception, match="no-such-flag"):
        _resolve(["exporter", "serve", "--no-such-flag"])


def test_the_pod_monitors_select_what_the_sidecars_label_and_name() -> None:
    """Each PodMonitor's selector matches the pods the patches and examples make, on a port they name."""
    files = tree()
    pods = []
    for _, doc in documents(files):
        spec_ = pod_spec(doc)
        if spec_ is not None:
            labels = doc["spec"]["template"].get("metadata", {}).get("labels", {})
            ports = {p["name"] for c in spec_["containers"] for p in c.get("ports", [])}
            pods.append((labels, ports))
    monitors = objects(files, "PodMonitor")
    assert len(monitors) == 3
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        selected = [ports for labels, ports in pods if selector.items() <= labels.items()]
        assert selected, monitor["metadata"]["name"]
        assert all(endpoint["port"] in ports for ports in selected), monitor["metadata"]["name"]
        assert endpoint["path"] == topology.METRICS_PATH
        job = endpoint["relabelings"][0]["replacement"]
        assert job == monitor["metadata"]["name"]
    assert {m["metadata"]["name"] for m in monitors} == {
        topology.EXPORTERS_JOB,
        topology.PROXIES_JOB,
        topology.COLLECTOR_JOB,
    }


def test_the_exporter_targets_the_engine_port_in_its_pod() -> None:
    files = tree()
    for engine in V.ENGINES:
        facts = topology.engine_facts(engine)
        patch = yaml.safe_load(files[f"sidecars/{engine}-exporter/patch.yaml"])
        (container,) = patch["spec"]["template"]["spec"]["containers"]
        assert f"--target=http://localhost:{facts.metrics_port}" in " ".join(container["args"])
        assert container["ports"] == [{"name": "metrics", "containerPort": topology.EXPORTER_PORT, "protocol": "TCP"}]
        assert container["livenessProbe"]["httpGet"]["path"] == topology.HEALTH_PATH
        security = container["securityContext"]
        assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
        assert not security["allowPrivilegeEscalation"] and security["capabilities"] == {"drop": ["ALL"]}
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_collector_is_stateless_and_waits_for_its_migrations() -> None:
    (deployment,) = [d for d in objects(tree(), "Deployment") if d["metadata"]["name"] == "inferwatch-collector"]
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"] == topology.migration_args()
    (job,) = objects(tree(), "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == topology.migration_args()
    (collector,) = pod["containers"]
    assert collector["livenessProbe"]["httpGet"]["path"] == topology.HEALTH_PATH
    assert collector["readinessProbe"]["httpGet"]["path"] == topology.READY_PATH
    assert collector["securityContext"]["readOnlyRootFilesystem"]
    mounts = {m["mountPath"] for m in collector["volumeMounts"]}
    assert topology.CONTAINER_DATA_DIR in mounts
    assert all("emptyDir" in v for v in pod["volumes"])
    secrets = {e["valueFrom"]["secretKeyRef"]["key"] for e in collector["env"] if "valueFrom" in e}
    assert secrets == {"database-url", "ingest-token", "read-token"}
    assert not objects(tree(), "Secret"), "the Secret is documented, not generated"


def test_namespace_option() -> None:
    files = tree(KubeOptions(namespace="llm-obs"))
    assert yaml.safe_load(files[KUSTOMIZATION])["namespace"] == "llm-obs"
    (namespace,) = objects(files, "Namespace")
    assert namespace["metadata"]["name"] == "llm-obs"
    (config,) = objects(files, "AlertmanagerConfig")
    assert config["spec"]["receivers"][0]["webhookConfigs"][0]["url"].startswith(
        "http://inferwatch-collector.llm-obs.svc:4318/"
    )
    (collector_monitor,) = [m for m in objects(files, "PodMonitor") if m["metadata"]["name"] == topology.COLLECTOR_JOB]
    assert collector_monitor["spec"]["namespaceSelector"] == {"matchNames": ["llm-obs"]}


def test_engines_option() -> None:
    files = tree(KubeOptions(engines=(V.ENGINE_VLLM, V.ENGINE_TRITON)))
    sidecars = {n.split("/")[1] for n in files if n.startswith("sidecars/")}
    assert sidecars == {"vllm-exporter", "vllm-proxy", "triton-exporter", "triton-proxy"}
    examples = {n for n in files if n.startswith("examples/engines/") and not n.endswith(KUSTOMIZATION)}
    assert examples == {"examples/engines/vllm.yaml", "examples/engines/triton.yaml"}
    with_proxy = yaml.safe_load(files["examples/with-proxy/kustomization.yaml"])
    assert with_proxy["components"] == ["../../sidecars/vllm-proxy", "../../sidecars/triton-proxy"]


def test_prometheus_operator_labels_option() -> None:
    labels = (("prometheus", "main"), ("team", "llm"))
    files = tree(KubeOptions(prometheus_operator_labels=labels))
    kinds = ("PodMonitor", "PrometheusRule", "AlertmanagerConfig")
    operated = [doc for kind in kinds for doc in objects(files, kind)]
    assert len(operated) == 5
    for doc in operated:
        assert dict(labels).items() <= doc["metadata"]["labels"].items()
        assert "release" not in doc["metadata"]["labels"]
    defaults = [doc for kind in kinds for doc in objects(tree(), kind)]
    assert all(doc["metadata"]["labels"]["release"] == "kube-prometheus-stack" for doc in defaults)


def test_image_and_grafana_options() -> None:
    options = replace(
        KubeOptions(), image="registry.example/inferwatch:9.9", grafana_label=("dash", "yes"), grafana_operator=True
    )
    files = tree(options)
    assert len(inferwatch_containers(files, options.image)) == len(
        inferwatch_containers(tree(), topology.default_image())
    )
    maps = [m for m in objects(files, "ConfigMap") if m["metadata"]["name"].startswith("inferwatch-dashboard-")]
    assert maps and all(m["metadata"]["labels"]["dash"] == "yes" for m in maps)
    assert all(m["metadata"]["annotations"]["grafana_folder"] == "inferwatch" for m in maps)
    dashboards = objects(files, "GrafanaDashboard")
    assert {d["spec"]["configMapRef"]["name"] for d in dashboards} == {m["metadata"]["name"] for m in maps}
    assert not objects(tree(), "GrafanaDashboard")


def test_the_dashboard_maps_hold_generate_dashboards_json() -> None:
    from inferwatch.dashboards.generate import generate as generate_dashboards

    boards = {n: c for n, c in generate_dashboards(spec(), V.Vocabulary()).items() if n.endswith(".json")}
    maps = [m for m in objects(tree(), "ConfigMap") if m["metadata"]["name"].startswith("inferwatch-dashboard-")]
    held = {key: value for m in maps for key, value in m["data"].items()}
    assert held == boards
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)


def test_the_cli_writes_the_tree_and_refuses_bad_options(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    args = ["generate", "kubernetes", "--out", str(out), "--namespace", "obs", "--engine", "tgi"]
    args += ["--prometheus-operator-labels", "release=prom", "--image", "example/inferwatch:1", "--grafana-operator"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    expected = tree(
        KubeOptions(
            namespace="obs",
            engines=(V.ENGINE_TGI,),
            prometheus_operator_labels=(("release", "prom"),),
            image="example/inferwatch:1",
            grafana_operator=True,
        )
    )
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == expected
    bad = CliRunner().invoke(app, ["generate", "kubernetes", "--out", str(out), "--engine", "lmdeploy"])
    assert bad.exit_code != 0 and "lmdeploy" in bad.output
    bad = CliRunner().invoke(app, ["generate", "kubernetes", "--out", str(out), "--prometheus-operator-labels", "x"])
    assert bad.exit_code != 0 and "KEY=VALUE" in bad.output


def test_kubectl_kustomize_builds_the_tree_and_the_examples() -> None:
    kubectl = require_tool("kubectl")
    for directory in (TREE, TREE / "examples" / "engines", TREE / "examples" / "with-proxy"):
        result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True)
        assert result.returncode == 0, (directory, result.stderr)
        # kustomize writes YAML 1.2 (a bare `=` is a string there, PyYAML's 1.1 reads a tag): count, not parse
        assert result.stdout.count("\nkind: ") + result.stdout.startswith("kind: ") > 0, directory
    with_proxy = subprocess.run(
        [kubectl, "kustomize", str(TREE / "examples" / "with-proxy")], capture_output=True, text=True, check=True
    )
    for doc in yaml.safe_load_all(with_proxy.stdout):
        if doc["kind"] == "Deployment":
            names = [c["name"] for c in doc["spec"]["template"]["spec"]["containers"]]
            assert "inferwatch-exporter" in names and "inferwatch-proxy" in names, names
        if doc["kind"] == "Service":
            assert doc["spec"]["ports"][0]["targetPort"] == "proxy"
