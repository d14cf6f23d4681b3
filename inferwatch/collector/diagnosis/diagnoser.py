"""The on-call surface as one object: where signals come from, the SLOs, and the four answers.

:class:`OnCall` reads Prometheus when one is configured and falls back to scraping the exporters
when Prometheus cannot be read (or is not configured); it answers the diagnosis, the checklist,
capacity planning and SLO status. The collector's routes and ``inferwatch diagnose`` both use it,
so the terminal and the API give the same answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, cast

import httpx
from sqlalchemy import Engine

from inferwatch.collector.diagnosis import exporter_scrape, headroom_sources, prometheus
from inferwatch.collector.diagnosis.burn import SloReport, read_slos
from inferwatch.collector.diagnosis.evaluate import Settings, diagnose
from inferwatch.collector.diagnosis.headroom_report import HeadroomReport, capacity_findings, report
from inferwatch.collector.diagnosis.report import (
    Capacity,
    CapacityPlan,
    Checklist,
    Diagnosis,
    ObservedCapacity,
)
from inferwatch.collector.diagnosis.signals import Filters, Fleet, TargetKey, TargetSignals, UpstreamError
from inferwatch.collector.diagnosis.tuning import evaluate as check_target
from inferwatch.collector.stats import listing, sides
from inferwatch.core import vocabulary as V
from inferwatch.core.capacity import CapacityError, ModelShape, Plan, plan_capacity, supported_concurrency
from inferwatch.core.engines.launch import LaunchConfig, parse_launch
from inferwatch.core.engines.profile import EngineProfile
from inferwatch.core.schema import E2E, QUEUE, TPOT, TTFT
from inferwatch.core.slo import HeadroomRules, SLOFile, duration_seconds
from inferwatch.core.symptoms import Signal, Symptom

EXAMPLE_SORT: Final[dict[Symptom, tuple[str, str | None]]] = {
    Symptom.LATENCY_P99_HIGH: (QUEUE, None),
    Symptom.PREEMPTIONS: (E2E, None),
    Symptom.THROUGHPUT_LOW: (E2E, None),
    Symptom.TTFT_SLOW: (TTFT, None),
    Symptom.TPOT_SLOW: (TPOT, None),
    Symptom.ERROR_RATE_HIGH: ("start_time", V.OUTCOME_ERROR),
    Symptom.STREAMS_ABORTED: ("start_time", V.OUTCOME_ABORT),
    Symptom.GPU_THROTTLED: (TPOT, None),
    Symptom.GPU_ERRORS: ("start_time", V.OUTCOME_ERROR),
    Symptom.CAPACITY_EXHAUSTED: (QUEUE, None),
}
"""how a finding's example requests are picked: the column sorted on, and a finish reason to match."""


class NotConfigured(RuntimeError):
    """Neither Prometheus nor exporters are configured for the diagnosis."""


