"""The whole stack's files: docker-compose.yml, the Dockerfile, and every generated file they mount.

Each generated file is committed once: the stack's own in ``deploy/``, the rules and runbooks in
``inferwatch/alerts/generated/``, the dashboards and Grafana provisioning in
``inferwatch/dashboards/generated/``; docker-compose.yml mounts each where the containers read it.
There is no Docker engine on the test machines: the compose file is validated by docker-compose
itself (`docker-compose config`), the files the containers see are assembled from its bind mounts
(:func:`container_view`), and each is checked by its own tool (promtool, amtool).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path, PurePosixPath

import pytest
import yaml
from typer.testing import CliRunner

from inferwatch.cli import app
from inferwatch.core import topology
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLOFile, load
from inferwatch.stack import COMPOSE_LAYOUT, Exporter, Layout, generate, own_files
from tests.conftest import ROOT, require_tool

DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = ROOT / "docker-compose.yml"
REAL = ROOT / "docker-compose.real-engines.yml"
GENERATED_TREES = (
    DEPLOY,
    ROOT / "inferwatch" / "alerts" / "generated",
    ROOT / "inferwatch" / "dashboards" / "generated",
)
"""Every committed tree of generated files: ``generate stack``'s, ``generate alerts``', ``generate dashboards``'."""
CONTAINER_DIRS = {
    "prometheus": "/etc/prometheus",
    "alertmanager": "/etc/alertmanager",
    "grafana/provisioning": "/etc/grafana/provisioning",
    "grafana/dashboards": "/var/lib/grafana/dashboards/inferwatch",
    "collector": "/etc/inferwatch",
}
"""Each directory of the generated stack (:func:`inferwatch.stack.generate`) → where its container reads it."""


def spec() -> SLOFile:
    return load(ROOT / "inferwatch" / "alerts" / "slos.yaml", V.Vocabulary())


def generated() -> dict[str, bytes]:
    """The whole stack, its own files and those it shares with the alert and dashboard generators."""
    return generate(spec(), V.Vocabulary(), COMPOSE_LAYOUT)


def container_path(name: str) -> str:
    """Where a container reads the stack's file ``name`` (``prometheus/rules.yml`` → ``/etc/prometheus/rules.yml``)."""
    directory = max((d for d in CONTAINER_DIRS if name.startswith(d + "/")), key=len)
    return CONTAINER_DIRS[directory] + name.removeprefix(directory)


def bind_mounts(compose_file: Path) -> list[tuple[str, str, str]]:
    """``(service, host path as written, container path)`` of every bind mount (named volumes left out)."""
    compose = yaml.safe_load(compose_file.read_text())
    mounts = []
    for name, service in (compose.get("services") or {}).items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                mounts.append((name, source, target))
    return mounts


def container_view(root: Path) -> Path:
    """What the containers of docker-compose.yml see of the repository: every bind mount copied under
    ``root`` at its container path, shallower mounts first, each hiding what was there."""
    for _, source, target in sorted(bind_mounts(COMPOSE), key=lambda m: len(PurePosixPath(m[2]).parts)):
        host, dest = ROOT / source, root / target.lstrip("/")
        if dest.is_dir():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if host.is_dir():
            shutil.copytree(host, dest)
        else:
            shutil.copyfile(host, dest)
    return root


def test_deploy_is_the_generated_stack_byte_for_byte() -> None:
    """deploy/ holds exactly the stack's own files, current (and deploy/kubernetes/, `generate kubernetes`')."""
    files = own_files(spec(), V.Vocabulary(), COMPOSE_LAYOUT)
    on_disk = {
        p.relative_to(DEPLOY).as_posix()
        for p in DEPLOY.rglob("*")
        if p.is_file() and not p.is_relative_to(KUBERNETES)  # `generate kubernetes`' tree (tests/test_kubernetes.py)
    }
    assert on_disk == set(files), "run `make goldens` (inferwatch generate stack --out deploy)"
    for name, content in files.items():
        assert (DEPLOY / name).read_bytes() == content, f"{name} is stale: run `make goldens`"
    result = CliRunner().invoke(app, ["generate", "stack", "--out", str(DEPLOY), "--check"])
    assert result.exit_code == 0, result.output


def test_each_generated_file_is_committed_once() -> None:
    """No two files of the generated trees are byte-identical: an artefact lives in one of them, and
    docker-compose.yml mounts it from there."""
    by_digest: dict[str, list[str]] = defaultdict(list)
    for tree in GENERATED_TREES:
        for path in sorted(tree.rglob("*")):
            if path.is_file():
                by_digest[hashlib.sha256(path.read_bytes()).hexdigest()].append(path.relative_to(ROOT).as_posix())
    copies = [paths for paths in by_digest.values() if len(paths) > 1]
    assert not copies, f"the same file committed twice (keep one, mount it from there): {copies}"


