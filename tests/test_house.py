"""The house rules of the source tree (docs/architecture.md): one path per module, names a reader can
tell apart, modules a reader can hold in mind, and a checkout without symlinks that still works.

The import contracts (layers, purity, light sidecars, no cycles) are ``make lint``'s; these are the
rules of files and names it cannot see.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

from inferwatch.core.engines import builtin_profiles

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "inferwatch"

MAX_LINES = 600
"""No module of the product, the benchmarks or the test suite is longer: a test file past it is split by concern
(the engine fixtures under ``tests/fixtures/`` are data, not modules of the suite)."""

ROOT_LINKS = ("alerts", "collector", "dashboards", "exporters", "migrations")
"""The folders a reader looks for at the top of the repository: links into the package."""

ONE_PER_COMPONENT = {
    "server": "the HTTP server of the simulator, the exporter and the proxy",
    "runtime": "what runs the exporter's and the simulator's servers (threads, signals, shutdown)",
    "generate": "the alert rule and dashboard generators, and the CLI's `generate` command group",
}
"""Base names shared on purpose: the same kind of module, once in each component that has one."""

GPU_SOURCES = ("dcgm",)
"""GPU sources' dialects, named after the source like an engine's module: what the exporter translates,
what the simulator renders, what the diagnosis asks the operator to enable (NVIDIA dcgm-exporter)."""

SIMULATOR_PARTS = ("api", "metrics", "spans", "protocol")
"""The modules of each simulated engine's package (simulator/engines/<engine>/); ``protocol`` holds the
engine's request and response shapes where its API needs more than ``api.py`` (TGI, llama.cpp)."""


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "versions" not in p.relative_to(PACKAGE).parts)


def _git_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def test_no_symlink_inside_the_package() -> None:
    links = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*") if p.is_symlink()]
    assert not links, f"every module's file lives in inferwatch/, not behind a link: {links}"


def test_the_root_links_point_into_the_package() -> None:
    """Git records the root folders as links (mode 120000) to ``inferwatch/<name>``, and nothing else."""
    links = {line.split("\t", 1)[1]: line.split()[1] for line in _git_files() if line.startswith("120000")}
    assert sorted(links) == sorted(ROOT_LINKS)
    for name in ROOT_LINKS:
        target = subprocess.run(
            ["git", "cat-file", "-p", f"HEAD:{name}"], cwd=ROOT, capture_output=True, text=True
        ).stdout
        if target:  # committed (a working tree ahead of HEAD is checked on the file system below)
            assert target == f"inferwatch/{name}", name
        path = ROOT / name
        if path.is_symlink():
            assert os.readlink(path) == f"inferwatch/{name}", name


def test_module_base_names_are_unique() -> None:
    """Two modules share a base name only when they are the same kind of thing in parallel places:
    one per engine or GPU source (named after it, or its simulator package's parts), or one per component."""
    engines = set(builtin_profiles())
    by_name: dict[str, list[Path]] = defaultdict(list)
    for path in _modules():
        if path.stem not in ("__init__", "__main__"):
            by_name[path.stem].append(path.relative_to(PACKAGE))
    clashes = {}
    for name, paths in by_name.items():
        if len(paths) < 2 or name in engines or name in GPU_SOURCES or name in ONE_PER_COMPONENT:
            continue
        if name in SIMULATOR_PARTS and all(p.parts[:2] == ("simulator", "engines") for p in paths):
            continue
        clashes[name] = [str(p) for p in paths]
    assert not clashes, f"modules with one base name for different things (rename one): {clashes}"


def test_one_per_component_names_are_still_shared() -> None:
    """An allowance nobody needs any more is dropped, not kept as a loophole."""
    counts: defaultdict[str, int] = defaultdict(int)
    for path in _modules():
        counts[path.stem] += 1
    assert all(counts[name] > 1 for name in ONE_PER_COMPONENT), dict(counts)


def test_no_module_is_over_the_size_limit() -> None:
    tests = ROOT / "tests"
    suite = sorted(p for p in tests.rglob("*.py") if p.relative_to(tests).parts[0] != "fixtures")
    sources = [*_modules(), *sorted((ROOT / "bench").glob("*.py")), *suite]
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_no_function_is_ranked_e_or_f() -> None:
    """Cyclomatic complexity (radon): rank D (21-30) at worst, so every function can be read in one go."""
    cc_visit = pytest.importorskip("radon.complexity").cc_visit
    rank = pytest.importorskip("radon.complexity").cc_rank
    worst = []
    for path in [*_modules(), *sorted((ROOT / "bench").glob("*.py"))]:
        for block in cc_visit(path.read_text()):
            if rank(block.complexity) in ("E", "F"):
                worst.append(f"{path.relative_to(ROOT)}:{block.lineno} {block.name} ({block.complexity})")
    assert not worst, f"functions ranked E or F (extract helpers): {worst}"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_checkout_without_symlinks_imports_every_module(tmp_path: Path) -> None:
    """``git clone -c core.symlinks=false``: the root links become small text files; nothing imports,
    builds or tests through them, so every module still imports from the clone, and its tests run."""
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", "-c", "core.symlinks=false", str(ROOT), str(clone)], check=True, capture_output=True
    )
    assert (clone / "collector").is_file() and not (clone / "collector").is_symlink()
    script = (
        "import importlib, pkgutil, inferwatch\n"
        "assert inferwatch.__file__.startswith(__import__('sys').argv[1]), inferwatch.__file__\n"
        "names = [m.name for m in pkgutil.walk_packages(inferwatch.__path__, 'inferwatch.')\n"
        "         if '.migrations' not in m.name and not m.name.endswith('__main__')]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(clone)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(clone)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 100
    # and tests from the clone: the goldens are read and regenerated at their real paths
    tests = ["tests/test_goldens.py", "tests/test_drift.py"]
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tested.returncode == 0, tested.stdout[-3000:]
    assert " passed" in tested.stdout and " failed" not in tested.stdout


def _layers(lines: list[str]) -> list[set[str]]:
    return [
        {part.strip() for part in re.split(r"\s{2,}", line.strip())[0].split("|")} for line in lines if line.strip()
    ]


def test_architecture_diagrams_match_the_contracts() -> None:
    """Each layer diagram of docs/architecture.md (a fenced block after ``<!-- layers: NAME -->``) lists
    the layers of the ``make lint`` contract whose name starts with NAME, top first."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    page = (ROOT / "docs" / "architecture.md").read_text()
    diagrams = re.findall(r"<!-- layers: (.+?) -->\n```\n(.*?)```", page, re.S)
    layered = [c for c in contracts if c["type"] == "layers"]
    assert len(diagrams) == len(layered), "one diagram per layers contract"
    for name, block in diagrams:
        (contract,) = [c for c in layered if c["name"].startswith(name)]
        assert _layers(block.splitlines()) == _layers(contract["layers"]), name
