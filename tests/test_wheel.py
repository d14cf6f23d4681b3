"""The built wheel, installed into a fresh virtualenv outside the checkout, works as a new user runs it.

One session-scoped fixture builds the wheel from this checkout (pip, isolated build); each install
fixture creates a virtualenv in a temporary directory, installs the wheel with its extras (their
dependencies come from the package index) and runs every command from an empty working directory
under a throw-away ``$HOME``. The full install (``[all]``) runs every command; ``[exporter]`` alone and
``[proxy]`` alone, the light sidecars, must hold none of the heavy libraries and still run their part
against a simulated engine (started from this checkout's environment). Without a reachable package
index the tests skip on a laptop and fail under ``CI``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from inferwatch.core import vocabulary as V
from tests.conftest import ENGINE_FIXTURES, ROOT, free_port
from tests.helpers import has, value
from tests.support.stack import Processes, simulator_cmd
from tests.support.wheelenv import WheelError, build_wheel, clean_env, install

HEAVY = ("sqlalchemy", "alembic", "numpy", "psycopg", "fastapi", "starlette", "uvicorn", "grpc", "grafanalib")
"""Libraries of the collector, the simulators and the generators: none may come with a sidecar's extra."""
EXPORTER_MAX_MB = 60.0
PROXY_MAX_MB = 110.0
"""Bounds of the sidecars' site-packages (measured 35 and 69 MB, the full install 213: docs/deploy.md)."""
MODEL = "sim-model"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    cwd: Path
    """an empty directory, outside the checkout, that every command runs in."""
    home: Path
    env: dict[str, str]

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "inferwatch"), *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.bin / "inferwatch"), *args],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def _unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message + " and CI is set: this test must not be skipped")
    pytest.skip(message)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built once for every install of the session."""
    dist = tmp_path_factory.mktemp("dist")
    assert ROOT not in dist.parents, "the temporary directory must be outside the checkout"
    try:
        return build_wheel(dist)
    except WheelError as exc:
        _unavailable(str(exc))
        raise


def _install(wheel: Path, base: Path, extras: str) -> Installed:
    """A fresh virtualenv under ``base`` holding ``wheel`` with ``extras`` (``[all]``, ``[exporter]``, ...)."""
    assert ROOT not in base.parents, "the temporary directory must be outside the checkout"
    env_dir = base / "venv"
    cwd, home = base / "work", base / "home"
    cwd.mkdir()
    home.mkdir()
    env = clean_env(HOME=str(home), COLUMNS="80")
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    try:
        install(wheel, extras, env_dir, env)
    except WheelError as exc:
        _unavailable(str(exc))
    return Installed(wheel, env_dir, cwd, home, env)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The full install: every part, as the image and ``make install`` have it."""
    return _install(wheel, tmp_path_factory.mktemp("wheel"), "[all]")


