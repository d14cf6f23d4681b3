"""Shared test fixtures.

Tests that need a real component (promtool) skip when it is missing on a developer's machine but
fail when the ``CI`` environment variable is set.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from exporters.engines import EngineRegistry, builtin_registry
from inferwatch import vocabulary as V

ROOT = Path(__file__).resolve().parent.parent
ENGINE_FIXTURES = ROOT / "tests" / "fixtures" / "engines"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", help="rewrite golden files instead of comparing")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens")) or os.environ.get("INFERWATCH_UPDATE_GOLDENS") == "1"


@pytest.fixture(scope="session")
def registry() -> EngineRegistry:
    return builtin_registry()


@pytest.fixture(scope="session")
def vocab() -> V.Vocabulary:
    return V.Vocabulary()


def require_tool(name: str) -> str:
    """Path of a real tool; skip without it, but fail under CI."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found (Debian package 'prometheus'; `make test` installs it)"
        if os.environ.get("CI"):
            pytest.fail(message + " and CI is set: this test must not be skipped")
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


def fixture_dirs() -> list[Path]:
    return sorted(p.parent for p in ENGINE_FIXTURES.glob("*/*/fixture.yaml"))
