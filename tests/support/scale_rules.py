"""The rules of ``tests/test_scale_metrics.py``, read from rules.yml, and what its tests compare: the recordings
of Prometheus and vmalert (with the tolerances its module docstring explains), the burn-rate alerts the fleet
must fire."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import BURN_PAIRS, SLOFile, burn_factor
from inferwatch.stack import EXPORTERS_JOB
from tests.support.scale_fleet import EXACT_MODELS, FLEET, HISTORY_S, MODELS, RULES, Key, alert_key, label_text
from tests.support.victoria import labelled_values, query

FAST_GROUP_S = 30.0
"""Rule groups evaluated at least this often must have produced every recording."""
EXACT_TOLERANCE = 1e-5
FORWARDING_TOLERANCE = 1e-9
CHAINED_TOLERANCE = 1e-3
MIXED_TOLERANCE = 0.01
RATE_TOLERANCE = 0.01


# --- the rules, read from rules.yml ---------------------------------------------------------------
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    return sum(int(n) * SECONDS[unit] for n, unit in DURATION.findall(duration))


@dataclass(frozen=True)
class Recording:
    name: str
    labels: Key
    expr: str
    group: str
    interval_s: float
    """of its group (the evaluation interval, 1 s here, when the group has none)."""
    depth: int = 0
    """how many recordings of its own group it is built on, one on top of the other (0: none)."""

    def owns(self, key: Key) -> bool:
        labels = dict(key)
        return labels.get("__name__") == self.name and all(labels.get(k) == v for k, v in self.labels)

    @property
    def kind(self) -> str:
        """``ratio`` (scale-free: the operation part of the name says so), ``rate`` (has a range), or ``constant``."""
        if "ratio" in self.name.rsplit(":", 1)[-1]:
            return "ratio"
        return "rate" if self.windows else "constant"

    @property
    def windows(self) -> list[float]:
        return [seconds(w) for w in re.findall(r"\[([0-9smhdwy]+)\]", self.expr)]

    @property
    def label(self) -> str:
        return self.name + label_text(dict(self.labels))


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def recordings_of_rules() -> list[Recording]:
    """Every recording rule of rules.yml, with its depth: vmalert reads a rule's inputs from the
    datasource, where the recordings of the same evaluation have not arrived yet, so a recording
    built on another of its group gets a value one evaluation later (Prometheus: the same one)."""
    out = []
    for g in rule_groups():
        depths: dict[str, int] = {}
        for r in (r for r in g["rules"] if "record" in r):
            inputs = [d for name, d in depths.items() if re.search(re.escape(name) + r"(?![\w:])", r["expr"])]
            labels = tuple(sorted(r.get("labels", {}).items()))
            depth = 1 + max(inputs) if inputs else 0
            out.append(Recording(r["record"], labels, r["expr"], g["name"], seconds(g.get("interval", "1s")), depth))
            depths[r["record"]] = max(depth, depths.get(r["record"], 0))
    return out


def recording_of(key: Key, rules: list[Recording]) -> Recording:
    return next(r for r in rules if r.owns(key))


def fast(rules: list[Recording]) -> list[Recording]:
    """The recordings of groups evaluated at least every ``FAST_GROUP_S``."""
    return [r for r in rules if r.interval_s <= FAST_GROUP_S]


def recordings_timeout(rules: list[Recording]) -> float:
    """How long vmalert may take to record all of ``fast(rules)``: its first evaluation of a group
    comes up to one interval after it starts, then one more evaluation per level of depth."""
    return max((r.depth + 2) * r.interval_s for r in fast(rules)) + 15.0


# --- what the tests compare ----------------------------------------------------------------------
def exporter_series(base: str) -> dict[Key, float]:
    """Per instance of the exporters' job, how many series it has (without the scrapers' ``up``/``scrape_*``)."""
    expr = f'count by (instance) ({{job="{EXPORTERS_JOB}", __name__!~"up|scrape_.+"}})'
    return labelled_values(query(base, expr))


Samples = dict[Key, list[tuple[float, float]]]


def recorded(base: str, at: float, rules: list[Recording], window: str = "2m") -> Samples:
    """The raw samples of every recording of ``rules`` in the ``window`` up to ``at``."""
    names = sorted({r.name for r in rules})
    selector = '{__name__=~"' + "|".join(re.escape(n) for n in names) + '"}[' + window + "]"
    r = httpx.get(f"{base}/api/v1/query", params={"query": selector, "time": f"{at:.3f}"}, timeout=30)
    body = r.json()
    assert body.get("status") == "success", body
    return {
        tuple(sorted(s["metric"].items())): [(float(t), float(v)) for t, v in s["values"]]
        for s in body["data"]["result"]
    }


def incomplete(samples: Samples, rules: list[Recording], fresh_after: float) -> list[str]:
    """Why ``samples`` lack a recording of ``rules`` (for every model where it is per model) from an
    evaluation after ``fresh_after``: nothing when they are complete."""
    models: dict[Recording, set[str | None]] = {}
    stale = []
    for key, values in samples.items():
        rule = recording_of(key, rules)
        if values[-1][0] < fresh_after:
            stale.append(f"{dict(key)} evaluated {fresh_after - values[-1][0]:.1f} s too early")
        models.setdefault(rule, set()).add(dict(key).get(V.LABEL_MODEL))
    missing = [f"no {r.label}" for r in rules if r not in models]
    partial = [f"{r.label} for {sorted(map(str, m))}" for r, m in models.items() if m not in ({None}, set(MODELS))]
    return missing + partial + stale


def lag_by_depth(samples: Samples, rules: list[Recording]) -> dict[str, float]:
    """Per depth, how long after the first recording of its group a recording first had a value."""
    first: dict[Key, float] = {key: values[0][0] for key, values in samples.items()}
    start: dict[str, float] = {}
    for key, t in first.items():
        rule = recording_of(key, rules)
        if rule.depth == 0:
            start[rule.group] = min(t, start.get(rule.group, t))
    out: dict[str, float] = {}
    for key, t in first.items():
        rule = recording_of(key, rules)
        if rule.group in start and rule.interval_s <= FAST_GROUP_S:
            out[str(rule.depth)] = round(max(t - start[rule.group], out.get(str(rule.depth), 0.0)), 1)
    return dict(sorted(out.items()))


def relative(a: float, b: float) -> float:
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


def tolerance(rule: Recording, model: str | None) -> float | None:
    """The relative tolerance for ``rule`` on ``model`` (see the docstring of ``tests/test_scale_metrics.py``);
    None: not comparable."""
    if rule.kind == "rate":
        return RATE_TOLERANCE if max(rule.windows) <= HISTORY_S - 30 else None
    if model is not None and model not in EXACT_MODELS:
        return MIXED_TOLERANCE
    return CHAINED_TOLERANCE if rule.depth else EXACT_TOLERANCE


def expected_alerts(spec: SLOFile) -> set[Key]:
    """The burn-rate alerts the fleet must fire: per burn rule of rules.yml, each model all of whose
    replicas burn that SLO's budget faster than the rule's factor."""
    slos = {s.name: s for s in spec.slos}
    pairs = {(p.long, p.short): p for p in BURN_PAIRS}
    out = set()
    for rule in (r for g in rule_groups() for r in g["rules"] if r.get("alert") == V.ALERT_SLO_BURN):
        labels = rule["labels"]
        slo = slos[labels[V.SLO_LABEL]]
        factor = float(burn_factor(pairs[(labels[V.LONG_WINDOW_LABEL], labels[V.SHORT_WINDOW_LABEL])], slo))
        for model in MODELS:
            burns = [r.latency_burn if slo.indicator.latency else r.error_burn for r in FLEET if r.model == model]
            assert min(burns) > factor or max(burns) < factor, (slo.name, model, factor)  # no borderline case
            if min(burns) > factor:
                out.add(alert_key({"alertname": rule["alert"], **labels, V.LABEL_MODEL: model}))
    return out


def firing(url: str) -> dict[Key, dict[str, Any]]:
    """The firing alerts of a Prometheus or vmalert rules API."""
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return {alert_key(a["labels"]): a for a in alerts if a["state"] == "firing"}


def parse_time(text: str) -> float:
    """RFC 3339 with up to nanoseconds (Go's format) as epoch seconds."""
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()