def test_the_containers_see_the_whole_generated_stack(tmp_path: Path) -> None:
    """Every file of the stack is at its container path with the generator's bytes, and nothing else is
    there but the provisioning files beside the dashboards (the provider loads only ``*.json``)."""
    view = container_view(tmp_path)
    expected = {container_path(name): content for name, content in generated().items()}
    for where, content in expected.items():
        seen = view / where.lstrip("/")
        assert seen.is_file(), f"{where} is not mounted: see docker-compose.yml"
        assert seen.read_bytes() == content, f"{where} is stale: run `make goldens`"
    dashboards = CONTAINER_DIRS["grafana/dashboards"] + "/"
    for path in view.rglob("*"):
        where = "/" + path.relative_to(view).as_posix()
        if path.is_file() and where not in expected:
            assert where.startswith(dashboards) and path.suffix != ".json", f"{where} is mounted but not generated"


def test_every_mounted_path_exists_in_the_repository() -> None:
    """Each host path the compose files mount exists, under its real name (not through the root links to
    inferwatch/, which a checkout with core.symlinks=false turns into text files), in a generated tree."""
    mounts = bind_mounts(COMPOSE) + bind_mounts(REAL)
    assert mounts
    for name, source, _ in mounts:
        path = ROOT / source
        assert path.exists(), f"{name} mounts {source}, which does not exist"
        assert path.resolve() == Path(os.path.normpath(path)), f"{name} mounts {source} through a symlink"
        assert any(path.resolve().is_relative_to(tree) for tree in GENERATED_TREES), (
            f"{name} mounts {source}, which inferwatch does not generate"
        )


def test_the_services_read_their_config_where_it_is_mounted(tmp_path: Path) -> None:
    view = container_view(tmp_path)
    compose = yaml.safe_load(COMPOSE.read_text())
    for service, flag in [
        ("prometheus", "--config.file="),
        ("alertmanager", "--config.file="),
        ("collector", "--notify-config="),
    ]:
        (value,) = [a.removeprefix(flag) for a in compose["services"][service]["command"] if a.startswith(flag)]
        assert (view / value.lstrip("/")).is_file(), f"{service} reads {value}, which is not mounted"
    provider = yaml.safe_load((view / "etc/grafana/provisioning/dashboards/inferwatch.yaml").read_text())
    assert [p["options"]["path"] for p in provider["providers"]] == [CONTAINER_DIRS["grafana/dashboards"]]


def test_generated_files_say_so() -> None:
    for name, content in generated().items():
        if name.endswith((".yml", ".yaml")):
            assert content.startswith(b"# Generated by"), name


def test_prometheus_config_and_rules_pass_promtool(tmp_path: Path) -> None:
    """As Prometheus' container sees them: the config from deploy/, the rules beside it."""
    promtool = require_tool("promtool")
    config = container_view(tmp_path) / "etc" / "prometheus" / "prometheus.yml"
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rule files found" in result.stdout


def test_alertmanager_config_passes_amtool_and_delivers_to_the_collector() -> None:
    amtool = require_tool("amtool")
    path = DEPLOY / "alertmanager" / "alertmanager.yml"
    result = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(path.read_text())
    urls = {c["url"] for r in config["receivers"] for c in r["webhook_configs"]}
    assert all(u.startswith("http://collector:4318/api/v1/alerts/webhook") for u in urls), urls


def test_exporter_targets_are_file_sd_groups() -> None:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "targets" / "exporters.yml").read_text())
    assert [g["targets"] for g in groups] == [[f"exporter-{e}:9400"] for e in V.ENGINES]


def test_layout_options() -> None:
    spec = load(ROOT / "inferwatch" / "alerts" / "slos.yaml", V.Vocabulary())
    layout = Layout(
        exporters=(Exporter("10.0.0.5:9400", {"replica": "a"}),),
        remote_write="http://victoria:8428/api/v1/write",
        webhook_credentials_file="/etc/alertmanager/token",
    )
    files = generate(spec, V.Vocabulary(), layout)
    prometheus = yaml.safe_load(files["prometheus/prometheus.yml"])
    assert prometheus["remote_write"] == [{"url": "http://victoria:8428/api/v1/write"}]
    am = yaml.safe_load(files["alertmanager/alertmanager.yml"])
    auth = am["receivers"][0]["webhook_configs"][0]["http_config"]["authorization"]
    assert auth["credentials_file"] == "/etc/alertmanager/token"
    assert yaml.safe_load(files["prometheus/targets/exporters.yml"]) == [
        {"targets": ["10.0.0.5:9400"], "labels": {"replica": "a"}}
    ]


