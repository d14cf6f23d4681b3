"""Run the mutation targets of ``mutation/*.toml`` with cosmic-ray and print a score table.

Usage (from the repository root, with cosmic-ray installed: ``pip install -e '.[dev]'``)::

    python mutation/run.py                 # every target, one after the other
    python mutation/run.py spool ttft      # some targets (the .toml names)
    python mutation/run.py --list          # the targets and their scope, nothing run

cosmic-ray writes each mutant into the module's file on disk. So that a run never changes the checkout
(which other people edit and test meanwhile) it runs in a scratch copy of the project made for the run
and removed after it. A target's tests run in that copy, with its own ``inferwatch`` first on the path.

Each ``mutation/<target>.toml`` holds cosmic-ray's own ``[cosmic-ray]`` table (module, test command,
per-mutant timeout; ``{python}`` stands for this interpreter) and a ``[scope]`` table: ``functions``
(qualified names, e.g. ``Spool.commit``) and ``lines`` (``"12-30"``: module-level tables) that the
mutants must start in; mutants elsewhere in the module are out of scope and not run. ``exclude-operators``
drops whole operators (cosmic-ray's random variable replacer and inserter are left out everywhere).

Survivors listed in ``mutation/equivalent.md`` (target, line, operator and mutated line) are counted as
equivalent; every other survivor is printed with its diff. The exit code is 1 when a non-equivalent
mutant survived (or a target's tests fail unmutated), else 0.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COPIED = ("inferwatch", "tests", "docs", "bench", "deploy", "migrations", "pyproject.toml", "README.md", "Makefile")
"""what the scratch copy holds (the tests read docs/, bench/, deploy/ ... besides the package)."""
ALWAYS_EXCLUDED = ("core/VariableReplacer", "core/VariableInserter")
KEPT_REPLACEMENTS = {
    # a binary operator: its arithmetic inverse or sibling (as mutmut does), not every other operator
    "Add": ("Sub",),
    "Sub": ("Add",),
    "Mul": ("Div",),
    "Div": ("Mul", "FloorDiv"),
    "FloorDiv": ("Div",),
    "Mod": ("FloorDiv",),
    "Pow": ("Mul",),
    "BitOr": ("BitAnd",),
    "BitAnd": ("BitOr",),
    "BitXor": ("BitOr",),
    "LShift": ("RShift",),
    "RShift": ("LShift",),
    # a comparison: its boundary shift and its negation
    "Lt": ("LtE", "GtE"),
    "LtE": ("Lt", "Gt"),
    "Gt": ("GtE", "LtE"),
    "GtE": ("Gt", "Lt"),
    "Eq": ("NotEq",),
    "NotEq": ("Eq",),
    "Is": ("IsNot",),
    "IsNot": ("Is",),
    "In": ("NotIn",),
    "NotIn": ("In",),
}
"""Selective mutation: cosmic-ray replaces each operator by every other one (``+`` by ``>>``, ``<`` by ``is``);
these keep the replacements that a plausible slip makes (the others are mostly killed by the same cases, or
crash at once): 1,133 mutants become 493 on these targets."""
WIDTH = 80


@dataclass
class Target:
    name: str
    path: Path
    module: str
    title: str
    functions: list[str]
    lines: list[tuple[int, int]]
    exclude_operators: list[str]
    config: dict[str, object]


@dataclass
class Score:
    target: str
    mutants: int = 0
    killed: int = 0
    timeout: int = 0
    survived: int = 0
    equivalent: int = 0
    incompetent: int = 0
    out_of_scope: int = 0
    seconds: float = 0.0
    baseline_ok: bool = True
    survivors: list[tuple[str, int, str, str]] = field(default_factory=list)
    """(operator, line, mutated line, diff) of each non-equivalent survivor."""


def load_targets(names: Iterable[str], folder: Path = HERE) -> list[Target]:
    wanted = set(names)
    out = []
    for path in sorted(folder.glob("*.toml")):
        if wanted and path.stem not in wanted:
            continue
        raw = tomllib.loads(path.read_text())
        scope = raw.get("scope", {})
        lines = []
        for spec in scope.get("lines", []):
            lo, _, hi = spec.partition("-")
            lines.append((int(lo), int(hi or lo)))
        out.append(
            Target(
                name=path.stem,
                path=path,
                module=raw["cosmic-ray"]["module-path"],
                title=scope.get("title", path.stem),
                functions=list(scope.get("functions", [])),
                lines=lines,
                exclude_operators=list(scope.get("exclude-operators", [])) + list(ALWAYS_EXCLUDED),
                config=raw["cosmic-ray"],
            )
        )
    missing = wanted - {t.name for t in out}
    if missing:
        raise SystemExit(f"no such target: {', '.join(sorted(missing))}")
    return out


def function_ranges(source: str, names: list[str]) -> list[tuple[int, int]]:
    """Line ranges (decorators included) of the functions and classes named ``Outer.inner``, and of the
    module-level assignments (tables) named."""
    found: dict[str, tuple[int, int]] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qual = f"{prefix}{node.name}"
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                found[qual] = (first, node.end_lineno or node.lineno)
                walk(node.body, f"{qual}.")
            elif isinstance(node, ast.Assign | ast.AnnAssign) and not prefix:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        found[target.id] = (node.lineno, node.end_lineno or node.lineno)

    walk(ast.parse(source).body, "")
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"functions not found: {', '.join(missing)}")
    return [found[n] for n in names]


def kept(operator: str) -> bool:
    """Whether the selective set keeps this operator (see :data:`KEPT_REPLACEMENTS`)."""
    if operator in ALWAYS_EXCLUDED:
        return False
    name = operator.split("/")[-1]
    for kind in ("ReplaceBinaryOperator_", "ReplaceComparisonOperator_"):
        if name.startswith(kind):
            old, _, new = name[len(kind) :].partition("_")
            return new in KEPT_REPLACEMENTS.get(old, ())
    return True


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions of the annotations: with ``from __future__ import annotations`` they are never
    evaluated, so a mutant in one (``int | None`` -> ``int & None``) cannot change behaviour."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        notes: list[ast.expr | None] = []
        if isinstance(node, ast.arg | ast.AnnAssign):
            notes.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            notes.append(node.returns)
        for n in notes:
            if n is not None:
                spans.append(((n.lineno, n.col_offset), (n.end_lineno or n.lineno, n.end_col_offset or 0)))
    return spans


def copy_project(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache", ".pytest_cache")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore, symlinks=True)
        elif src.exists():
            shutil.copy2(src, dest / name)


def equivalents() -> set[tuple[str, int, str, str]]:
    """(target, line, operator, mutated line) of the rows of equivalent.md's table."""
    out: set[tuple[str, int, str, str]] = set()
    path = HERE / "equivalent.md"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] not in ("target", "") and not cells[0].startswith("-"):
            out.add((cells[0], int(cells[1]), cells[2], cells[3].strip("`").strip()))
    return out


