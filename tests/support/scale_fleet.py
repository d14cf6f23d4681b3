"""The deterministic fleet of ``tests/test_scale_metrics.py`` (its pages, their history), the processes' helpers
(waiting, alerts arriving at Alertmanager, vmagent's targets) and ``Scale``, what its module-scoped fixture
started. The module's docstring explains the design."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from inferwatch.core import vocabulary as V
from inferwatch.core.slo import SLO, SLOFile
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import Row
from inferwatch.stack import EXPORTERS_JOB
from tests.conftest import ROOT
from tests.support.httpserver import serving as serving_http
from tests.support.sink import Sink
from tests.support.stack import Processes
from tests.support.victoria import VMALERT, query

T = TypeVar("T")
Key = tuple[tuple[str, str], ...]
"""A series or an alert: its sorted label pairs (``__name__`` included for a series)."""

RULES = ROOT / "inferwatch" / "alerts" / "generated" / "rules.yml"
SLO_FILE = ROOT / "inferwatch" / "alerts" / "slos.yaml"
"""The SLO file ``alerts/generated/`` is generated from."""
SCRAPERS = 3
SHARD_LABEL = "vmagent_member"
"""Added by each vmagent to what it sends (``-remoteWrite.label``): who scraped a target."""
CANONICAL = "canonical"
ENGINE_UPTIME_S = 900.0
"""The counters start as if every engine had been serving for a quarter of an hour."""
HISTORY_S = 360
"""Seconds of history written into both stores (> the 5-minute rate window)."""
ROUTE_TIMINGS = {
    "group_wait": "1s",
    "group_interval": "1s",
    "repeat_interval": "1h",
    "page_repeat_interval": "1h",
    "ticket_repeat_interval": "1h",
}
WEBHOOK_PATH = "/hook"
READY_TIMEOUT_S = 30.0
ARTIFACTS_ENV = "INFERWATCH_TEST_ARTIFACTS"


# --- the deterministic fleet -----------------------------------------------------------------------
@dataclass(frozen=True)
class Replica:
    """One engine replica: ``rate`` requests/s; per SLO, the share of bad requests is ``burn`` x its budget."""

    name: str
    model: str
    rate: float
    latency_burn: float
    error_burn: float
    dialect: str = CANONICAL
    """``canonical``: the target serves the canonical exposition itself; an engine (``vllm``): the
    target is a real inferwatch exporter scraping a synthetic page in that engine's dialect."""


FLEET: tuple[Replica, ...] = (
    *(Replica(f"chat-{i}", "chat", rate, 0.4, 0.5) for i, rate in enumerate((2.0, 3.0, 5.0, 8.0))),
    *(Replica(f"code-{i}", "code", rate, 0.7, 0.2, V.ENGINE_VLLM) for i, rate in enumerate((4.0, 6.0))),
    *(Replica(f"burning-{i}", "burning", rate, 0.3, 20.0) for i, rate in enumerate((3.0, 5.0))),
    Replica("mixed-0", "mixed", 2.0, 0.15, 0.75),
    Replica("mixed-1", "mixed", 4.0, 0.25, 0.5),
    Replica("mixed-2", "mixed", 6.0, 0.2, 0.6),
)
EXACT_MODELS = frozenset({"chat", "code", "burning"})
MODELS = frozenset(r.model for r in FLEET)


def share(replica: Replica, slo: SLO) -> float:
    """The fraction of ``replica``'s requests that are bad for ``slo``."""
    burn = replica.latency_burn if slo.indicator.latency else replica.error_burn
    return burn * float(slo.error_budget)


def cumulative(bounds: tuple[float, ...], anchors: dict[float, float]) -> list[float]:
    """Cumulative shares for ``bounds`` + ``+Inf``: exactly ``anchors[b]`` at each anchored boundary
    (the SLO thresholds), 1 at ``+Inf``, strictly increasing in between (linear in the bucket index)."""
    known = {-1: 0.0, len(bounds): 1.0}
    known.update({bounds.index(b): v for b, v in anchors.items()})
    points = sorted(known.items())
    out = []
    for i in range(len(bounds) + 1):
        (i0, v0), (i1, v1) = next((a, b) for a, b in itertools.pairwise(points) if a[0] <= i <= b[0])
        out.append(v0 + (v1 - v0) * (i - i0) / (i1 - i0))
    return out


Dialect = Callable[[V.MetricSpec, dict[str, str]], tuple[str, dict[str, str]] | None]


