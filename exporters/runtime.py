"""The exporter as it runs: scrape each target when Prometheus scrapes us, translate, add health.

A :class:`TargetScraper` owns one engine target. It resolves the engine (configured, or detected
from the payload), fetches ``/metrics`` with an injected ``httpx.Client``, reads the engine's
``/info``-style endpoint for facts that are not in its metrics, and returns a canonical
:class:`~inferwatch.exporters.model.Snapshot` with the exporter-health series. A failed scrape yields only
health series (``EXPORTER_UP`` is 0): no stale canonical series are served. Errors are logged once
per change of state.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from inferwatch.core import vocabulary as V
from inferwatch.core.config import TargetConfig
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import tgi as tgi_engine
from inferwatch.exporters.engines import trtllm as trtllm_engine
from inferwatch.exporters.mapping import EngineAdapter, EngineFacts, TranslateContext, translate_text
from inferwatch.exporters.model import Snapshot, merge_snapshots, series_key
from inferwatch.exporters.textparse import ParseError, looks_like_text_exposition

log = logging.getLogger("inferwatch.exporter")

FACTS_REFRESH_SECONDS = 300.0


class ScrapeError(Exception):
    """The engine could not be scraped (down, slow, HTTP error, garbage)."""


def _split(url: str) -> tuple[str, str]:
    """``http://h:1/metrics`` -> (``http://h:1``, ``/metrics``); bare base URLs give path ``""``."""
    parts = urlsplit(url)
    base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    path = parts.path.rstrip("/")
    return base, path


def health_snapshot(
    target: str,
    engine: str,
    extra: dict[str, str],
    up: bool,
    duration: float,
    unmapped: int | None = None,
    histograms: dict[V.MetricSpec, bool] | None = None,
) -> Snapshot:
    """The exporter-health series of one target."""
    snap = Snapshot()
    base = {V.LABEL_ENGINE: engine, V.LABEL_TARGET: target}
    key = series_key(base, extra)
    snap.set_value(V.EXPORTER_UP, key, 1.0 if up else 0.0)
    snap.set_value(V.EXPORTER_SCRAPE_DURATION, key, duration)
    if unmapped is not None:
        snap.set_value(V.EXPORTER_UNMAPPED_FAMILIES, key, float(unmapped))
    for spec, inexact in (histograms or {}).items():
        snap.set_value(
            V.EXPORTER_INEXACT_BUCKETS,
            series_key({**base, V.LABEL_METRIC: spec.name}, extra),
            1.0 if inexact else 0.0,
        )
    return snap


def with_health(snap: Snapshot, target: str, engine: str, extra: dict[str, str], duration: float) -> Snapshot:
    """``snap`` plus health series for a successful translation."""
    histos = {spec: spec in snap.inexact for spec in snap.histograms if snap.histograms[spec]}
    health = health_snapshot(target, engine, extra, True, duration, len(snap.unmapped), histos)
    return merge_snapshots([snap, health])