def _compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    binary = require_tool("docker-compose")
    return subprocess.run([binary, *args], cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_docker_compose_config_validates() -> None:
    result = _compose("config", "-q")
    assert result.returncode == 0, result.stderr
    services = set(_compose("config", "--services").stdout.split())
    expected = {"postgres", "collector", "prometheus", "alertmanager", "grafana"}
    expected |= {f"sim-{e}" for e in V.ENGINES} | {f"exporter-{e}" for e in V.ENGINES}
    assert services == expected


def test_real_engines_override_validates_and_names_what_is_missing() -> None:
    targets = {
        "INFERWATCH_VLLM_URL": "http://10.0.0.5:8000",
        "INFERWATCH_TGI_URL": "http://10.0.0.6:3000",
        "INFERWATCH_TGI_MAX_BATCH_TOTAL_TOKENS": "16384",
        "INFERWATCH_TRTLLM_URL": "http://10.0.0.7:8000",
        "INFERWATCH_TRITON_URL": "http://10.0.0.8:8002/metrics",
        "INFERWATCH_SGLANG_URL": "http://10.0.0.9:30000",
        "INFERWATCH_LLAMACPP_URL": "http://10.0.0.10:8080",
        "COMPOSE_PROFILES": "",
    }
    ok = _compose("-f", str(COMPOSE), "-f", str(REAL), "config", env=targets)
    assert ok.returncode == 0, ok.stderr
    for url in ("http://10.0.0.5:8000", "http://10.0.0.9:30000", "http://10.0.0.10:8080"):
        assert f"--target={url}" in ok.stdout
    missing = _compose("-f", str(COMPOSE), "-f", str(REAL), "config", "-q", env={"COMPOSE_PROFILES": ""})
    assert missing.returncode != 0 and "INFERWATCH_" in missing.stderr


def test_dockerfile_installs_the_wheel_as_a_non_root_user_with_a_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "pip wheel" in text and "pip install" in text
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert "HEALTHCHECK" in text and 'ENTRYPOINT ["inferwatch"]' in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


@pytest.mark.parametrize("service", [f"exporter-{e}" for e in V.ENGINES])
def test_exporters_point_at_the_simulators_by_default(service: str) -> None:
    compose = yaml.safe_load(_compose("config").stdout)
    command = " ".join(compose["services"][service]["command"])
    engine = service.removeprefix("exporter-")
    assert f"--target=http://sim-{engine}:8000" in command


_DEFAULTED = re.compile(r"\$\{[A-Z_]+:[-?]([^}]*)\}")


def _defaults(value: str) -> str:
    """A compose value with each ``${VAR:-default}`` replaced by its default."""
    return _DEFAULTED.sub(lambda m: m.group(1), value)


def test_the_compose_file_starts_the_collector_and_exporters_as_topology_says() -> None:
    """docker-compose.yml is hand-written; its collector and exporter commands, ports and health URLs are
    what :mod:`inferwatch.core.topology` builds (which the Kubernetes manifests use too), so neither drifts."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    collector = services["collector"]
    flags = topology.CollectorFlags(
        database_url="postgresql+psycopg://inferwatch:inferwatch@postgres:5432/inferwatch",
        prometheus_url=f"http://{COMPOSE_LAYOUT.prometheus}",
        notify_config="/etc/inferwatch/notify.yaml",
        grafana_url="http://localhost:3000",
        public_url=topology.url("localhost", topology.COLLECTOR_HTTP_PORT),
        insecure=True,
    )
    assert [_defaults(a) for a in collector["command"]] == topology.collector_args(topology.ALL_INTERFACES, flags)
    http, grpc = topology.COLLECTOR_HTTP_PORT, topology.COLLECTOR_GRPC_PORT
    assert collector["ports"] == [f"127.0.0.1:{http}:{http}", f"127.0.0.1:{grpc}:{grpc}"]
    ready = topology.url(topology.LOOPBACK, http, topology.READY_PATH)
    assert collector["environment"]["INFERWATCH_HEALTH_URL"] == ready
    assert COMPOSE_LAYOUT.collector == topology.address("collector", http)
    extras: dict[str, dict[str, object]] = {
        V.ENGINE_TGI: {"options": (("max_batch_total_tokens", "16384"),)},
        V.ENGINE_TRITON: {"model": "ensemble"},
    }
    for engine in V.ENGINES:
        service = services[f"exporter-{engine}"]
        facts = topology.engine_facts(engine)
        target = f"http://sim-{engine}:8000" + (facts.metrics_path if facts.explicit_path else "")
        expected = topology.exporter_args(engine, target, **extras.get(engine, {}))  # type: ignore[arg-type]
        assert [_defaults(a) for a in service["command"]] == expected, engine
        health = topology.url(topology.LOOPBACK, topology.EXPORTER_PORT, topology.HEALTH_PATH)
        assert service["environment"]["INFERWATCH_HEALTH_URL"] == health
    exporters = [e.address for e in COMPOSE_LAYOUT.exporters]
    assert exporters == [topology.address(f"exporter-{e}", topology.EXPORTER_PORT) for e in V.ENGINES]
