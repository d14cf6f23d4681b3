"""Every engine lists every canonical signal as mapped or unsupported, and its claims hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferwatch.core import vocabulary as V
from inferwatch.exporters.coverage import markdown, matrix
from inferwatch.exporters.engines import EngineRegistry
from tests.conftest import ENGINE_FIXTURES, ROOT, fixture_dirs
from tests.helpers import families
from tests.support.fixtures import fixture_payloads, load_fixture_meta, translate_fixture


def test_matrix_is_complete(registry: EngineRegistry) -> None:
    for adapter in registry:
        mapped = adapter.mapped_metrics()
        unsupported = set(adapter.unsupported)
        assert not mapped & unsupported, f"{adapter.name}: both mapped and unsupported: {mapped & unsupported}"
        every = {s.key for s in V.CANONICAL_METRICS}
        missing = every - mapped - unsupported
        assert not missing, f"{adapter.name}: canonical metrics neither mapped nor unsupported: {missing}"
        assert unsupported <= every
    assert set(matrix(registry)) == set(V.ENGINES)


@pytest.mark.parametrize("engine", V.ENGINES)
def test_mapped_claims_hold_on_fixtures(engine: str, registry: EngineRegistry, vocab: V.Vocabulary) -> None:
    """What an adapter claims to map appears in the output of at least one of its fixtures."""
    produced: set[str] = set()
    for d in fixture_dirs():
        if d.relative_to(ENGINE_FIXTURES).parts[0] != engine:
            continue
        for payload in fixture_payloads(load_fixture_meta(d)):
            produced |= set(families(translate_fixture(d, payload, registry, vocab)))
    adapter = registry.get(engine)
    claimed = {V.metric_by_key(k).name.removesuffix("_total") for k in adapter.mapped_metrics()}
    assert claimed <= produced, f"{engine}: mapped but never produced by a fixture: {claimed - produced}"


def test_coverage_doc_is_current(registry: EngineRegistry, update_goldens: bool) -> None:
    path: Path = ROOT / "docs" / "coverage.md"
    text = markdown(registry)
    if update_goldens:
        path.write_text(text)
    assert path.read_text() == text, "docs/coverage.md is stale; run `make goldens`"


def test_vocabulary_doc_is_current(vocab: V.Vocabulary, update_goldens: bool) -> None:
    from inferwatch.core.reference import markdown as vocabulary_markdown

    path: Path = ROOT / "docs" / "vocabulary.md"
    text = vocabulary_markdown(vocab)
    if update_goldens:
        path.write_text(text)
    assert path.read_text() == text, "docs/vocabulary.md is stale; run `make goldens`"