def canonical_dialect(spec: V.MetricSpec, labels: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    return spec.name, labels


def engine_dialect(engine: str) -> Dialect:
    """Canonical series spelled as ``engine`` exposes them, from its adapter's mapping rows (the
    first source name of each row; canonical labels and values mapped back to the engine's own)."""
    rows: dict[V.MetricSpec, Row] = {}
    for row in builtin_registry().get(engine).rows:
        rows.setdefault(row.metric, row)

    def spell(spec: V.MetricSpec, labels: dict[str, str]) -> tuple[str, dict[str, str]] | None:
        row = rows.get(spec)
        if row is None:
            return None
        source = {canonical: raw for raw, canonical in row.labels.items()}
        out = {}
        for label, value in labels.items():
            raw = V.LABEL_LE if label == V.LABEL_LE else source.get(label)
            if raw is None:
                continue  # a label the exporter adds itself (engine)
            values = row.values.get(raw)
            out[raw] = next(r for r, c in values.items() if c == value) if values else value
        return row.sources[0], out

    return spell


def label_text(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def exposition(replica: Replica, spec: SLOFile, vocabulary: V.Vocabulary, dialect: Dialect, n: float) -> str:
    """The page of ``replica`` after ``n`` requests."""
    base = {V.LABEL_ENGINE: V.ENGINE_VLLM, V.LABEL_MODEL: replica.model, V.LABEL_DP_RANK: "0"}
    out: list[str] = []

    def family(metric: V.MetricSpec, samples: list[tuple[str, dict[str, str], float]]) -> None:
        spelled = [(dialect(metric, {**base, **extra}), suffix, value) for suffix, extra, value in samples]
        first = spelled[0][0]
        if first is None:
            return
        out.append(f"# TYPE {first[0]} {metric.kind.value}")
        for named, suffix, value in spelled:
            assert named is not None
            out.append(f"{named[0]}{suffix}{label_text(named[1])} {V.format_value(value)}")

    thresholds: dict[str, dict[float, float]] = {}
    errors = 0.0
    for slo in spec.slos:
        if slo.indicator.latency:
            lat = slo.indicator.latency
            thresholds.setdefault(lat.metric, {})[lat.threshold_seconds] = 1 - share(replica, slo)
        else:
            errors = share(replica, slo)
    for key, anchors in thresholds.items():
        metric = V.metric_by_key(key)
        cdf = cumulative(vocabulary.buckets(metric), anchors)
        samples = [
            ("_bucket", {V.LABEL_LE: le}, n * c) for le, c in zip(vocabulary.le_strings(metric), cdf, strict=True)
        ]
        samples += [("_sum", {}, n * min(anchors) / 2), ("_count", {}, n)]
        family(metric, samples)
    family(
        V.REQUESTS,
        [
            ("", {V.LABEL_OUTCOME: V.OUTCOME_STOP}, n * (1 - errors)),
            ("", {V.LABEL_OUTCOME: V.OUTCOME_ERROR}, n * errors),
        ],
    )
    family(V.PROMPT_TOKENS, [("", {}, 200 * n)])
    family(V.GENERATION_TOKENS, [("", {}, 100 * n)])
    family(V.PREEMPTIONS, [("", {}, 0.0)])
    family(V.REQUESTS_RUNNING, [("", {}, 4.0)])
    family(V.REQUESTS_WAITING, [("", {}, 0.0)])
    family(V.KV_CACHE_USAGE, [("", {}, 0.5)])
    if dialect is canonical_dialect:  # what an exporter says about itself
        out.append(f"# TYPE {V.EXPORTER_UP.name} gauge")
        up = {V.LABEL_TARGET: replica.name, V.LABEL_ENGINE: V.ENGINE_VLLM}
        out.append(f"{V.EXPORTER_UP.name}{label_text(up)} 1.0")
    return "\n".join(out) + "\n"


SAMPLE = re.compile(r"^([^{\s]+)\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def history(
    targets: dict[str, Replica],
    spec: SLOFile,
    vocabulary: V.Vocabulary,
    t0: float,
    times: list[float],
    extra: Callable[[str], dict[str, str]],
    openmetrics: bool,
) -> str:
    """Every engine sample of every target at ``times`` (counters and histograms growing as served,
    gauges as they stand), labelled as its scraper stores them (``job``, ``instance`` and
    ``extra(instance)``): OpenMetrics (seconds) for promtool, else the Prometheus text format with
    milliseconds for VictoriaMetrics. All of them, not only what the SLOs read: a rule dividing a
    series with history by one without (the headroom rules' sums by their counts) would differ between
    Prometheus (whose rate of a young series is scaled by the part of the window it covers) and
    VictoriaMetrics until the live samples fill its window."""
    out: list[str] = []
    for address, replica in targets.items():
        page = exposition(replica, spec, vocabulary, canonical_dialect, 1.0)  # values per request served
        kinds: dict[str, str] = {}
        for line in page.splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split(" ")
                kinds[family] = kind
                continue
            m = SAMPLE.match(line)
            if not m:
                continue
            name, per_request = m.group(1), float(m.group(3))
            if name == V.EXPORTER_UP.name:
                continue  # the exporter's word about itself, not the engine's
            labels = dict(LABEL.findall(m.group(2)))
            gauge = kinds.get(name) == V.Kind.GAUGE.value
            series = name + label_text({"job": EXPORTERS_JOB, "instance": address, **extra(address), **labels})
            for t in times:
                value = V.format_value(per_request if gauge else per_request * replica.rate * (t - t0))
                out.append(f"{series} {value} {t:.3f}" if openmetrics else f"{series} {value} {round(t * 1000)}")
    if openmetrics:
        out.append("# EOF")
    return "\n".join(out) + "\n"


@contextmanager
def serving(render: Callable[[], str]) -> Iterator[str]:
    """``render()`` at ``/metrics`` (and a version at ``/version``) on 127.0.0.1; yields ``host:port``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, kind, status = render().encode(), "text/plain; version=0.0.4; charset=utf-8", 200
            elif path == "/version":
                body, kind, status = b'{"version": "0.0.0+synthetic"}', "application/json", 200
            else:
                body, kind, status = b"not found\n", "text/plain", 404
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a scraper stopping mid-answer
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving_http(Handler) as address:
        yield address


# --- processes ------------------------------------------------------------------------------------
def eventually(check: Callable[[], T | None], timeout: float, what: Callable[[], str], every: float = 0.5) -> T:
    """The first truthy answer of ``check()`` within ``timeout`` seconds; else fail saying ``what()``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except httpx.HTTPError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what()}")
        time.sleep(every)


def alert_key(labels: dict[str, str]) -> Key:
    """An alert's identity across Prometheus and vmalert: its labels without vmalert's ``alertgroup``."""
    return tuple(sorted((k, v) for k, v in labels.items() if k != "alertgroup"))


@dataclass
class Arrivals:
    """When each alert was first seen at Alertmanager, by who sent it (a watcher thread polls its API)."""

    alertmanager: str
    vmalert: str
    seen: dict[tuple[str, Key], tuple[float, dict[str, Any]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def source(self, alert: dict[str, Any]) -> str:
        return VMALERT if str(alert.get("generatorURL", "")).startswith(self.vmalert) else "prometheus"

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                alerts = httpx.get(f"{self.alertmanager}/api/v2/alerts", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                continue
            now = time.time()
            with self.lock:
                for alert in alerts:
                    self.seen.setdefault((self.source(alert), alert_key(alert["labels"])), (now, alert))

    def of(self, source: str) -> dict[Key, tuple[float, dict[str, Any]]]:
        with self.lock:
            return {key: v for (src, key), v in self.seen.items() if src == source}


@dataclass
class Scale:
    procs: Processes
    prometheus: str
    vm_prometheus: str
    """the VictoriaMetrics Prometheus remote-writes to."""
    vm: str
    """the VictoriaMetrics the vmagents and vmalert write to, and vmalert reads."""
    vmagents: list[str]
    vmalert: str
    alertmanager: str
    sink: Sink
    targets: dict[str, Replica]
    """scrape address (``instance``) -> replica."""
    owners: dict[str, str]
    """scrape address -> the vmagent (its number) scraping it, as the vmagents said at start."""
    scraping: float
    """wall-clock time by which every scraper had scraped every target."""
    started: dict[str, float]
    """wall-clock time when Prometheus and vmalert were started."""
    arrivals: Arrivals
    spec: SLOFile
    figures: dict[str, Any]

    def logs(self, *names: str) -> str:
        return "\n".join(f"--- {n} ---\n{self.procs.log(n)}" for n in names)


def vmagent_targets(url: str) -> set[str]:
    active = httpx.get(f"{url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    return {t["labels"]["instance"] for t in active if t["labels"].get("job") == EXPORTERS_JOB}


# --- for the fixture ------------------------------------------------------------------------------
def count_series(base: str, selector: str, at: float) -> int:
    result = query(base, f"count({selector})", at)
    return int(float(result[0]["value"][1])) if result else 0


def shown_command(cmd: list[str], tmp: Path) -> str:
    """A command line as documentation: no paths of this machine."""
    out = []
    for arg in cmd:
        arg = arg.replace(str(tmp) + "/", "").replace(str(ROOT) + "/", "")
        out.append(os.path.basename(arg) if arg.startswith("/") else arg)
    return " ".join(out)


def keep_figures(figures: dict[str, Any]) -> None:
    text = json.dumps(figures, indent=2, sort_keys=True)
    print(f"\nscale-metrics figures:\n{text}")
    artifacts = os.environ.get(ARTIFACTS_ENV)
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        (Path(artifacts) / "scale-metrics.json").write_text(text + "\n")
