"""Every port and probe path the Kubernetes manifests name exists in the running component.

The collector (after its init container's ``db upgrade``), a vLLM exporter sidecar and a proxy sidecar are
started with the generated containers' own arguments and environment: addresses on every interface and
``localhost`` become 127.0.0.1, each container port a free port, the Secret's keys test values (the
database a SQLite file). Then every liveness and readiness probe and every PodMonitor endpoint is asked
on the port it names, and the collector's gRPC port is connected to.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inferwatch.core import topology
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import load
from inferwatch.kubernetes.kube_objects import KubeOptions
from inferwatch.kubernetes.manifests import generate
from tests.conftest import ROOT, free_port
from tests.support.stack import INFERWATCH, Processes, simulator_cmd

ENGINE = V.ENGINE_VLLM
ADDRESS = re.compile(r"(?:0\.0\.0\.0|localhost):(\d+)")
VARIABLE = re.compile(r"\$\(([A-Z_]+)\)")


def _tree() -> dict[str, bytes]:
    spec = load(ROOT / "inferwatch" / "alerts" / "slos.yaml", V.Vocabulary())
    return generate(spec, V.Vocabulary(), KubeOptions())


def _docs(files: dict[str, bytes], name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(files[name]) if d]


def _containers(files: dict[str, bytes]) -> dict[str, dict[str, Any]]:
    """The collector's init container and container, and the exporter and proxy patches' sidecars, by name."""
    (deployment,) = _docs(files, "collector/deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    out = {c["name"]: c for c in [*pod["initContainers"], *pod["containers"]]}
    for kind in ("exporter", "proxy"):
        (patch,) = _docs(files, f"sidecars/{ENGINE}-{kind}/patch.yaml")
        out.update({c["name"]: c for c in patch["spec"]["template"]["spec"]["containers"]})
    return out


def _localize(text: str, ports: dict[int, int]) -> str:
    return ADDRESS.sub(lambda m: f"127.0.0.1:{ports[int(m.group(1))]}", text)


def _env(container: dict[str, Any], secrets: dict[str, str], data_dir: Path) -> dict[str, str]:
    """The container's environment as the kubelet builds it: Secret keys resolved, ``$(VAR)`` expanded."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "valueFrom" in item:
            value = secrets[item["valueFrom"]["secretKeyRef"]["key"]]
        else:
            value = VARIABLE.sub(lambda m: env[m.group(1)], item["value"])
        env[item["name"]] = value
    if topology.DATA_DIR_ENV in env:
        env[topology.DATA_DIR_ENV] = str(data_dir)
    return env


def _named_port(container: dict[str, Any], name: str | int, ports: dict[int, int]) -> int:
    numbers = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    return ports[numbers[name] if isinstance(name, str) else name]


def _get_until_ok(url: str, timeout: float = 30.0, headers: dict[str, str] | None = None) -> httpx.Response:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url, timeout=5, headers=headers)
            if response.status_code == 200:
                return response
            last = f"{response.status_code} {response.text[:300]}"
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer 200 within {timeout:g} s: {last}")


def _probes(container: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        if kind in container:
            yield kind, container[kind]["httpGet"]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[dict[str, Any], dict[int, int], Processes]]:
    files = _tree()
    containers = _containers(files)
    numbers = {int(n) for c in containers.values() for a in c["args"] for n in ADDRESS.findall(a)}
    numbers |= {p["containerPort"] for c in containers.values() for p in c.get("ports", [])}
    ports = {number: free_port() for number in sorted(numbers)}
    secrets = {
        "database-url": f"sqlite:///{(tmp_path / 'inferwatch.db').as_posix()}",
        "ingest-token": "ingest-secret",
        "read-token": "read-secret",
    }
    procs = Processes(tmp_path / "logs")
    try:
        init = containers["db-upgrade"]
        migrated = subprocess.run(
            [*INFERWATCH, *init["args"]],
            env={**_base_env(), **_env(init, secrets, tmp_path / "data-init")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert migrated.returncode == 0, migrated.stderr
        engine_port = topology.engine_facts(ENGINE).serving_port
        procs.spawn("engine", simulator_cmd(ENGINE, ports[engine_port], model="k8s-probes"))
        procs.wait_http("engine", f"http://127.0.0.1:{ports[engine_port]}/health")
        for name in ("collector", "inferwatch-exporter", "inferwatch-proxy"):
            container = containers[name]
            args = [_localize(a, ports) for a in container["args"]]
            procs.spawn(name, [*INFERWATCH, *args], env=_env(container, secrets, tmp_path / "data"))
        yield containers, ports, procs
    finally:
        procs.close()


def _base_env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_every_probe_and_scraped_port_answers(running: tuple[dict[str, Any], dict[int, int], Processes]) -> None:
    containers, ports, procs = running
    asked = []
    for name in ("collector", "inferwatch-exporter", "inferwatch-proxy"):
        container = containers[name]
        for kind, get in _probes(container):
            url = f"http://127.0.0.1:{_named_port(container, get['port'], ports)}{get['path']}"
            try:
                _get_until_ok(url)
            except AssertionError as exc:
                raise AssertionError(f"{name} {kind}: {exc}\n{procs.log(name)}") from None
            asked.append((name, kind, get["path"]))
    assert {(n, k) for n, k, _ in asked} == {
        (n, k)
        for n in ("collector", "inferwatch-exporter", "inferwatch-proxy")
        for k in ("livenessProbe", "readinessProbe")
    }
    files = _tree()
    owners = {"inferwatch-exporters": "inferwatch-exporter", "inferwatch-proxies": "inferwatch-proxy"}
    for monitor in _docs(files, "monitoring/podmonitors.yaml"):
        container = containers[owners.get(monitor["metadata"]["name"], "collector")]
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            url = f"http://127.0.0.1:{_named_port(container, endpoint['port'], ports)}{endpoint['path']}"
            body = _get_until_ok(url).text
            assert "# TYPE " in body, (monitor["metadata"]["name"], body[:300])
    if any(p.get("name") == "grpc" for p in containers["collector"]["ports"]):
        with socket.create_connection(("127.0.0.1", _named_port(containers["collector"], "grpc", ports)), timeout=5):
            pass


def test_the_proxy_passes_the_engine_api_through(
    running: tuple[dict[str, Any], dict[int, int], Processes],
) -> None:
    """Clients move to the proxy's port ``proxy``: the engine's own routes answer there."""
    containers, ports, _ = running
    proxy = containers["inferwatch-proxy"]
    port = _named_port(proxy, "proxy", ports)
    _get_until_ok(f"http://127.0.0.1:{port}{topology.engine_facts(ENGINE).health_path}")


def test_the_collector_takes_the_secret_s_tokens(running: tuple[dict[str, Any], dict[int, int], Processes]) -> None:
    """The tokens reach the collector as the JSON lists the Deployment's environment builds from the Secret."""
    containers, ports, _ = running
    base = f"http://127.0.0.1:{_named_port(containers['collector'], 'http', ports)}"
    _get_until_ok(base + topology.READY_PATH)
    assert httpx.get(base + "/api/v1/requests", timeout=5).status_code == 401
    ok = httpx.get(base + "/api/v1/requests", timeout=5, headers={"Authorization": "Bearer read-secret"})
    assert ok.status_code == 200, ok.text