@dataclass
class TargetScraper:
    """Scrapes one engine target; thread-safe (one scrape at a time)."""

    target: TargetConfig
    registry: EngineRegistry
    vocabulary: V.Vocabulary
    client: httpx.Client
    clock: Callable[[], float] = time.monotonic
    adapter: EngineAdapter | None = None
    facts: EngineFacts = field(default_factory=EngineFacts)
    accumulator: trtllm_engine.IterationStatsAccumulator = field(
        default_factory=trtllm_engine.IterationStatsAccumulator
    )
    _facts_at: float = -1e18
    _last_error: str | None = None
    _ever_ok: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.target.engine != "auto":
            self.adapter = self.registry.get(self.target.engine)
        self.base, self.path = _split(self.target.url)

    @property
    def engine_label(self) -> str:
        return self.adapter.name if self.adapter else V.UNKNOWN

    # -- fetching ---------------------------------------------------------------------------
    def _get(self, url: str, *, allow_404: bool = False) -> str:
        try:
            resp = self.client.get(url, timeout=self.target.timeout_seconds)
        except httpx.TimeoutException:
            raise ScrapeError(f"timed out after {self.target.timeout_seconds:g}s fetching {url}") from None
        except httpx.HTTPError as exc:
            raise ScrapeError(f"cannot fetch {url}: {exc.__class__.__name__}: {exc}") from None
        if allow_404 and resp.status_code == 404:
            return ""
        if resp.status_code != 200:
            raise ScrapeError(f"{url} answered HTTP {resp.status_code}")
        return resp.text

    def _metrics_url(self) -> str:
        if self.path:
            return self.base + self.path
        if self.adapter is not None:
            return self.base + self.adapter.default_path
        return self.base + "/metrics"

    def _refresh_facts(self, adapter: EngineAdapter) -> None:
        if adapter.info_path is None or adapter.parse_info is None:
            return
        now = self.clock()
        if now - self._facts_at < FACTS_REFRESH_SECONDS and self.facts != EngineFacts():
            return
        self._facts_at = now
        try:
            body = json.loads(self._get(self.base + adapter.info_path))
        except (ScrapeError, ValueError) as exc:
            log.debug("target %s: no engine facts from %s: %s", self.target.label, adapter.info_path, exc)
            return
        self.facts = adapter.parse_info(body)

    def _detect_empty(self) -> EngineAdapter | None:
        """An empty body is what TGI serves before its first request: confirm with ``/info``."""
        try:
            body = json.loads(self._get(self.base + (tgi_engine.ADAPTER.info_path or "/info")))
        except (ScrapeError, ValueError):
            return None
        if isinstance(body, dict) and ("model_id" in body or body.get("router") == "text-generation-router"):
            return self.registry.get(tgi_engine.ADAPTER.name)
        return None

    # -- one scrape -------------------------------------------------------------------------
    def _payload(self) -> tuple[EngineAdapter | None, str]:
        url = self._metrics_url()
        # trtllm-serve mounts /prometheus/metrics only with return_perf_metrics; its JSON still works.
        optional = self.adapter is trtllm_engine.ADAPTER and not self.path
        body = self._get(url, allow_404=optional)
        adapter = self.adapter
        if adapter is None:
            adapter = self.registry.detect(body)
            if adapter is None and not body.strip():
                adapter = self._detect_empty()
            if adapter is not None:
                log.info("target %s: detected engine %s", self.target.label, adapter.name)
                self.adapter = adapter
        if adapter is not None and adapter.name == trtllm_engine.ADAPTER.name:
            return adapter, self._trtllm_payload(url, body)
        if body.strip() and not looks_like_text_exposition(body):
            raise ScrapeError(f"{url} did not return Prometheus text (starts {body[:40]!r})")
        return adapter, body

    def _trtllm_payload(self, url: str, body: str) -> str:
        """trtllm-serve: JSON stats at ``/metrics`` (destructive read), Prometheus text beside it."""
        if body.lstrip()[:1] in ("[", "{"):
            self._feed_json(body)
            if self.path in ("", trtllm_engine.JSON_PATH):
                return self._get(self.base + trtllm_engine.ADAPTER.default_path, allow_404=True)
            return ""
        if not self.path or self.path == trtllm_engine.ADAPTER.default_path:
            self.poll_json()
        return body

    def _feed_json(self, body: str) -> None:
        try:
            stats = json.loads(body)
        except ValueError as exc:
            raise ScrapeError(f"trtllm-serve JSON stats are not valid JSON: {exc}") from None
        self.accumulator.feed(stats if isinstance(stats, list) else [stats])

    def poll_json(self) -> None:
        """Drain trtllm-serve's JSON iteration stats into the accumulator (errors are not fatal)."""
        try:
            body = self._get(self.base + trtllm_engine.JSON_PATH, allow_404=True)
            if body.lstrip()[:1] in ("[", "{"):
                self._feed_json(body)
        except ScrapeError as exc:
            log.debug("target %s: JSON stats poll failed: %s", self.target.label, exc)

    def scrape(self) -> Snapshot:
        """Scrape, translate and add health series. Never raises for engine trouble."""
        with self._lock:
            start = self.clock()
            try:
                adapter, body = self._payload()
                if adapter is None:
                    # Reachable, but nothing tells which engine (e.g. an empty body): up, no series.
                    self._state_ok()
                    return health_snapshot(
                        self.target.label, V.UNKNOWN, self.target.labels, True, self.clock() - start, 0
                    )
                self._refresh_facts(adapter)
                ctx = self._context(adapter)
                snap = translate_text(adapter, body, ctx)
            except (ScrapeError, ParseError) as exc:
                self._state_error(str(exc))
                return self._down(start)
            except Exception as exc:  # a bug of ours must not take the exporter (or other targets) down
                if self._last_error != f"internal: {exc!r}":
                    log.exception("target %s: translation failed", self.target.label)
                self._last_error = f"internal: {exc!r}"
                return self._down(start)
            self._state_ok()
            if snap.unmapped:
                log.debug("target %s: unmapped families: %s", self.target.label, ", ".join(snap.unmapped))
            return with_health(snap, self.target.label, adapter.name, self.target.labels, self.clock() - start)

    def _down(self, start: float) -> Snapshot:
        return health_snapshot(self.target.label, self.engine_label, self.target.labels, False, self.clock() - start)

    def _context(self, adapter: EngineAdapter) -> TranslateContext:
        options: dict[str, Any] = {}
        if self.target.max_batch_total_tokens:
            options[tgi_engine.OPTION_MAX_BATCH_TOTAL_TOKENS] = self.target.max_batch_total_tokens
        return TranslateContext(
            engine=adapter.name,
            vocabulary=self.vocabulary,
            model_override=self.target.model,
            extra_labels=self.target.labels,
            facts=self.facts,
            options=options,
            state=self.accumulator if adapter.name == trtllm_engine.ADAPTER.name else None,
        )

    def _state_error(self, message: str) -> None:
        if message != self._last_error:
            log.warning("target %s: scrape failed: %s", self.target.label, message)
        self._last_error = message

    def _state_ok(self) -> None:
        if self._last_error is not None:
            log.warning("target %s: scrape recovered", self.target.label)
        elif not self._ever_ok:
            log.info("target %s: first scrape succeeded", self.target.label)
        self._last_error = None
        self._ever_ok = True
