"""Compare the shape of two expositions: family names, types and label-name sets (values aside)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Schema = dict[str, tuple[str, frozenset[frozenset[str]]]]


def schema(text: str, ignore_families: frozenset[str] = frozenset()) -> Schema:
    """family -> (type, the set of label-name sets of its samples, ``le``/``quantile`` excluded)."""
    out: dict[str, tuple[str, set[frozenset[str]]]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in ignore_families:
            continue
        _kind, sets = out.setdefault(fam.name, (fam.type, set()))
        for s in fam.samples:
            sets.add(frozenset(k for k in s.labels if k not in ("le", "quantile")))
    return {name: (kind, frozenset(sets)) for name, (kind, sets) in out.items()}


def diff(expected: Schema, actual: Schema) -> list[str]:
    """Human-readable differences (empty when the shapes match)."""
    problems = []
    for name in sorted(expected.keys() - actual.keys()):
        problems.append(f"missing family {name} ({expected[name][0]})")
    for name in sorted(actual.keys() - expected.keys()):
        problems.append(f"extra family {name} ({actual[name][0]})")
    for name in sorted(expected.keys() & actual.keys()):
        (ek, el), (ak, al) = expected[name], actual[name]
        if ek != ak:
            problems.append(f"{name}: type {ak}, expected {ek}")
        if el != al:
            problems.append(f"{name}: label sets {sorted(map(sorted, al))}, expected {sorted(map(sorted, el))}")
    return problems
