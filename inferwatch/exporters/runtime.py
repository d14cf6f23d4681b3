"""The exporter as it runs: scrape each target when Prometheus scrapes us, translate, add health.

A :class:`TargetScraper` owns one engine target. It resolves the engine (configured, or detected
from the payload) and opens the engine's session for the target, which fetches the payload with an
injected ``httpx.Client`` (and polls between scrapes when the engine needs it). It reads the
engine's info endpoint for facts that are not in its metrics, and returns a canonical
:class:`~inferwatch.exporters.samples.Snapshot` with the exporter-health series. A failed scrape yields only
health series (``EXPORTER_UP`` is 0, ``EXPORTER_LAST_SCRAPE_ERROR`` says why): no stale canonical
series are served. Errors are logged once per change of state.

Bounds: everything one scrape asks the engine (metrics, info, the JSON a session polls) shares one
deadline of ``timeout_seconds`` (:mod:`inferwatch.exporters.fetching`). A scrape runs in a thread of
its own (a *flight*); the scrapes of the exporter that arrive while it is in flight share it instead
of queueing behind it, and each waits at most until the flight's deadline: a slow engine costs a
scrape at most its deadline, never more, and never the next scrape. Concurrent scrapes cost the
engine one request: a scrape shares the target's last flight when it *arrived* before that flight
ended, however late a busy exporter gets round to it (:meth:`TargetScraper.begin`). A page is
refused whole (up 0) when its body is over ``max_body_bytes``, it has more than ``max_samples``
sample lines, it is cut mid-line, it repeats a series, or a counter or histogram sample is NaN or
infinite; and a scrape fails (reason ``redirect``) when the engine redirects it where the target's
``follow_redirects`` does not allow (by default: anywhere but the target's own scheme, host and
port).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import httpx

from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError
from inferwatch.exporters import gpus
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.fetching import Connections, EngineRequest, Limits, Watchdog
from inferwatch.exporters.mapping import (
    EngineAdapter,
    EngineFacts,
    EngineSession,
    ScrapeError,
    TranslateContext,
)
from inferwatch.exporters.samples import SeriesKey, Snapshot, check_finite_snapshot, merge_snapshots, series_key
from inferwatch.exporters.targets import AUTO, TargetConfig
from inferwatch.exporters.textparse import ParseError, check_complete, looks_like_text_exposition, too_many_samples

log = logging.getLogger("inferwatch.exporter")

FACTS_REFRESH_SECONDS = 300.0
DETECT_PATH = "/metrics"
"""what a base URL is scraped at while its engine is not known yet."""
UNDETECTED_POLL_SECONDS = 1.0
"""how often a target whose engine is not known yet asks whether it needs background polls."""
_NO_FACTS = EngineFacts()
COLLECT_SLACK_SECONDS = 0.1
"""how long past a flight's deadline a scrape waits for the flight to report its own timeout."""


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
    reason: str | None = None,
) -> Snapshot:
    """The exporter-health series of one target; ``reason`` is why a failed scrape failed."""
    snap = Snapshot()
    base = {V.LABEL_ENGINE: engine, V.LABEL_TARGET: target}
    key = series_key(base, extra)
    snap.set_value(V.EXPORTER_UP, key, 1.0 if up else 0.0)
    snap.set_value(V.EXPORTER_SCRAPE_DURATION, key, duration)
    if reason is not None:
        snap.set_value(V.EXPORTER_LAST_SCRAPE_ERROR, series_key({**base, V.LABEL_REASON: reason}, extra), 1.0)
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
    """``snap`` with the health series of a successful translation added (to ``snap`` itself: a
    translation's snapshot is its own, and copying it whole cost every scrape); the series are
    :func:`health_snapshot`'s, their keys made once per target."""
    items = tuple(extra.items())
    key = _health_key(target, engine, items, None)
    health = {
        V.EXPORTER_UP: {key: 1.0},
        V.EXPORTER_SCRAPE_DURATION: {key: duration},
        V.EXPORTER_UNMAPPED_FAMILIES: {key: float(len(snap.unmapped))},
    }
    inexact = snap.inexact
    buckets = {
        _health_key(target, engine, items, spec.name): 1.0 if spec in inexact else 0.0
        for spec, series in snap.histograms.items()
        if series
    }
    if buckets:
        health[V.EXPORTER_INEXACT_BUCKETS] = buckets
    values = snap.values
    for spec, series in health.items():
        mine = values.get(spec)
        if mine is None:
            values[spec] = series
        else:
            for k, v in series.items():
                snap.add_value(spec, k, v)
    return snap


@functools.lru_cache(maxsize=4096)
def _health_key(target: str, engine: str, extra: tuple[tuple[str, str], ...], metric: str | None) -> SeriesKey:
    base = {V.LABEL_ENGINE: engine, V.LABEL_TARGET: target}
    if metric is not None:
        base[V.LABEL_METRIC] = metric
    return series_key(base, dict(extra))


