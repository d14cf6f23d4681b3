"""Every engine fixture payload translates to its committed golden, and promtool accepts it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from tests.conftest import ENGINE_FIXTURES, fixture_dirs
from tests.helpers import families
from tests.support.fixtures import fixture_payloads, load_fixture_meta, translate_fixture

CASES = [(d, p) for d in fixture_dirs() for p in fixture_payloads(load_fixture_meta(d))]


def _id(case: tuple[Path, str]) -> str:
    d, p = case
    return f"{d.relative_to(ENGINE_FIXTURES)}/{p}"


def golden_path(directory: Path, payload: str) -> Path:
    return directory / f"{Path(payload).stem}.expected.prom"


def test_every_engine_has_fixtures() -> None:
    engines = {d.relative_to(ENGINE_FIXTURES).parts[0] for d in fixture_dirs()}
    assert engines == set(V.ENGINES)
    for d in fixture_dirs():
        assert (d / "SOURCE.md").is_file(), f"{d} has no SOURCE.md"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_golden(case: tuple[Path, str], registry: EngineRegistry, vocab: V.Vocabulary, update_goldens: bool) -> None:
    directory, payload = case
    out = translate_fixture(directory, payload, registry, vocab)
    golden = golden_path(directory, payload)
    if update_goldens or not golden.exists():
        if not update_goldens:
            pytest.fail(f"{golden} is missing; run `make goldens` and review it")
        golden.write_text(out)
    assert out == golden.read_text(), f"{golden} differs; run `make goldens` if the change is intended"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_only_canonical_families(case: tuple[Path, str], registry: EngineRegistry, vocab: V.Vocabulary) -> None:
    directory, payload = case
    out = translate_fixture(directory, payload, registry, vocab)
    canonical = {s.name.removesuffix("_total") for s in V.ALL_METRICS}
    assert set(families(out)) <= canonical
    assert V.EXPORTER_UP.name in families(out)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_promtool_check_metrics(
    case: tuple[Path, str], registry: EngineRegistry, vocab: V.Vocabulary, promtool: str
) -> None:
    directory, payload = case
    out = translate_fixture(directory, payload, registry, vocab)
    proc = subprocess.run([promtool, "check", "metrics"], input=out, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr
