"""The one-vocabulary rule: canonical names are spelled only in the vocabulary (inferwatch/core/vocabulary.py
and the plain names it re-exports, inferwatch/core/vocabulary_names.py), and raw engine metric names only
in their engine's module."""

from __future__ import annotations

import re
from pathlib import Path

from inferwatch.core import vocabulary as V
from inferwatch.core import vocabulary_gpu, vocabulary_names, vocabulary_spec
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.mapping import EngineAdapter
from tests.conftest import ROOT

VOCABULARY_FILES = frozenset(
    ROOT / "inferwatch" / "core" / f"{name}.py" for name in ("vocabulary", "vocabulary_names", "vocabulary_gpu")
)
"""The one vocabulary: the module callers import (``V``) and the one whose names it re-exports."""
OUTSIDE = "outside the vocabulary (inferwatch/core/vocabulary.py, vocabulary_names.py)"
EXCLUDED_DIRS = {".venv", ".git", "fixtures", "__pycache__", "build", ".mypy_cache", ".ruff_cache"}
TOKEN = re.compile(r"(?<![\w:])llm_[a-z0-9_]+")
VLLM_RAW = re.compile(r"vllm:[a-z]")


def python_files() -> list[Path]:
    return [
        p
        for p in ROOT.rglob("*.py")
        if not EXCLUDED_DIRS & set(p.relative_to(ROOT).parts) and not p.name.endswith(".egg-info")
    ]


def canonical_tokens() -> set[str]:
    names = set()
    for spec in (*V.ALL_METRICS, *V.COLLECTOR_METRICS):
        names.add(spec.name)
        base = spec.name.removesuffix("_total")
        names.add(base)
        names.update(f"{spec.name}{s}" for s in ("_bucket", "_sum", "_count"))
    return names


def test_canonical_names_spelled_once() -> None:
    names = canonical_tokens()
    offenders = []
    for path in python_files():
        if path in VOCABULARY_FILES:
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for tok in TOKEN.findall(line):
                if tok in names:
                    offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {tok}")
    assert not offenders, f"canonical names spelled {OUTSIDE}:\n" + "\n".join(offenders)


def raw_names(adapter: EngineAdapter) -> set[str]:
    """The engine's own metric names (with its prefix: generic unprefixed names prove nothing)."""
    names = set(adapter.extra_samples) | set(adapter.ignored)
    for row in (*adapter.rows, *adapter.hook_rows):
        names.update(row.sources)
    return {n for n in names if n.startswith(adapter.prefixes)}


def allowed(path: Path, engine: str) -> bool:
    """The engine's module (``engines/<engine>.py``) or a file of its package (``engines/<engine>/metrics.py``)."""
    parts = path.relative_to(ROOT).parts
    homes = ("engines", "simulator", "simulators")
    module = path.stem == engine and len(parts) >= 2 and parts[-2] in homes
    package = len(parts) >= 3 and parts[-2] == engine and parts[-3] in homes
    return module or package


def test_raw_engine_names_stay_in_their_module(registry: EngineRegistry) -> None:
    patterns = {
        a.name: re.compile(r"(?<![\w:])(" + "|".join(re.escape(n) for n in sorted(raw_names(a))) + r")(?![\w])")
        for a in registry
    }
    offenders = []
    for path in python_files():
        text = path.read_text()
        for engine, pattern in patterns.items():
            if allowed(path, engine):
                continue
            for m in pattern.finditer(text):
                lineno = text.count("\n", 0, m.start()) + 1
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {engine} name {m.group(1)}")
        if not allowed(path, V.ENGINE_VLLM):
            for m in VLLM_RAW.finditer(text):
                lineno = text.count("\n", 0, m.start()) + 1
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: raw vLLM name")
    assert not offenders, "raw engine names outside their engine module:\n" + "\n".join(offenders)


def test_drift_check_catches_a_stray_name(tmp_path: Path) -> None:
    """The scanner itself works: a canonical name in a string literal is found."""
    stray = 'QUERY = "rate(' + V.PROMPT_TOKENS.name + '[5m])"\n'
    assert any(t in canonical_tokens() for t in TOKEN.findall(stray))


def test_rule_and_alert_names_spelled_once() -> None:
    """Recording-rule and alert names live in the vocabulary; generators and tests import them."""
    names = [
        V.SLO_ERROR_RATIO_PREFIX,
        V.SLO_OBJECTIVE_RECORD,
        V.SLO_ERROR_BUDGET_RECORD,
        V.SLO_PERIOD_ERROR_RATIO_RECORD,
        V.SLO_BUDGET_REMAINING_RECORD,
        V.SLO_INFO_RECORD,
        *V.ALERTS,
    ]
    offenders = []
    for path in python_files():
        if path in VOCABULARY_FILES:
            continue
        text = path.read_text()
        for name in names:
            if name in text:
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, f"rule or alert names spelled {OUTSIDE}:\n" + "\n".join(offenders)


def test_the_vocabulary_is_its_modules() -> None:
    """The exemption above covers exactly the vocabulary's modules that spell names, and ``V`` re-exports
    every name of each of its modules (the plain names, the GPU families, the metric shape)."""
    spelling = (V, vocabulary_names, vocabulary_gpu)
    assert {Path(m.__file__ or "").resolve() for m in spelling} == {p.resolve() for p in VOCABULARY_FILES}
    for module in (vocabulary_names, vocabulary_gpu, vocabulary_spec):
        missing = [n for n in module.__all__ if getattr(V, n, None) is not getattr(module, n)]
        assert not missing, f"names of {module.__name__} that V does not re-export: {missing}"


def test_dcgm_names_stay_in_the_dcgm_modules() -> None:
    """Raw dcgm-exporter field names (a GPU source's dialect) only in modules named ``dcgm.py``."""
    raw = re.compile(r"\bDCGM_(FI|EXP)_[A-Z_]+")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in python_files()
        if path.name != "dcgm.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if raw.search(line)
    ]
    assert not offenders, "dcgm-exporter field names outside a dcgm.py module:\n" + "\n".join(offenders)