class Done:
    """A one-way flag that threads can wait for: :class:`threading.Event`'s use here, on one lock (an
    Event builds a Condition, whose cost every scrape paid)."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Whether the flag was set within ``timeout`` seconds."""
        if self._set:
            return True
        if self._lock.acquire(timeout=max(0.0, timeout)):
            self._lock.release()  # the next waiter gets it at once
            return True
        return self._set


@dataclass
class Flight:
    """One scrape of a target in progress, and its result once :attr:`done` is set."""

    request: EngineRequest
    started: float
    done: Done = field(default_factory=Done)
    result: Snapshot | None = None
    ended: float = float("inf")
    """when the result was ready (the scraper's clock); infinite while in flight."""
    here: bool = False
    """run by the first scrape that collects it, in its own thread (no thread of its own)."""
    _claim: threading.Lock = field(default_factory=threading.Lock)

    def claim(self) -> bool:
        """Whether the caller is the one to run this flight (true once, for a flight run ``here``)."""
        return self.here and self._claim.acquire(blocking=False)

    def answers(self, arrived: float) -> bool:
        """Whether this flight answers a scrape that arrived at ``arrived``: it had not ended by then (and is
        within its deadline, or has ended since)."""
        return arrived <= self.ended and (self.done.is_set() or not self.request.deadline.expired())


