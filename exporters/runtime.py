"""The exporter as it runs: scrape each target when Prometheus scrapes us, translate, add health.

A :class:`TargetScraper` owns one engine target. It resolves the engine (configured, or detected
from the payload) and opens the engine's session for the target, which fetches the payload with an
injected ``httpx.Client`` (and polls between scrapes when the engine needs it). It reads the
engine's info endpoint for facts that are not in its metrics, and returns a canonical
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
from urllib.parse import urlsplit, urlunsplit

import httpx

from inferwatch.core import vocabulary as V
from inferwatch.exporters.config import AUTO, TargetConfig
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.mapping import EngineAdapter, EngineFacts, EngineSession, ScrapeError, TranslateContext
from inferwatch.exporters.model import Snapshot, merge_snapshots, series_key
from inferwatch.exporters.textparse import ParseError, looks_like_text_exposition

log = logging.getLogger("inferwatch.exporter")

FACTS_REFRESH_SECONDS = 300.0
DETECT_PATH = "/metrics"
"""what a base URL is scraped at while its engine is not known yet."""
UNDETECTED_POLL_SECONDS = 1.0
"""how often a target whose engine is not known yet asks whether it needs background polls."""


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
    """Scrapes one engine target; thread-safe (one scrape at a time, polls beside it)."""

    target: TargetConfig
    registry: EngineRegistry
    vocabulary: V.Vocabulary
    client: httpx.Client
    clock: Callable[[], float] = time.monotonic
    session: EngineSession | None = None
    """the engine's session for this target; ``None`` until an ``auto`` target's engine is detected."""
    facts: EngineFacts = field(default_factory=EngineFacts)
    _facts_at: float = -1e18
    _last_error: str | None = None
    _ever_ok: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.target.engine != AUTO:
            adapter = self.registry.get(self.target.engine)
            self.session = adapter.open(self.target.options_for(adapter))
        self.base, self.path = _split(self.target.url)

    @property
    def adapter(self) -> EngineAdapter | None:
        return self.session.adapter if self.session is not None else None

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

    def _fetch(self, path: str, *, allow_404: bool = False) -> str:
        """GET ``path`` of the target's base URL (the :class:`~inferwatch.exporters.mapping.Fetch` sessions use)."""
        return self._get(self.base + path, allow_404=allow_404)

    def _refresh_facts(self, adapter: EngineAdapter) -> None:
        if adapter.info_path is None or adapter.parse_info is None:
            return
        now = self.clock()
        if now - self._facts_at < FACTS_REFRESH_SECONDS and self.facts != EngineFacts():
            return
        self._facts_at = now
        try:
            body = json.loads(self._fetch(adapter.info_path))
        except (ScrapeError, ValueError) as exc:
            log.debug("target %s: no engine facts from %s: %s", self.target.label, adapter.info_path, exc)
            return
        self.facts = adapter.parse_info(body)

    # -- one scrape -------------------------------------------------------------------------
    def _payload(self) -> tuple[EngineSession | None, str]:
        session = self.session
        if session is not None:
            text = session.fetch(self._fetch, self.path)
        else:
            body = self._fetch(self.path or DETECT_PATH)
            adapter = self.registry.detect(body)
            if adapter is None and not body.strip():
                adapter = self.registry.detect_empty(self._fetch)
            if adapter is None:
                # Reachable, but nothing tells which engine (e.g. an empty body).
                self._check_text(self.path or DETECT_PATH, body)
                return None, body
            log.info("target %s: detected engine %s", self.target.label, adapter.name)
            session = self.session = adapter.open(self.target.options_for(adapter))
            text = session.fetch(self._fetch, self.path, body)
        self._check_text(self.path or session.adapter.default_path, text)
        return session, text

    def _check_text(self, path: str, body: str) -> None:
        if body.strip() and not looks_like_text_exposition(body):
            raise ScrapeError(f"{self.base + path} did not return Prometheus text (starts {body[:40]!r})")

    def poll_interval(self) -> float | None:
        """Seconds until the next background :meth:`poll`; ``None`` when the target needs none."""
        if self.session is None:
            return UNDETECTED_POLL_SECONDS
        return self.session.poll_interval

    def poll(self) -> None:
        """The session's work between scrapes (errors are not fatal)."""
        session = self.session
        if session is None:
            return
        try:
            session.poll(self._fetch)
        except ScrapeError as exc:
            log.debug("target %s: background poll failed: %s", self.target.label, exc)

    def scrape(self) -> Snapshot:
        """Scrape, translate and add health series. Never raises for engine trouble."""
        with self._lock:
            start = self.clock()
            try:
                session, body = self._payload()
                if session is None:
                    # Reachable, but nothing tells which engine (e.g. an empty body): up, no series.
                    self._state_ok()
                    return health_snapshot(
                        self.target.label, V.UNKNOWN, self.target.labels, True, self.clock() - start, 0
                    )
                adapter = session.adapter
                self._refresh_facts(adapter)
                snap = session.translate(body, self._context(adapter))
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
        return TranslateContext(
            engine=adapter.name,
            vocabulary=self.vocabulary,
            model_override=self.target.model,
            extra_labels=self.target.labels,
            facts=self.facts,
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
