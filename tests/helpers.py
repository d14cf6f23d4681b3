"""Test helpers: read canonical exposition back with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from inferwatch.core import vocabulary as V

Sample = tuple[str, dict[str, str], float]


def samples(text: str) -> list[Sample]:
    out: list[Sample] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


def le_sets(text: str) -> dict[str, set[str]]:
    """Per histogram family, the set of its ``le`` strings, exactly as exposed."""
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "le" in s.labels:
                out.setdefault(fam.name, set()).add(s.labels["le"])
    return out


def families(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def value(text: str, name: str, **labels: str) -> float:
    """Sum of samples named ``name`` whose labels include ``labels``."""
    total = 0.0
    found = False
    for n, lbls, v in samples(text):
        if n == name and all(lbls.get(k) == val for k, val in labels.items()):
            total += v
            found = True
    if not found:
        raise AssertionError(f"no sample {name}{labels} in output")
    return total


def has(text: str, name: str, **labels: str) -> bool:
    return any(n == name and all(lb.get(k) == v for k, v in labels.items()) for n, lb, _ in samples(text))


def bucket(spec: V.MetricSpec, le: float, text: str, **labels: str) -> float:
    return value(text, spec.name + "_bucket", le=V.format_le(le), **labels)


def strip_duration(text: str) -> str:
    """Drop the non-deterministic scrape-duration samples (node_exporter's skip_re idea)."""
    name = V.EXPORTER_SCRAPE_DURATION.name
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith(name + "{")) + "\n"
