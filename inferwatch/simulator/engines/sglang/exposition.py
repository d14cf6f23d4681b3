"""SGLang's ``/metrics`` as prometheus_client's ``MultiProcessCollector`` renders it.

SGLang sets ``PROMETHEUS_MULTIPROC_DIR`` before it imports prometheus_client (its tokenizer, scheduler
and detokenizer are separate processes) and serves ``/metrics`` from a registry holding only a
``MultiProcessCollector`` (``add_prometheus_middleware`` in ``python/sglang/srt/utils/common.py``).
What that collector does to the exposition, as prometheus_client 0.26's ``multiprocess.py`` reads
the per-process files back:

* no ``_created`` series and no process/GC/platform collectors;
* a family appears only once one of its children exists (a labelled metric has none until
  ``.labels()`` is called), with every value of that child, zeros included;
* the label names of each sample are sorted; gauges of the default ``all`` mode get a trailing
  ``pid`` label, the other modes (``mostrecent``, ``livesum``) none;
* a histogram's samples are ``_sum`` then the cumulative ``_bucket``s then ``_count``.

:class:`Store` keeps the values of the families the simulator registers and renders them through
prometheus_client's own ``Metric`` and ``generate_latest``, so number formatting is the library's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
MODE_ALL = "all"
MODE_MOSTRECENT = "mostrecent"
MODE_LIVESUM = "livesum"

Labels = tuple[tuple[str, str], ...]


def go_float(value: float) -> str:
    """An ``le`` bound as prometheus_client writes it (``floatToGoString``: ``0.1``, ``1.0``, ``+Inf``)."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


@dataclass
class Family:
    """One registered metric: its exposed name, HELP, type, label names, gauge mode and buckets."""

    name: str
    help: str
    kind: str
    labelnames: tuple[str, ...]
    mode: str = MODE_ALL
    buckets: tuple[float, ...] = ()
    values: dict[Labels, float] = field(default_factory=dict)
    sums: dict[Labels, float] = field(default_factory=dict)
    counts: dict[Labels, list[float]] = field(default_factory=dict)

    @property
    def base(self) -> str:
        """The name prometheus_client keeps (a counter's without ``_total``)."""
        return self.name[: -len("_total")] if self.kind == COUNTER and self.name.endswith("_total") else self.name

    def key(self, labels: Mapping[str, str]) -> Labels:
        missing = set(self.labelnames) ^ set(labels)
        if missing:
            raise ValueError(f"{self.name}: labels {sorted(labels)} do not match {sorted(self.labelnames)}")
        return tuple(sorted((k, str(v)) for k, v in labels.items()))

    def child(self, labels: Mapping[str, str]) -> Labels:
        """Create the child (``.labels()``): it is exposed from now on, with zero values."""
        k = self.key(labels)
        if self.kind == HISTOGRAM:
            self.sums.setdefault(k, 0.0)
            self.counts.setdefault(k, [0.0] * (len(self.buckets) + 1))
        else:
            self.values.setdefault(k, 0.0)
        return k

    def inc(self, labels: Mapping[str, str], amount: float = 1.0) -> None:
        k = self.child(labels)
        self.values[k] += amount

    def set(self, labels: Mapping[str, str], value: float) -> None:
        k = self.child(labels)
        self.values[k] = float(value)

    def observe(self, labels: Mapping[str, str], value: float, count: float = 1.0, total: float | None = None) -> None:
        """One observation; ``count`` and ``total`` let SGLang's ITL histogram add many at once."""
        k = self.child(labels)
        self.sums[k] += value if total is None else total
        index = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[k][index] += count

    def get(self, labels: Mapping[str, str]) -> float:
        """A counter's or gauge's value, a histogram's count (0 when the child does not exist)."""
        k = self.key(labels)
        if self.kind == HISTOGRAM:
            return sum(self.counts.get(k, ()))
        return self.values.get(k, 0.0)

    def total(self) -> float:
        """Summed over every child: values, or a histogram's counts."""
        if self.kind == HISTOGRAM:
            return sum(sum(c) for c in self.counts.values())
        return sum(self.values.values())

    def sum_of(self) -> float:
        return sum(self.sums.values())

    def metric(self, pid: str) -> Metric | None:
        children = self.counts if self.kind == HISTOGRAM else self.values
        if not children:
            return None
        m = Metric(self.base, self.help, self.kind)
        for k in children:
            labels = dict(k)
            if self.kind == HISTOGRAM:
                m.add_sample(self.name + "_sum", labels, self.sums[k])
                acc = 0.0
                bounds = [*self.buckets, float("inf")]
                for bound, n in zip(bounds, self.counts[k], strict=True):
                    acc += n
                    m.add_sample(self.name + "_bucket", {**labels, "le": go_float(bound)}, acc)
                m.add_sample(self.name + "_count", labels, acc)
            elif self.kind == COUNTER:
                m.add_sample(self.base + "_total", labels, self.values[k])
            else:
                if self.mode == MODE_ALL:
                    labels = {**labels, "pid": pid}
                m.add_sample(self.name, labels, self.values[k])
        return m


class Store:
    """The families of one simulated SGLang server; :meth:`render` is its ``/metrics`` body."""

    def __init__(self, pid: int) -> None:
        self.pid = str(pid)
        self.families: dict[str, Family] = {}

    def add(
        self,
        name: str,
        help_: str,
        kind: str,
        labelnames: Iterable[str],
        mode: str = MODE_ALL,
        buckets: Iterable[float] = (),
    ) -> Family:
        fam = Family(name, help_, kind, tuple(labelnames), mode, tuple(float(b) for b in buckets))
        self.families[name] = fam
        return fam

    def __getitem__(self, name: str) -> Family:
        return self.families[name]

    def collect(self) -> Iterator[Metric]:
        for fam in self.families.values():
            m = fam.metric(self.pid)
            if m is not None:
                yield m

    def render(self) -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry).decode()
