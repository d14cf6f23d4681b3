"""The rollup job's column-wise fold of a chunk equals the row-by-row fold (rollup partials and value blocks)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from inferwatch.collector.stats import rollup, sketch, values
from inferwatch.collector.stats.folding import fold_chunk
from inferwatch.collector.store.tables import ROLLUP_FIELDS

NF = len(ROLLUP_FIELDS)


def _rows(rng: random.Random, n: int, sqlite: bool) -> list[tuple[Any, ...]]:
    minutes = [f"2026-12-06 12:0{m}" for m in range(rng.randint(1, 3))]
    series = [("vllm", m, i, s) for m in ("a", None) for i in ("x", None) for s in ("svc", None)]
    series = series[: rng.randint(1, len(series))]
    out = []
    for _ in range(n):
        minute: Any = rng.choice(minutes)
        if not sqlite:
            minute = datetime.strptime(minute, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
        lat = [
            rng.choice([None, 0.0, -0.0, rng.random(), rng.random() * 100, sketch.BOUNDS[5], 1e12]) for _ in range(NF)
        ]
        pt = rng.choice([None, rng.randint(0, 5000)])
        gt = rng.choice([None, rng.randint(0, 5000)])
        out.append((minute, *rng.choice(series), rng.randint(0, 1), pt, gt, *lat))
    return out


def _reference(rows: list[tuple[Any, ...]]) -> tuple[dict[Any, rollup.Partial], dict[Any, values.Encoded]]:
    parts: dict[Any, rollup.Partial] = {}
    blocks: dict[Any, values.Block] = {}
    for minute, e, m, i, s, failed, pt, gt, *lat in rows:
        key = (rollup._minute(minute), e, m, i, s)
        parts.setdefault(key, rollup.Partial()).add_row(failed, pt, gt, tuple(lat))
        blocks.setdefault(rollup._minute(minute), values.Block(NF)).add((e, m, i, s), failed, pt, gt, lat)
    return parts, {k: b.encode() for k, b in blocks.items()}


@pytest.mark.parametrize("seed", range(6))
def test_the_column_fold_is_the_row_fold(seed: int) -> None:
    rng = random.Random(seed)
    rows = _rows(rng, rng.choice([1, 7, 300, 2000]), sqlite=seed % 2 == 0)
    parts, blocks = rollup.fold_rows(rows)
    want_parts, want_blocks = _reference(rows)
    assert {k: p.row() for k, p in parts.items()} == {k: p.row() for k, p in want_parts.items()}
    assert blocks == want_blocks


def test_an_empty_chunk_folds_to_nothing() -> None:
    chunk = fold_chunk([], NF)
    assert chunk.keys == [] and chunk.blocks == {}


def test_pending_folds_merge_as_one_fold() -> None:
    rng = random.Random(9)
    rows = _rows(rng, 3000, sqlite=True)
    pending = rollup.Pending()
    for a in range(0, len(rows), 700):
        pending.add(rows[a : a + 700])
    parts, blocks = rollup.fold_rows(rows)
    assert pending.rows == len(rows)
    assert {k: p.row() for k, p in pending.minutes.items()} == {k: p.row() for k, p in parts.items()}
    assert pending.merged_blocks() == blocks