@dataclass
class TargetScraper:
    """Scrapes one engine target; thread-safe: concurrent scrapes share one flight, polls take turns."""

    target: TargetConfig
    registry: EngineRegistry
    vocabulary: V.Vocabulary
    client: httpx.Client
    clock: Callable[[], float] = time.monotonic
    watchdog: Watchdog = field(default_factory=Watchdog)
    """aborts this target's engine requests at their deadline (an exporter shares one among its targets)."""
    session: EngineSession | None = None
    """the engine's session for this target; ``None`` until an ``auto`` target's engine is detected."""
    facts: EngineFacts = field(default_factory=EngineFacts)
    _facts_at: float = -1e18
    _facts_known: bool = False
    """whether :attr:`facts` says anything (else they are asked for at each scrape)."""
    _last_error: str | None = None
    _ever_ok: bool = False
    _flight: Flight | None = None
    _flight_lock: threading.Lock = field(default_factory=threading.Lock)
    _session_lock: threading.Lock = field(default_factory=threading.Lock)
    """held while the session fetches, polls or translates (its state is not thread-safe)."""
    _state_lock: threading.Lock = field(default_factory=threading.Lock)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    """where ``gpus.pod_from_env`` finds the pod's name and namespace."""
    _gpu_error: str | None = None
    _ctx: TranslateContext | None = None

    def __post_init__(self) -> None:
        if self.target.engine != AUTO:
            adapter = self.registry.get(self.target.engine)
            self.session = adapter.open(self.target.options_for(adapter))
        self.gpu_selection: gpus.GpuSelection | None = None
        src = self.target.gpus
        if src is not None:
            try:
                self.gpu_selection = gpus.selection(
                    src.uuids, src.host, src.indices, src.pod, src.namespace, src.pod_from_env, self.environ
                )
            except gpus.GpuSelectionError as exc:
                raise ConfigError(f"target {self.target.label}: {exc}") from None
        self.base, self.path = _split(self.target.url)
        self.limits = Limits(self.target.timeout_seconds, self.target.max_body_bytes, self.target.follow_redirects)
        self.connections = Connections()
        """this target's engine connections, kept open between scrapes."""

    @property
    def adapter(self) -> EngineAdapter | None:
        return self.session.adapter if self.session is not None else None

    @property
    def engine_label(self) -> str:
        return self.adapter.name if self.adapter else V.UNKNOWN

    # -- fetching ---------------------------------------------------------------------------
    def _request(self) -> EngineRequest:
        return self.watchdog.watch(EngineRequest(self.client, self.base, self.limits, self.connections))

    def _refresh_facts(self, adapter: EngineAdapter, request: EngineRequest) -> None:
        if adapter.info_path is None or adapter.parse_info is None:
            return
        now = self.clock()
        if now - self._facts_at < FACTS_REFRESH_SECONDS and self._facts_known:
            return
        self._facts_at = now
        try:
            # facts are extra: they may take half of what is left of the deadline, never the scrape
            budget = request.deadline.remaining() / 2
            body = json.loads(request.get(self.base + adapter.info_path, budget=budget))
        except (ScrapeError, ValueError) as exc:
            log.debug("target %s: no engine facts from %s: %s", self.target.label, adapter.info_path, exc)
            return
        self.facts = adapter.parse_info(body)
        self._facts_known = self.facts != _NO_FACTS  # (made once here, not compared field by field each scrape)

    # -- one scrape -------------------------------------------------------------------------
    def _payload(self, request: EngineRequest) -> tuple[EngineSession | None, str]:
        fetch = request.fetch
        session = self.session
        if session is not None:
            text = session.fetch(fetch, self.path)
        else:
            body = fetch(self.path or DETECT_PATH)
            adapter = self.registry.detect(body)
            if adapter is None and not body.strip():
                adapter = self.registry.detect_empty(fetch)
            if adapter is None:
                # Reachable, but nothing tells which engine (e.g. an empty body).
                self._check_text(self.path or DETECT_PATH, body)
                return None, body
            log.info("target %s: detected engine %s", self.target.label, adapter.name)
            session = self.session = adapter.open(self.target.options_for(adapter))
            text = session.fetch(fetch, self.path, body)
        self._check_text(self.path or session.adapter.default_path, text)
        return session, text

    def _check_text(self, path: str, body: str) -> None:
        if body.strip() and not looks_like_text_exposition(body):
            raise ScrapeError(f"{self.base + path} did not return Prometheus text (starts {body[:40]!r})")
        check_complete(body)
        if too_many_samples(body, self.target.max_samples):
            raise ScrapeError(
                f"{self.base + path} has more than {self.target.max_samples} sample lines",
                V.SCRAPE_ERROR_TOO_MANY_SAMPLES,
            )

    def poll_interval(self) -> float | None:
        """Seconds until the next background :meth:`poll`; ``None`` when the target needs none."""
        if self.session is None:
            return UNDETECTED_POLL_SECONDS
        return self.session.poll_interval

    def poll_delay(self) -> float | None:
        """Seconds until the next background :meth:`poll` is due; ``None`` when the target needs none."""
        if self.session is None:
            return UNDETECTED_POLL_SECONDS
        return self.session.poll_delay()

    def poll(self) -> None:
        """The session's work between scrapes, under the same deadline as a scrape (errors are not fatal)."""
        session = self.session
        if session is None or (session.poll_delay() or 0.0) > 0.0:
            return  # a scrape did the work since the poll was planned
        request = self._request()
        try:
            if not self._session_lock.acquire(timeout=max(0.0, request.deadline.remaining())):
                return
            try:
                session.poll(request.fetch)
            finally:
                self._session_lock.release()
        except ScrapeError as exc:
            log.debug("target %s: background poll failed: %s", self.target.label, exc)
        finally:
            request.finish()

    def scrape(self) -> Snapshot:
        """Scrape, translate and add health series. Never raises for engine trouble, and returns
        within the target's deadline (plus :data:`COLLECT_SLACK_SECONDS`)."""
        return self.collect(self.begin())

    def begin(self, arrived: float | None = None, *, here: bool = False) -> Flight:
        """The flight that answers a scrape that arrived at ``arrived`` (the scraper's clock; default now):
        the target's last flight, or a new one (started in a thread of its own).

        The coalescing rule: the last flight answers every scrape that arrived before it ended, unless it
        is still in flight past its deadline. A scrape that arrived after it ended starts a new flight,
        however soon after: it never gets a result that was ready before it came. What
        counts is when the scrape arrived, not when the exporter gets here: busy with 100 targets, it
        reached a target up to 2 s after the scrape came, and some flights had ended by then (a second
        request to their engines). The exporter takes the time the request reached the machine
        (:func:`inferwatch.exporters.server.arrived_at`).

        With ``here``, a new flight gets no thread: the first scrape to :meth:`collect` it runs it (a
        thread start and two switches less per scrape; the watchdog still ends its requests at the
        deadline)."""
        now = self.clock()
        arrived = now if arrived is None else min(arrived, now)
        with self._flight_lock:
            flight = self._flight
            if flight is not None and flight.answers(arrived):
                return flight
            flight = self._flight = Flight(self._request(), now, here=here)
        if not here:
            threading.Thread(target=self._fly, args=(flight,), name="target-scrape", daemon=True).start()
        return flight

    def collect(self, flight: Flight) -> Snapshot:
        """``flight``'s result, or a timed-out health snapshot once its deadline has passed."""
        if flight.claim():
            self._fly(flight)
        if flight.done.wait(max(0.0, flight.request.deadline.remaining()) + COLLECT_SLACK_SECONDS):
            assert flight.result is not None
            return flight.result
        flight.request.abort()
        message = f"timed out: no answer within the {self.target.timeout_seconds:g}s deadline of the scrape"
        self._state_error(message, V.SCRAPE_ERROR_TIMEOUT)
        return self._down(flight.started, V.SCRAPE_ERROR_TIMEOUT)

    def _fly(self, flight: Flight) -> None:
        try:
            flight.result = self._scrape_once(flight.request, flight.started)
        finally:
            flight.request.finish()
            flight.ended = self.clock()
            flight.done.set()

    def _scrape_once(self, request: EngineRequest, start: float) -> Snapshot:
        try:
            if not self._session_lock.acquire(timeout=max(0.0, request.deadline.remaining())):
                raise ScrapeError("timed out waiting for the target's previous scrape", V.SCRAPE_ERROR_TIMEOUT)
            try:
                session, body = self._payload(request)
                if session is None:
                    # Reachable, but nothing tells which engine (e.g. an empty body): up, no series.
                    self._state_ok()
                    return health_snapshot(
                        self.target.label, V.UNKNOWN, self.target.labels, True, self.clock() - start, 0
                    )
                adapter = session.adapter
                self._refresh_facts(adapter, request)
                snap = session.translate(body, self._context(adapter))
            finally:
                self._session_lock.release()
            check_finite_snapshot(snap)
        except (ScrapeError, ParseError) as exc:
            self._state_error(str(exc), exc.reason)
            return self._down(start, exc.reason)
        except Exception:  # a bug of ours must not take the exporter (or other targets) down
            with self._state_lock:
                if self._last_error != V.SCRAPE_ERROR_INTERNAL:
                    log.exception("target %s: translation failed", self.target.label)
                self._last_error = V.SCRAPE_ERROR_INTERNAL
            return self._down(start, V.SCRAPE_ERROR_INTERNAL)
        gpu = self._gpus(request, snap, adapter)
        if gpu is not None:
            snap = merge_snapshots([snap, gpu])
        self._state_ok()
        if snap.unmapped and log.isEnabledFor(logging.DEBUG):  # (not joined at each scrape for nothing)
            log.debug("target %s: unmapped families: %s", self.target.label, ", ".join(snap.unmapped))
        return with_health(snap, self.target.label, adapter.name, self.target.labels, self.clock() - start)

    def _gpus(self, request: EngineRequest, snap: Snapshot, adapter: EngineAdapter) -> Snapshot | None:
        """This target's GPUs from its GPU source, labelled as its replica; ``None`` (logged once per
        change) when the source cannot be read: the engine's own series are served regardless."""
        src, chosen = self.target.gpus, self.gpu_selection
        if src is None or chosen is None:
            return None
        models = gpus.models_of(snap)
        model = next(iter(models)) if len(models) == 1 else self._context(adapter).model_for(None)
        try:
            budget = min(src.timeout_seconds, max(0.0, request.deadline.remaining()))
            text = request.get(src.url, budget=budget)
            replica = {V.LABEL_ENGINE: adapter.name, V.LABEL_MODEL: model}
            found = gpus.translate(text, chosen, replica, self.target.labels, src.pool)
        except (ScrapeError, ParseError) as exc:
            self._gpu_state(f"GPU source {src.url} failed ({exc.reason}): {exc}")
            return None
        if not found.metrics():
            self._gpu_state(f"GPU source {src.url} lists none of this target's GPUs (check its gpus: section)")
            return None
        self._gpu_state(None)
        return found

    def _gpu_state(self, error: str | None) -> None:
        with self._state_lock:
            if error is not None and error != self._gpu_error:
                log.warning("target %s: %s", self.target.label, error)
            elif error is None and self._gpu_error is not None:
                log.warning("target %s: GPU source recovered", self.target.label)
            self._gpu_error = error

    def _down(self, start: float, reason: str) -> Snapshot:
        return health_snapshot(
            self.target.label, self.engine_label, self.target.labels, False, self.clock() - start, reason=reason
        )

    def _context(self, adapter: EngineAdapter) -> TranslateContext:
        """The context of this target's translations: made again only when the engine or its facts
        change (a translation sets its ``memo``, the session's own)."""
        ctx = self._ctx
        if ctx is None or ctx.engine != adapter.name or ctx.facts is not self.facts:
            ctx = self._ctx = TranslateContext(
                engine=adapter.name,
                vocabulary=self.vocabulary,
                model_override=self.target.model,
                extra_labels=self.target.labels,
                facts=self.facts,
            )
        return ctx

    def state(self) -> str | None:
        """None while the last scrape succeeded; else why it failed (or that none has succeeded yet)."""
        with self._state_lock:
            if self._last_error is not None:
                return self._last_error
            return None if self._ever_ok else "not scraped yet"

    def _state_error(self, message: str, reason: str) -> None:
        """Log a failure once per change of reason (not per scrape)."""
        with self._state_lock:
            if reason != self._last_error:
                log.warning("target %s: scrape failed (%s): %s", self.target.label, reason, message)
            self._last_error = reason

    def _state_ok(self) -> None:
        with self._state_lock:
            if self._last_error is not None:
                log.warning("target %s: scrape recovered", self.target.label)
            elif not self._ever_ok:
                log.info("target %s: first scrape succeeded", self.target.label)
            self._last_error = None
            self._ever_ok = True
