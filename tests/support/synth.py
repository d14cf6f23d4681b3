"""Derive larger or differently rendered payloads from a real capture (tests and benchmarks).

These transformations only rewrite label values and line order of a genuine prometheus_client
exposition; they never invent metric names or values, so the result keeps the real payload's
families, types and label sets.
"""

from __future__ import annotations

import re

_ENGINE_RE = re.compile(r'engine="[^"]*"')
_MODEL_RE = re.compile(r'model_name="[^"]*"')


def _blocks(text: str) -> list[list[str]]:
    """Split an exposition into families: each block starts at its ``# HELP``/``# TYPE`` lines."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("# HELP ") and current and not current[-1].startswith("# HELP "):
            blocks.append(current)
            current = []
        current.append(line)
    if current:
        blocks.append(current)
    return blocks


def replicate(text: str, engines: int, models: list[str]) -> str:
    """Copy every per-engine sample for ``engines`` data-parallel ranks and each of ``models``.

    Samples with a ``model_name`` label are repeated per (rank, model); samples with only an
    ``engine`` label (``cache_config_info``) per rank; other samples stay once.
    """
    out: list[str] = []
    for block in _blocks(text):
        for line in block:
            if line.startswith("#"):
                out.append(line)
                continue
            has_model = "model_name=" in line
            has_engine = 'engine="' in line
            if not has_model and not has_engine:
                out.append(line)
                continue
            for rank in range(engines):
                ranked = _ENGINE_RE.sub(f'engine="{rank}"', line) if has_engine else line
                if has_model:
                    out.extend(_MODEL_RE.sub(f'model_name="{m}"', ranked) for m in models)
                else:
                    out.append(ranked)
                if not has_engine:
                    break
    return "\n".join(out) + "\n"


def multiprocess(text: str) -> str:
    """Render like prometheus_client's MultiProcessCollector: no ``_created`` families, no
    ``process_``/``python_`` families, and each histogram's ``_sum`` lines before its buckets."""
    out: list[str] = []
    for block in _blocks(text):
        type_line = next((ln for ln in block if ln.startswith("# TYPE ")), "")
        parts = type_line.split()
        name = parts[2] if len(parts) > 3 else ""
        if name.endswith("_created") or name.startswith(("process_", "python_")):
            continue
        if len(parts) > 3 and parts[3] == "histogram":
            comments = [ln for ln in block if ln.startswith("#")]
            sums = [ln for ln in block if ln.startswith(name + "_sum")]
            buckets = [ln for ln in block if ln.startswith(name + "_bucket")]
            counts = [ln for ln in block if ln.startswith(name + "_count")]
            out.extend(comments + sums + buckets + counts)
        else:
            out.extend(block)
    return "\n".join(out) + "\n"