def mutated_line(diff: str) -> str:
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


def run_target(
    target: Target, work: Path, equiv: set[tuple[str, int, str, str]], verbose: bool, count_only: bool = False
) -> Score:
    from cosmic_ray.work_db import WorkDB, use_db  # type: ignore[import-untyped]
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult  # type: ignore[import-untyped]

    score = Score(target.name)
    started = time.monotonic()
    config = dict(target.config)
    command = str(config["test-command"]).replace("{python}", sys.executable)
    config["test-command"] = command
    cfg_path = work / f"{target.name}.toml"
    cfg_path.write_text(_toml({"cosmic-ray": config}))
    session = work / f"{target.name}.sqlite"
    warm = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    # the unmutated run writes the byte code of every module and test it imports (pytest's rewritten tests
    # too); the mutants' runs write none and the mutated module's is removed, so it is always compiled anew
    baseline = subprocess.run(command, shell=True, cwd=work, env=warm, capture_output=True, text=True)
    if baseline.returncode != 0:
        score.baseline_ok = False
        print(f"{target.name}: the tests fail unmutated:\n{baseline.stdout[-2000:]}{baseline.stderr[-2000:]}")
        return score
    module = work / target.module
    for stale in (module.parent / "__pycache__").glob(f"{module.stem}.*.pyc"):
        stale.unlink()
    env = dict(warm, PYTHONDONTWRITEBYTECODE="1")
    cr = [sys.executable, "-m", "cosmic_ray.cli"]
    subprocess.run([*cr, "init", str(cfg_path), str(session)], cwd=work, env=env, check=True)

    source = (work / target.module).read_text()
    ranges = function_ranges(source, target.functions) + target.lines
    notes = annotation_spans(source) if "from __future__ import annotations" in source else []
    with use_db(str(session), WorkDB.Mode.open) as db:
        skip = []
        for item in db.work_items:
            (mutation,) = item.mutations
            line = mutation.start_pos[0]
            in_scope = any(lo <= line <= hi for lo, hi in ranges)
            in_note = any(a <= tuple(mutation.start_pos) and tuple(mutation.end_pos) <= b for a, b in notes)
            chosen = kept(mutation.operator_name) and mutation.operator_name not in target.exclude_operators
            if not in_scope or in_note or not chosen:
                skip.append(item.job_id)
        score.out_of_scope = len(skip)
        db.set_multiple_results(skip, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    if count_only:
        with use_db(str(session), WorkDB.Mode.open) as db:
            score.mutants = db.num_work_items - score.out_of_scope
        return score
    subprocess.run([*cr, "exec", str(cfg_path), str(session)], cwd=work, env=env, check=True)

    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            (mutation,) = item.mutations
            score.mutants += 1
            if result.test_outcome == TestOutcome.SURVIVED:
                text = mutated_line(result.diff or "")
                if (target.name, mutation.start_pos[0], mutation.operator_name, text) in equiv:
                    score.equivalent += 1
                else:
                    score.survived += 1
                    score.survivors.append((mutation.operator_name, mutation.start_pos[0], text, result.diff or ""))
            elif result.test_outcome == TestOutcome.KILLED:
                if result.output == "timeout":
                    score.timeout += 1
                else:
                    score.killed += 1
            else:
                score.incompetent += 1
                if verbose:
                    print(f"incompetent: {mutation.operator_name} line {mutation.start_pos[0]}: {result.output}")
    score.survivors.sort(key=lambda s: s[1])
    score.seconds = time.monotonic() - started
    return score


def _toml(data: dict[str, dict[str, object]]) -> str:
    """The little TOML cosmic-ray's config needs: one table of strings, numbers and lists of strings,
    and nested tables (``distributor``)."""

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        text = str(v).replace("\\", "\\\\").replace('"', '\\"')
        return f'"{text}"'

    out: list[str] = []

    def table(name: str, body: dict[str, object]) -> None:
        out.append(f"[{name}]")
        nested = {}
        for k, v in body.items():
            if isinstance(v, dict):
                nested[k] = v
            else:
                out.append(f'"{k}" = {value(v)}')
        out.append("")
        for k, v in nested.items():
            table(f'{name}."{k}"', v)

    for name, body in data.items():
        table(f'"{name}"', body)
    return "\n".join(out)


def print_table(scores: list[Score]) -> None:
    head = f"{'target':<14}{'mutants':>8}{'killed':>8}{'timeout':>8}{'survived':>9}{'equiv':>7}{'incomp':>7}"
    head += f"{'score':>8}{'time':>8}"
    print("=" * WIDTH)
    print(head)
    print("-" * WIDTH)
    total = Score("total")
    for s in scores:
        for attr in ("mutants", "killed", "timeout", "survived", "equivalent", "incompetent", "seconds"):
            setattr(total, attr, getattr(total, attr) + getattr(s, attr))
    for s in [*scores, total]:
        if s is total:
            print("-" * WIDTH)
        live = s.mutants - s.equivalent
        rate = f"{100 * (s.killed + s.timeout) / live:.1f}%" if live else "-"
        if not s.baseline_ok:
            rate = "FAILED"
        print(
            f"{s.target:<14}{s.mutants:>8}{s.killed:>8}{s.timeout:>8}{s.survived:>9}{s.equivalent:>7}"
            f"{s.incompetent:>7}{rate:>8}{s.seconds:>7.0f}s"
        )
    print("=" * WIDTH)
    print("score = (killed + timeout) / (mutants - equivalent); incomp = mutants that did not import/run")


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="target names (mutation/<name>.toml); all when none")
    parser.add_argument("--list", action="store_true", help="list the targets and their scope")
    parser.add_argument("--targets-dir", type=Path, default=HERE, help="where the .toml files are (default: here)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (its sessions: cr-report)")
    parser.add_argument("--count", action="store_true", help="count each target's mutants, run none")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    targets = load_targets(args.targets, args.targets_dir)
    if args.list:
        for t in targets:
            scope = ", ".join(t.functions + [f"lines {lo}-{hi}" for lo, hi in t.lines])
            print(f"{t.name}: {t.module}: {scope}")
        return 0
    equiv = equivalents()
    signal.signal(signal.SIGTERM, _stop)
    work = Path(tempfile.mkdtemp(prefix="inferwatch-mutation-"))
    scores = []
    try:
        copy_project(work)
        for target in targets:
            print(f"--- {target.name}: {target.title} ({target.module})", flush=True)
            score = run_target(target, work, equiv, args.verbose, args.count)
            scores.append(score)
            for op, line, text, diff in score.survivors:
                print(f"SURVIVED {target.name} line {line} {op}: {text}")
                if args.verbose:
                    print(diff)
    finally:
        if args.keep:
            print(f"scratch copy kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print_table(scores)
    return 0 if all(s.baseline_ok and not s.survived for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
