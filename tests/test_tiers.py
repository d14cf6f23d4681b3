"""The test tiers (tests/tiers.py): every test file has a component, and the integration rule holds."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from tests import tiers

TESTS = Path(__file__).resolve().parent


def test_every_test_file_has_a_component() -> None:
    """A new test file must be listed in tiers.COMPONENTS (and a removed one taken out)."""
    files = {path.name for path in TESTS.glob("test_*.py")}
    assert sorted(files - tiers.COMPONENTS.keys()) == [], "add these files to tests/tiers.py COMPONENTS"
    assert sorted(tiers.COMPONENTS.keys() - files) == [], "these files are gone: take them out of COMPONENTS"
    assert set(tiers.COMPONENTS.values()) - {None} <= tiers.COMPONENT_HELP.keys()
    assert tiers.INTEGRATION_FILES <= files


def test_every_slow_test_exists() -> None:
    for name in tiers.SLOW_TESTS:
        file, _, test = name.partition("::")
        source = (TESTS / file).read_text()
        assert f"def {test}(" in source, f"{name} in tiers.SLOW_TESTS names no test"


def test_the_collected_tests_carry_their_markers(request: pytest.FixtureRequest) -> None:
    """Each collected test has its file's component marker and no other component's; a test on PostgreSQL
    is integration."""
    for item in request.session.items:
        marked = {name for name in tiers.COMPONENT_HELP if item.get_closest_marker(name) is not None}
        expected = tiers.COMPONENTS.get(item.path.name)
        assert marked == ({expected} if expected else set()), item.nodeid
        callspec = getattr(item, "callspec", None)
        if callspec is not None and tiers.POSTGRES_PARAM in callspec.params.values():
            assert item.get_closest_marker("integration") is not None, item.nodeid


SAMPLE = """
import subprocess

def runs_a_tool():
    return subprocess.run(["true"], check=True).returncode

def through_a_helper():
    return runs_a_tool()

class Launcher:
    def start(self):
        return through_a_helper()

def pure():
    return sum(range(3))
"""
"""Test-suite code to scan, kept in a string: were it functions here, this test would start a process."""


def sample_module() -> types.ModuleType:
    module = types.ModuleType("tests.tiers_sample")
    exec(compile(SAMPLE, "<tiers sample>", "exec"), vars(module))
    return module


def test_a_process_is_found_through_the_suites_own_helpers_and_classes() -> None:
    sample = sample_module()
    scanner = tiers.Scanner()
    assert tiers.PROCESS_NAMES & scanner.reaches([sample.through_a_helper])
    assert tiers.PROCESS_NAMES & scanner.reaches([sample.Launcher])
    assert not tiers.PROCESS_NAMES & scanner.reaches([sample.pure])
    # the product is not followed: what it runs is its own business, not the test's
    assert not tiers.PROCESS_NAMES & scanner.reaches([Path.exists])
