"""Value blocks merged as stored (numpy) are the bytes the list-based merge makes."""

from __future__ import annotations

import random

import pytest

from inferwatch.collector.stats import values

KEYS = [("vllm", m, i, s) for m in ("a", None, "b") for i in ("x", None) for s in ("svc", None)]


def _block(rng: random.Random) -> values.Block:
    b = values.Block(4)
    series = KEYS[: rng.randint(1, len(KEYS))]
    for _ in range(rng.randint(1, 300)):
        picked = [rng.choice([None, round(rng.random(), 2), 0.0, -0.0, 1e9]) for _ in range(4)]
        b.add(rng.choice(series), rng.randint(0, 1), rng.choice([None, 5]), rng.choice([None, 7]), picked)
    return b


@pytest.mark.parametrize("seed", range(4))
def test_merge_encoded_is_the_list_merge(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(100):
        encoded = [_block(rng).encode() for _ in range(rng.randint(1, 5))]
        merged = values.Block.decode(4, *encoded[0])
        for e in encoded[1:]:
            merged.merge(values.Block.decode(4, *e))
        assert values.merge_encoded(4, encoded) == merged.encode()


def test_merge_encoded_sums_totals_and_keeps_every_value() -> None:
    a, b = values.Block(4), values.Block(4)
    a.add(("vllm", "m", "i", "s"), 1, 10, 20, [0.5, None, 2.0, 0.1])
    b.add(("vllm", "m", "i", "s"), 0, None, 5, [0.25, 0.3, None, None])
    b.add(("sglang", None, None, None), 0, 3, None, [1.0, 1.0, 1.0, 1.0])
    series, counts_b, vals_b = values.merge_encoded(4, [a.encode(), b.encode()])
    back = values.Block.decode(4, series, counts_b, vals_b)
    assert back.totals[("vllm", "m", "i", "s")] == [2, 1, 10, 1, 25, 2]
    assert back.series[("vllm", "m", "i", "s")] == [[0.25, 0.5], [0.3], [2.0], [0.1]]
    assert back.series[("sglang", None, None, None)] == [[1.0]] * 4