@dataclass
class OnCall:
    profiles: Mapping[str, EngineProfile]
    slos: SLOFile | None
    prometheus_url: str | None = None
    exporter_urls: Sequence[str] = ()
    timeout: float = 5.0
    interval: float = exporter_scrape.DEFAULT_INTERVAL_S
    overrides: Mapping[Symptom, tuple[float, float]] = field(default_factory=dict)
    gpu: str | None = None
    client: httpx.AsyncClient | None = None

    @property
    def configured(self) -> bool:
        return bool(self.prometheus_url or self.exporter_urls)

    def evaluation(self) -> Settings:
        """Threshold overrides, and each latency SLO's threshold for the symptom on its metric."""
        tightest: dict[str, float] = {}
        for slo in self.slos.slos if self.slos else ():
            latency = slo.indicator.latency
            if latency is not None:
                key = latency.metric
                tightest[key] = min(tightest.get(key, latency.threshold_seconds), latency.threshold_seconds)
        return Settings(overrides=dict(self.overrides), slo_thresholds=tightest)

    def _client(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(follow_redirects=True)
        return self.client

    async def cost_per_million(self, at: float, seconds: int) -> dict[str, float]:
        """Per model, USD per million generated tokens over the ``seconds`` before ``at`` (Prometheus' cost
        records); :class:`NotConfigured` without Prometheus, :class:`UpstreamError` when it fails."""
        if not self.prometheus_url:
            raise NotConfigured("no Prometheus (--prometheus-url) to read the cost records from")
        return await prometheus.read_cost_per_million(self._client(), self.prometheus_url, at, seconds, self.timeout)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    async def fleet(self, window: str, filters: Filters) -> tuple[Fleet, str | None]:
        """The signals, and a note when the exporters had to stand in for Prometheus."""
        prometheus.window_seconds(window)  # validates
        if self.prometheus_url:
            try:
                fleet = await prometheus.read_fleet(
                    self._client(), self.prometheus_url, window=window, filters=filters, timeout=self.timeout
                )
                return fleet, None
            except UpstreamError as exc:
                if not self.exporter_urls:
                    raise
                note = f"Prometheus could not be read ({exc}); the exporters were scraped instead"
        elif self.exporter_urls:
            note = None
        else:
            raise NotConfigured("no Prometheus URL and no exporter URL: give --prometheus-url or --exporter")
        fleet = await exporter_scrape.read_fleet(
            self._client(), self.exporter_urls, interval=self.interval, filters=filters, timeout=self.timeout
        )
        return fleet, note

    async def diagnose(
        self, window: str, filters: Filters, *, requests: Engine | None = None, examples: int = 3
    ) -> Diagnosis:
        fleet, note = await self.fleet(window, filters)
        result = diagnose(fleet, self.profiles, self.evaluation())
        result.note = note
        if fleet.source == "prometheus" and self.prometheus_url:
            try:  # capacity_exhausted needs the replicas' history: Prometheus has it, two scrapes do not
                found = await self.headroom(None, None, filters, exporters=False)
                capacity_findings(result, found, self.slos)
            except (UpstreamError, ValueError) as exc:
                result.note = "; ".join(filter(None, [result.note, f"no capacity check: {exc}"]))
        if requests is not None and examples > 0 and result.findings:
            since = datetime.now(UTC) - timedelta(seconds=fleet.window_seconds)
            await asyncio.to_thread(self._examples, result, requests, since, examples)
        return result

    async def headroom(
        self,
        window: str | None,
        step: str | None,
        filters: Filters,
        *,
        exporters: bool = True,
        progress: headroom_sources.Progress | None = None,
    ) -> HeadroomReport:
        """Every replica's headroom over ``window`` (default: the SLO file's ``headroom.window``; from
        exporters alone, their scrapes last that long) at ``step`` (one point of the TPOT fit)."""
        rules = self.slos.headroom if self.slos else HeadroomRules()
        if self.slos is None:
            raise NotConfigured("no SLO file: the headroom is measured against the SLOs")
        note = None
        if self.prometheus_url:
            window_s, step_s = _window(window or rules.window, step or rules.step, rules)
            try:
                history = await headroom_sources.from_prometheus(
                    self._client(),
                    self.prometheus_url,
                    window_seconds=window_s,
                    step_seconds=step_s,
                    filters=filters,
                    timeout=self.timeout,
                )
                return report(history, self.slos, window or rules.window, step_s, self.profiles)
            except UpstreamError as exc:
                if not (exporters and self.exporter_urls):
                    raise
                note = f"Prometheus could not be read ({exc}); the exporters were scraped instead"
        elif not (exporters and self.exporter_urls):
            raise NotConfigured("no Prometheus URL and no exporter URL: give --prometheus-url or --exporter")
        window, step = window or EXPORTER_WINDOW, step or EXPORTER_STEP
        window_s, step_s = _window(window, step, rules)
        if window_s > EXPORTER_WINDOW_MAX_S:
            raise ValueError(
                f"window {window}: from the exporters the window is scraped live, at most "
                f"{EXPORTER_WINDOW_MAX_S // 60:g} minutes (Prometheus keeps the history: give its URL)"
            )
        history = await headroom_sources.from_exporters(
            self._client(),
            self.exporter_urls,
            window_seconds=window_s,
            step_seconds=step_s,
            filters=filters,
            timeout=self.timeout,
            progress=progress,
        )
        result = report(history, self.slos, window, step_s, self.profiles)
        result.note = note
        return result

    @staticmethod
    def _examples(result: Diagnosis, engine: Engine, since: datetime, limit: int) -> None:
        """Each finding's example requests from one side: the engine's rows, or inferwatch proxy's where the
        engine sent none (a request both sent spans for is stored twice, and would be shown twice)."""
        for finding in result.findings:
            name, reason = EXAMPLE_SORT[finding.symptom]
            column = cast("listing.SortField", name)
            found = []
            for side in sides.EXAMPLE_SIDES:
                for model in (finding.model, None):  # spans may carry no model name (vLLM's do not)
                    base = listing.RequestFilter(
                        engine=finding.engine, model=model, finish_reason=reason, since=since, side=side
                    )
                    found = listing.slowest_requests(engine=engine, filters=base, sort=column, limit=limit)
                    if found:
                        break
                if found:
                    break
            finding.example_requests = found

    async def checklist(
        self,
        window: str,
        filters: Filters,
        *,
        launch: str | None = None,
        gpu: str | None = None,
        shape: ModelShape | None = None,
    ) -> Checklist:
        """The checklist per target; with ``launch`` also for the engine that line starts."""
        config: LaunchConfig | None = parse_launch(launch, self.profiles) if launch else None
        note = None
        fleet: Fleet | None = None
        if self.configured:
            fleet, note = await self.fleet(window, filters)
        targets = []
        if fleet is not None:
            for key, target in sorted(fleet.targets.items()):
                mine = config if config is not None and config.engine == key.engine else None
                targets.append(
                    check_target(target, self.profiles.get(key.engine), launch=mine, gpu=gpu or self.gpu, shape=shape)
                )
        if config is not None and not any(t.engine == config.engine for t in targets):
            alone = TargetSignals(TargetKey(config.engine, config.model or V.UNKNOWN, "launch line"))
            targets.append(
                check_target(alone, self.profiles.get(config.engine), launch=config, gpu=gpu or self.gpu, shape=shape)
            )
        source = fleet.source if fleet is not None else "launch"
        return Checklist(window=fleet.window if fleet else window, source=source, targets=targets, note=note)

    async def capacity(self, plan: Plan | None, window: str, filters: Filters) -> Capacity:
        report = None
        if plan is not None:
            r = plan_capacity(plan)
            report = CapacityPlan(**{f: getattr(r, f) for f in CapacityPlan.model_fields})
        observed: list[ObservedCapacity] = []
        note = None
        if self.configured and (filters.engine or filters.model or filters.instance or plan is None):
            fleet, note = await self.fleet(window, filters)
            observed = [_observed(t, report) for _, t in sorted(fleet.targets.items())]
        if report is None and not observed:
            raise CapacityError(
                "nothing to plan: give the model (config.json or layers, KV heads, head dim) or a target"
            )
        return Capacity(plan=report, observed=observed, note=note)

    async def slo_status(self) -> SloReport:
        if not self.prometheus_url:
            raise NotConfigured("SLO status needs Prometheus with the generated rules: give --prometheus-url")
        if self.slos is None:
            raise NotConfigured("no SLO file")
        return await read_slos(self._client(), self.prometheus_url, self.slos, timeout=self.timeout)


EXPORTER_WINDOW, EXPORTER_STEP = "2m", "15s"
"""the headroom window and step from the exporters alone: scraped live, so short."""
EXPORTER_WINDOW_MAX_S = 600.0


def _window(window: str, step: str, rules: HeadroomRules) -> tuple[float, float]:
    window_s, step_s = float(duration_seconds(window)), float(duration_seconds(step))
    if window_s < rules.min_points * step_s:
        raise ValueError(f"window {window} holds fewer than {rules.min_points} steps of {step}: the fit needs them")
    return window_s, step_s


def _observed(target: TargetSignals, plan: CapacityPlan | None) -> ObservedCapacity:
    def value(signal: Signal) -> float | None:
        obs = target.get(signal)
        return obs.value if obs else None

    capacity, usage, preempt = value(Signal.KV_CAPACITY), value(Signal.KV_USAGE), value(Signal.PREEMPTION_RATE)
    prompt, rate, generated = (
        value(Signal.PROMPT_TOKENS_MEAN),
        value(Signal.REQUEST_RATE),
        value(Signal.GENERATION_RATE),
    )
    per_request = prompt + generated / rate if prompt is not None and rate and generated is not None else None
    fits = supported_concurrency(capacity, per_request) if capacity and per_request else None
    ratio = plan.kv_tokens / capacity if plan and plan.kv_tokens is not None and capacity else None
    parts = []
    if capacity is not None:
        parts.append(f"KV cache {capacity:,.0f} tokens")
    if fits is not None and per_request is not None:
        parts.append(f"holds about {fits} sequences of {per_request:,.0f} tokens at once before preempting")
    if usage is not None:
        parts.append(f"usage {usage:.0%}")
    if preempt:
        parts.append(f"{preempt:.2g} preemptions/s: more concurrency than the cache holds")
    if ratio is not None:
        parts.append(f"the plan gives {ratio:.2f}× the observed capacity")
    key = target.key
    return ObservedCapacity(
        engine=key.engine,
        model=key.model,
        instance=key.instance,
        kv_capacity_tokens=capacity,
        kv_usage=usage,
        preemptions_per_second=preempt,
        average_sequence_tokens=per_request,
        supported_concurrency=fits,
        plan_vs_observed=ratio,
        summary="; ".join(parts) or "no KV-cache signals for this target",
    )