@pytest.fixture(scope="module")
def exporter_only(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return _install(wheel, tmp_path_factory.mktemp("exporter-extra"), "[exporter]")


@pytest.fixture(scope="module")
def proxy_only(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return _install(wheel, tmp_path_factory.mktemp("proxy-extra"), "[proxy]")


@pytest.fixture
def clean_cwd(installed: Installed) -> Iterator[Installed]:
    """The test's commands must leave the working directory as empty as they found it."""
    yield installed
    assert sorted(p.name for p in installed.cwd.iterdir()) == [], "a command wrote into the current directory"


def test_one_top_level_package(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        tops = {name.split("/", 1)[0] for name in whl.namelist()}
        names = whl.namelist()
    assert {t for t in tops if not t.endswith(".dist-info")} == {"inferwatch"}, tops
    for data in ("inferwatch/migrations/env.py", "inferwatch/migrations/script.py.mako", "inferwatch/alerts/slos.yaml"):
        assert data in names, f"{data} is not in the wheel"
    assert any(n.startswith("inferwatch/migrations/versions/") for n in names)
    assert not any("/tests/" in n or "/generated/" in n for n in names), "test or generated files shipped"
    # the installed package is the wheel's, not this checkout's
    probe = subprocess.run(
        [
            str(installed.bin / "python"),
            "-c",
            "import inferwatch.collector.api.app, inferwatch; print(inferwatch.__file__)",
        ],
        cwd=installed.cwd,
        env=installed.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(probe.stdout.strip()).is_relative_to(installed.venv), probe.stdout


def test_help(clean_cwd: Installed) -> None:
    result = clean_cwd.run("--help")
    assert result.returncode == 0, result.stderr
    for command in ("exporter", "collector", "generate", "simulate", "demo"):
        assert command in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_db_upgrade_and_collector_serve(clean_cwd: Installed) -> None:
    data_dir = clean_cwd.home / ".local" / "share" / "inferwatch" / "collector"
    upgrade = clean_cwd.run("db", "upgrade")
    assert upgrade.returncode == 0, upgrade.stderr
    assert "database at revision" in upgrade.stderr
    assert (data_dir / "inferwatch.db").is_file(), "the default database belongs in the documented data directory"
    http, grpc = free_port(), free_port()
    proc = clean_cwd.popen("collector", "serve", "--listen", f"127.0.0.1:{http}", "--grpc-listen", f"127.0.0.1:{grpc}")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                ready = httpx.get(f"http://127.0.0.1:{http}/readyz", timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the collector did not become ready"
            time.sleep(0.2)
        assert ready.json()["database"] == "ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_generate_alerts_with_the_packaged_and_a_given_slo_file(clean_cwd: Installed, tmp_path: Path) -> None:
    out = tmp_path / "alerts"
    result = clean_cwd.run("generate", "alerts", "--out", str(out))
    assert result.returncode == 0, result.stderr
    for name in ("rules.yml", "alertmanager.yml", "runbooks.md"):
        # the packaged default SLO file is the repository's alerts/slos.yaml: same bytes as the goldens
        assert (out / name).read_text() == (ROOT / "inferwatch" / "alerts" / "generated" / name).read_text(), name
    slo_file = tmp_path / "mine.yaml"
    slo_file.write_text(
        yaml.safe_dump(
            {
                "slos": [
                    {
                        "name": "chat-ttft",
                        "objective": 99.5,
                        "indicator": {"latency": {"metric": V.TIME_TO_FIRST_TOKEN.key, "threshold_seconds": 1.0}},
                    }
                ]
            }
        )
    )
    mine = tmp_path / "mine"
    result = clean_cwd.run("generate", "alerts", "--slo", str(slo_file), "--out", str(mine))
    assert result.returncode == 0, result.stderr
    assert "chat-ttft" in (mine / "rules.yml").read_text()


def test_generate_dashboards_writes_only_under_out(clean_cwd: Installed, tmp_path: Path) -> None:
    out = tmp_path / "dashboards"
    result = clean_cwd.run("generate", "dashboards", "--out", str(out))
    assert result.returncode == 0, result.stderr
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    expected = sorted(
        p.relative_to(ROOT / "inferwatch" / "dashboards" / "generated").as_posix()
        for p in (ROOT / "inferwatch" / "dashboards" / "generated").rglob("*")
        if p.is_file()
    )
    assert written == expected
    assert not list(tmp_path.glob("*.png")) and not (clean_cwd.cwd / "docs").exists()


def test_generate_kubernetes_from_the_wheel_is_the_committed_tree(clean_cwd: Installed, tmp_path: Path) -> None:
    """Outside the checkout, with the packaged SLO file: the same tree as deploy/kubernetes/, byte for byte."""
    out = tmp_path / "kubernetes"
    result = clean_cwd.run("generate", "kubernetes", "--out", str(out))
    assert result.returncode == 0, result.stderr
    golden = ROOT / "deploy" / "kubernetes"
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    expected = {p.relative_to(golden).as_posix(): p.read_bytes() for p in golden.rglob("*") if p.is_file()}
    assert sorted(written) == sorted(expected)
    assert [name for name in written if written[name] != expected[name]] == []
    check = clean_cwd.run("generate", "kubernetes", "--out", str(out), "--check")
    assert check.returncode == 0, check.stdout + check.stderr


def test_exporter_translate(clean_cwd: Installed) -> None:
    capture = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-final.txt"
    result = clean_cwd.run("exporter", "translate", str(capture))
    assert result.returncode == 0, result.stderr
    assert f"{V.PROMPT_TOKENS.name}{{" in result.stdout
    assert f"{V.EXPORTER_UP.name}{{" in result.stdout


def test_simulate_answers_metrics(clean_cwd: Installed) -> None:
    port = free_port()
    proc = clean_cwd.popen("simulate", "--engine", V.ENGINE_VLLM, "--port", str(port), "--speed", "5")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                if metrics.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the simulator did not start"
            time.sleep(0.2)
        assert metrics.text.count("# TYPE ") > 10
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_demo_runs_from_the_wheel(clean_cwd: Installed) -> None:
    result = clean_cwd.run("demo", "--duration", "6", timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "stopped" in result.stdout


# -- the light sidecars: [exporter] alone, [proxy] alone ---------------------------------------------------------
def _importable(inst: Installed, modules: tuple[str, ...]) -> set[str]:
    """Which of ``modules`` the install's own Python finds."""
    probe = subprocess.run(
        [
            str(inst.bin / "python"),
            "-c",
            "import importlib.util, sys; print(*[m for m in sys.argv[1:] if importlib.util.find_spec(m)])",
            *modules,
        ],
        cwd=inst.cwd,
        env=inst.env,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(probe.stdout.split())


def _site_packages_mb(inst: Installed) -> float:
    (site,) = (inst.venv / "lib").glob("python*/site-packages")
    return sum(p.stat().st_size for p in site.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6


def _simulated_vllm(procs: Processes) -> str:
    """A simulated vLLM under load, run by this checkout's environment (not the install's)."""
    port = free_port()
    procs.spawn("sim", simulator_cmd(V.ENGINE_VLLM, port, model=MODEL, speed=5.0))
    url = f"http://127.0.0.1:{port}"
    procs.wait_http("sim", url + "/metrics")
    return url


def _until_ok(proc: subprocess.Popen[str], url: str, what: str) -> httpx.Response:
    deadline = time.monotonic() + 60
    while True:
        try:
            answer = httpx.get(url, timeout=5)
            if answer.status_code == 200:
                return answer
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{what} did not answer at {url}"
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == 0, err
    return err


def test_exporter_extra_is_light(exporter_only: Installed) -> None:
    assert _importable(exporter_only, (*HEAVY, "aiohttp", "opentelemetry")) == set()
    needed = ("httpx", "prometheus_client", "typer")
    assert _importable(exporter_only, needed) == set(needed)
    size = _site_packages_mb(exporter_only)
    assert size < EXPORTER_MAX_MB, f"inferwatch[exporter] takes {size:.1f} MB of site-packages"


def test_proxy_extra_is_light(proxy_only: Installed) -> None:
    assert _importable(proxy_only, (*HEAVY, "httpx")) == set()
    needed = ("aiohttp", "orjson", "uvloop", "opentelemetry.sdk")
    assert _importable(proxy_only, needed) == set(needed)
    size = _site_packages_mb(proxy_only)
    assert size < PROXY_MAX_MB, f"inferwatch[proxy] takes {size:.1f} MB of site-packages"


def test_exporter_extra_serves_a_simulated_vllm(exporter_only: Installed, procs: Processes) -> None:
    engine = _simulated_vllm(procs)
    port = free_port()
    proc = exporter_only.popen(
        "exporter", "serve", "--target", engine, "--engine", V.ENGINE_VLLM, "--listen", f"127.0.0.1:{port}"
    )
    try:
        metrics = _until_ok(proc, f"http://127.0.0.1:{port}/metrics", "the exporter")
        assert value(metrics.text, V.EXPORTER_UP.name) == 1, metrics.text[-2000:]
        assert has(metrics.text, V.KV_CACHE_USAGE.name, engine=V.ENGINE_VLLM, model=MODEL)
    finally:
        _stop(proc)


def test_proxy_extra_proxies_a_simulated_vllm(proxy_only: Installed, procs: Processes) -> None:
    engine = _simulated_vllm(procs)
    port, mport = free_port(), free_port()
    proc = proxy_only.popen(
        "proxy", "--upstream", engine, "--engine", V.ENGINE_VLLM,
        "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{mport}",
    )  # fmt: skip
    try:
        _until_ok(proc, f"http://127.0.0.1:{mport}/healthz", "the proxy")
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": MODEL, "prompt": "hi", "max_tokens": 3},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 3
        metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=5).text
        assert value(metrics, V.CLIENT_REQUESTS.name, engine=V.ENGINE_VLLM, model=MODEL) == 1
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    ("only", "command", "extra"),
    [
        ("exporter", ("collector", "serve"), "collector"),
        ("exporter", ("proxy", "--upstream", "http://127.0.0.1:9"), "proxy"),
        ("exporter", ("simulate", "--engine", V.ENGINE_VLLM), "sim"),
        ("exporter", ("generate", "dashboards", "--out", "unused"), "generate"),
        ("proxy", ("exporter", "serve", "--target", "http://127.0.0.1:9"), "exporter"),
        ("proxy", ("db", "upgrade"), "collector"),
        ("proxy", ("demo", "--duration", "1"), "all"),
    ],
)
def test_a_command_without_its_extra_names_it_in_one_line(
    only: str, command: tuple[str, ...], extra: str, request: pytest.FixtureRequest
) -> None:
    inst: Installed = request.getfixturevalue(f"{only}_only")
    result = inst.run(*command)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"pip install 'inferwatch[{extra}]'" in result.stderr
    assert not list(inst.cwd.iterdir()), "a failed command wrote into the current directory"
