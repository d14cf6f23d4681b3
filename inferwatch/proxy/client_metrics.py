"""The proxy's ``/metrics``: what the client sees, in the vocabulary's ``llm_client_*`` families.

Accumulated in plain counters and bucket arrays (updated from the event loop only, so without locks)
and exposed through a prometheus_client custom collector on a registry of the proxy's own, with the
canonical bucket layouts of a :class:`~inferwatch.core.vocabulary.Vocabulary` (``le`` spelled by
:func:`~inferwatch.core.vocabulary.format_le`). Every series carries ``engine``, ``model`` and ``tenant``
(a bounded set of values: :class:`~inferwatch.proxy.tenants.TopTenants`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric

from inferwatch.core import vocabulary as V

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Histogram:
    """Counts per canonical bucket (not cumulative), with the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((V.format_le(bound), float(running)))
        return out


HISTOGRAMS = (
    V.CLIENT_TIME_TO_FIRST_TOKEN,
    V.CLIENT_CHUNK_GAP,
    V.CLIENT_TIME_PER_OUTPUT_TOKEN,
    V.CLIENT_REQUEST_DURATION,
)


class ClientMetrics:
    """The ``llm_client_*`` families of one proxy (one engine, any number of models and tenants).

    ``kept`` maps a tenant label to the value recorded now (a tenant that left the busiest since its request
    arrived is recorded as ``other``, so that its removed series do not come back); :meth:`forget` drops the
    series of tenants no longer kept.
    """

    def __init__(self, engine: str, vocabulary: V.Vocabulary, kept: Callable[[str], str] | None = None) -> None:
        self.engine = engine
        self.kept = kept
        self.bounds = {spec: vocabulary.buckets(spec) for spec in HISTOGRAMS}
        self.histograms: dict[V.MetricSpec, dict[tuple[str, str], Histogram]] = {spec: {} for spec in HISTOGRAMS}
        self.requests: dict[tuple[str, str, str], int] = {}
        self.prompt_tokens: dict[tuple[str, str, str], int] = {}
        self.generation_tokens: dict[tuple[str, str, str], int] = {}
        self.epoch = 0
        """changes when series are dropped (:meth:`forget`): a :meth:`histogram` taken before may be gone."""

    def _tenant(self, tenant: str) -> str:
        return tenant if self.kept is None else self.kept(tenant)

    def observe(self, spec: V.MetricSpec, model: str, value: float, tenant: str = V.TENANT_ANONYMOUS) -> None:
        self.histogram(spec, model, tenant).observe(value)

    def histogram(self, spec: V.MetricSpec, model: str, tenant: str = V.TENANT_ANONYMOUS) -> Histogram:
        """The series' histogram (made at need), for a caller that observes it many times (a stream's chunk
        gaps): it stays the series' own as long as :attr:`epoch` does not change."""
        series = self.histograms[spec]
        key = (model, self._tenant(tenant))
        hist = series.get(key)
        if hist is None:
            hist = series[key] = Histogram(self.bounds[spec])
        return hist

    def finished(
        self,
        model: str,
        outcome: str,
        duration: float,
        prompt: tuple[int, bool] | None,
        generated: tuple[int, bool] | None,
        tenant: str = V.TENANT_ANONYMOUS,
    ) -> None:
        """One generation request is over: its outcome, duration and tokens (count, estimated)."""
        tenant = self._tenant(tenant)
        self.observe(V.CLIENT_REQUEST_DURATION, model, duration, tenant)
        key = (model, tenant, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1
        for counter, tokens in ((self.prompt_tokens, prompt), (self.generation_tokens, generated)):
            if tokens is not None:
                k = (model, tenant, V.TRUE if tokens[1] else V.FALSE)
                counter[k] = counter.get(k, 0) + tokens[0]

    def forget(self, tenants: Iterable[str]) -> None:
        """Drop every series of ``tenants`` (they left the busiest: Prometheus sees their series end)."""
        gone = set(tenants)
        self.epoch += 1
        for series in self.histograms.values():
            for key in [k for k in series if k[1] in gone]:
                del series[key]
        for counter in (self.requests, self.prompt_tokens, self.generation_tokens):
            for ckey in [k for k in counter if k[1] in gone]:
                del counter[ckey]

    def collect(self) -> Iterator[Metric]:
        common = [V.LABEL_ENGINE, V.LABEL_MODEL, V.LABEL_TENANT]
        for spec in HISTOGRAMS:
            hfam = HistogramMetricFamily(spec.name, spec.help, labels=common)
            for (model, tenant), hist in sorted(self.histograms[spec].items()):
                hfam.add_metric([self.engine, model, tenant], hist.buckets(), hist.total)
            yield hfam
        counters = (
            (V.CLIENT_REQUESTS, V.LABEL_OUTCOME, self.requests),
            (V.CLIENT_PROMPT_TOKENS, V.LABEL_ESTIMATED, self.prompt_tokens),
            (V.CLIENT_GENERATION_TOKENS, V.LABEL_ESTIMATED, self.generation_tokens),
        )
        for spec, label, values in counters:
            # the canonical label order (V.LABEL_ORDER): outcome before tenant
            labels = [V.LABEL_ENGINE, V.LABEL_MODEL, label, V.LABEL_TENANT]
            cfam = CounterMetricFamily(spec.name, spec.help, labels=labels)
            for (model, tenant, value), count in sorted(values.items()):
                cfam.add_metric([self.engine, model, value, tenant], float(count))
            yield cfam


def registry_for(metrics: ClientMetrics, process: bool = True) -> CollectorRegistry:
    """A registry of the proxy's own (never prometheus_client's global one), with ``process_*`` metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    if process:
        ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
