"""Engines own their quirks: outside ``exporters/engines/``, the exporter and its command line never
name a specific engine (no engine-module imports, no engine constants, no engine names in strings).
Adding an engine means adding one module there, plus its fixtures."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from inferwatch.core import vocabulary as V
from tests.conftest import ROOT

ENGINES_DIR = ROOT / "inferwatch" / "exporters" / "engines"
ENGINES_PACKAGE = "inferwatch.exporters.engines"
GENERIC_FILES = [*sorted((ROOT / "inferwatch" / "exporters").glob("*.py")), ROOT / "inferwatch" / "cli" / "exporter.py"]

ENGINE_MODULES = frozenset(p.stem for p in ENGINES_DIR.glob("*.py") if p.stem != "__init__")
ENGINE_CONSTANTS = frozenset(
    {"ENGINES"} | {name for name in dir(V) if name.startswith("ENGINE_") and getattr(V, name) in V.ENGINES}
)
# Engine names as ids, plus product spellings that are not ids.
ENGINE_WORD = re.compile(
    r"(?<![a-z0-9])(" + "|".join(sorted({*V.ENGINES, *ENGINE_MODULES, "tensorrt"})) + r")(?![a-z0-9])",
    re.IGNORECASE,
)


def _documentation(tree: ast.AST) -> set[int]:
    """ids of string statements (docstrings, attribute docstrings): prose, which may cite an engine."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def violations(source: str) -> list[str]:
    """Where ``source`` names a specific engine in code: ``line: what``."""
    tree = ast.parse(source)
    prose = _documentation(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: imports {a.name}" for a in node.names if a.name.startswith(ENGINES_PACKAGE + ".")]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.startswith(ENGINES_PACKAGE + "."):
                found.append(f"{line}: imports from {node.module}")
            elif node.module == ENGINES_PACKAGE:
                found += [f"{line}: imports engine module {a.name}" for a in node.names if a.name in ENGINE_MODULES]
            found += [f"{line}: imports {a.name}" for a in node.names if a.name in ENGINE_CONSTANTS]
        elif isinstance(node, ast.Attribute) and node.attr in ENGINE_CONSTANTS:
            found.append(f"{line}: uses {node.attr}")
        elif isinstance(node, ast.Name) and node.id in ENGINE_CONSTANTS:
            found.append(f"{line}: uses {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            match = ENGINE_WORD.search(node.value)
            if match:
                found.append(f"{line}: string names engine {match.group(1)!r}: {node.value[:60]!r}")
    return found


@pytest.mark.parametrize("path", GENERIC_FILES, ids=[str(p.relative_to(ROOT)) for p in GENERIC_FILES])
def test_generic_code_names_no_engine(path: Path) -> None:
    found = violations(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} names a specific engine:\n" + "\n".join(found)


def test_every_engine_module_is_known() -> None:
    assert ENGINE_MODULES >= set(V.ENGINES)


@pytest.mark.parametrize(
    "planted",
    [
        "from inferwatch.exporters.engines import tgi\n",
        "from inferwatch.exporters.engines import EngineRegistry, trtllm as t\n",
        "from inferwatch.exporters.engines.trtllm import JSON_PATH\n",
        "import inferwatch.exporters.engines.vllm\n",
        "from inferwatch.core.vocabulary import ENGINE_TRITON\n",
        "name = V.ENGINE_TGI\n",
        "for e in V.ENGINES:\n    pass\n",
        "if adapter.name == 'trtllm':\n    pass\n",
        'HELP = "Override the model label (TGI, Triton)."\n',
        'url = f"{base}/prometheus/metrics"  # vLLM\nmsg = f"trtllm-serve answered {code}"\n',
        "OPTION = {'tensorrt_llm': 1}\n",
    ],
)
def test_checker_catches_a_planted_violation(planted: str) -> None:
    assert violations(planted)


def test_checker_allows_generic_code_and_prose() -> None:
    clean = (
        '"""Module prose may cite vLLM or TGI as an example."""\n'
        "from inferwatch.exporters.engines import EngineRegistry, builtin_registry\n"
        "from inferwatch.exporters.mapping import EngineAdapter\n"
        "class C:\n"
        "    x: int = 1\n"
        '    """attribute prose about trtllm-serve."""\n'
        "def f(adapter: EngineAdapter) -> str:\n"
        '    """Docstring about Triton."""\n'
        '    return f"{adapter.name}: metrics at {adapter.default_path}" + V.LABEL_ENGINE\n'
    )
    assert violations(clean) == []
