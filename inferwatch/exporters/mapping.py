"""Declarative mapping rows, the engine adapter interface and the generic translator.

An engine module is mostly a tuple of :class:`Row` objects: which source family feeds which
canonical metric, with label renames, value maps (``finished_reason`` -> ``outcome``), label
matchers (label-pivoted gauges) and unit scaling. Oddities that are not data go in a hook (the
same for every target of the engine) or in an :class:`EngineSession` subclass: a target's typed
options, the state it keeps across scrapes, how it is fetched and polled, and payloads that are not
Prometheus text. Generic code (the runtime, the CLI) sees only this interface, never an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Protocol, Self

from pydantic import BaseModel, ConfigDict, JsonValue

from inferwatch.core import vocabulary as V
from inferwatch.exporters import textparse
from inferwatch.exporters.memo import (
    TranslateMemo,
    add_note,
    bucket_series,
    by_histogram_plan,
    by_keys,
    by_sum_plan,
    norm,
    note_step,
    recording,
    replay,
    rows_present,
)
from inferwatch.exporters.samples import HistogramValue, SeriesKey, Snapshot, rebucket, series_key
from inferwatch.exporters.textparse import Labels, ParsedText


@dataclass(frozen=True)
class Row:
    """One source family feeding one canonical metric.

    ``sources`` lists sample names (counters, gauges) or histogram base names, current name first
    and older aliases after; the first one present in a payload is used.
    """

    metric: V.MetricSpec
    sources: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    """source label -> canonical label; other source labels are dropped (series then aggregate)."""
    match: Mapping[str, str] = field(default_factory=dict)
    """only samples whose source labels have these values."""
    values: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    """source label -> {source value: canonical value}; ``None`` or an unlisted value drops the sample
    (``"*"`` gives a default)."""
    const: Mapping[str, str] = field(default_factory=dict)
    """canonical labels with a fixed value."""
    divisor: float = 1.0
    """source unit per canonical unit (1000 for ms -> s); applied to values, sums and ``le``."""
    sum_only: bool = False
    """histogram source with no buckets: ``sources`` is ``(sum_sample, count_sample)``."""
    note: str = ""
    """approximation note, appended to the canonical HELP text."""

    def sample_names(self) -> tuple[str, ...]:
        if self.metric.kind is not V.Kind.HISTOGRAM or self.sum_only:
            return self.sources
        return tuple(f"{s}{suffix}" for s in self.sources for suffix in ("_bucket", "_sum", "_count"))


@dataclass(frozen=True)
class EngineFacts:
    """What an engine reveals about itself outside ``/metrics`` (``/info``, ``/version``)."""

    version: str | None = None
    model: str | None = None
    max_concurrency: str | None = None


def version_info(body: JsonValue) -> EngineFacts:
    """Facts from a ``{"version": "..."}`` body (vLLM and trtllm-serve ``/version``, Triton ``/v2``)."""
    version = body.get("version") if isinstance(body, dict) else None
    return EngineFacts(version=str(version) if version else None)


@dataclass
class TranslateContext:
    """Per-target settings every translation needs (engine-specific ones live in the session)."""

    engine: str
    vocabulary: V.Vocabulary = field(default_factory=V.Vocabulary)
    model_override: str | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    facts: EngineFacts = field(default_factory=EngineFacts)
    memo: TranslateMemo | None = field(default=None, compare=False, repr=False)
    """the target's memo while a translation with one runs (set by :func:`translate_parsed`): a hook
    passes it to :func:`translate_rows`, with a ``tag`` for a filter."""

    def model_for(self, source_model: str | None) -> str:
        if self.model_override:
            return self.model_override
        if source_model and source_model not in ("undefined", ""):
            return source_model
        return self.facts.model or V.UNKNOWN

    def key(self, labels: dict[str, str]) -> SeriesKey:
        labels[V.LABEL_ENGINE] = self.engine
        labels[V.LABEL_MODEL] = self.model_for(labels.get(V.LABEL_MODEL))
        return series_key(labels, self.extra_labels)


Hook = Callable[[ParsedText, TranslateContext, Snapshot], None]
OptionValues = Mapping[str, JsonValue]
"""Engine options by name, as a target's ``options:`` or ``--engine-option NAME=VALUE`` give them."""


class ScrapeError(Exception):
    """The engine could not be scraped (down, slow, HTTP error, garbage)."""

    def __init__(self, message: str, reason: str = V.SCRAPE_ERROR_INVALID) -> None:
        super().__init__(message)
        self.reason = reason
        """why, as the ``reason`` label of the exporter's scrape-error health series."""


class Fetch(Protocol):
    """GET a path of one target's base URL; failures raise :class:`ScrapeError`."""

    def __call__(self, path: str, *, allow_404: bool = False) -> str:
        """The body; ``""`` for an HTTP 404 when ``allow_404``."""
        ...


class EngineOptions(BaseModel):
    """An engine's typed options. This base has none; an engine that takes some subclasses it,
    every field with a default and a description (``inferwatch exporter engines`` lists them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSession:
    """One target of an engine, made by :meth:`EngineAdapter.open`: its options, the state it keeps
    across scrapes, how it is fetched and polled, and how its payloads are translated.

    This base is a plain engine: Prometheus text at the metrics path, no options, no state, no
    background polls. An engine with quirks subclasses it (set :attr:`Options`, take that type in
    ``__init__``) and names the subclass in its adapter.
    """

    Options: ClassVar[type[EngineOptions]] = EngineOptions
    """the options model; :meth:`open` validates a target's options with it."""

    def __init__(self, adapter: EngineAdapter, options: EngineOptions) -> None:
        self.adapter = adapter
        self.memo = TranslateMemo()
        """what this target's earlier payloads taught: line heads, series keys, histogram plans."""

    @classmethod
    def open(cls, adapter: EngineAdapter, options: OptionValues) -> Self:
        """A session with ``options`` validated (``pydantic.ValidationError`` names the field)."""
        return cls(adapter, cls.Options.model_validate(options))

    @property
    def poll_interval(self) -> float | None:
        """Seconds between background :meth:`poll` calls; ``None`` when the target needs none."""
        return None

    def fetch(self, get: Fetch, path: str, body: str | None = None) -> str:
        """The Prometheus text of one scrape. ``path`` is the target URL's path (``""`` for a base
        URL); ``body`` is what that URL answered when it was already read to detect the engine."""
        return get(path or self.adapter.default_path) if body is None else body

    def poll_delay(self) -> float | None:
        """Seconds until the next background :meth:`poll` is due (a session whose scrapes do the same
        work pushes it back); ``None`` when the target needs none."""
        return self.poll_interval

    def poll(self, get: Fetch) -> None:
        """Work between scrapes (e.g. draining a destructive endpoint); may raise ScrapeError."""

    def translate(self, payload: str, ctx: TranslateContext) -> Snapshot:
        """A fetched or captured payload -> canonical snapshot: rows, the adapter's hook, :meth:`extend`."""
        return translate_text(self.adapter, payload, ctx, self.extend, self.memo)

    def extend(self, parsed: ParsedText, ctx: TranslateContext, snap: Snapshot) -> None:
        """Add what this target's options or state provide (after the rows and the adapter's hook)."""


@dataclass(frozen=True)
class EngineAdapter:
    """An engine's dialect: mapping rows plus the few things that are not data."""

    name: str
    rows: tuple[Row, ...]
    prefixes: tuple[str, ...]
    """name prefixes of the engine's own families (for detection and unmapped accounting)."""
    unsupported: Mapping[str, str]
    """canonical metric key -> why this engine cannot provide it."""
    ignored: frozenset[str] = frozenset()
    """engine families known and deliberately not mapped."""
    extra_samples: tuple[str, ...] = ()
    """further sample names the hook reads."""
    hook: Hook | None = None
    hook_rows: tuple[Row, ...] = ()
    """rows the hook applies itself (e.g. with a filter); counted as mapped."""
    hook_metrics: tuple[V.MetricSpec, ...] = ()
    """canonical metrics the hook computes without rows."""
    aliases: Callable[[str], Iterable[str]] | None = None
    """other spellings of a source name (vLLM's ``vllm_`` for ``vllm:``)."""
    default_path: str = "/metrics"
    info_path: str | None = None
    parse_info: Callable[[JsonValue], EngineFacts] | None = None
    detect_markers: tuple[str, ...] = ()
    """substrings whose presence identifies this engine's text payload."""
    claims_json: Callable[[JsonValue], bool] | None = None
    """whether a JSON payload (not Prometheus text) comes from this engine."""
    claims_info: Callable[[JsonValue], bool] | None = None
    """whether the body of ``info_path`` identifies this engine (to attribute an empty metrics body)."""
    session: type[EngineSession] = EngineSession
    """what a target of this engine has of its own: options, state, fetching, polling, payloads."""

    @property
    def options(self) -> type[EngineOptions]:
        """The engine's options model."""
        return self.session.Options

    def open(self, options: OptionValues | None = None) -> EngineSession:
        """A session for one target; ``pydantic.ValidationError`` names a bad or unknown option."""
        return self.session.open(self, options or {})

    def own_options(self, options: OptionValues) -> dict[str, JsonValue]:
        """Those of ``options`` that this engine takes (a target of a detected engine may carry others')."""
        return {name: value for name, value in options.items() if name in self.options.model_fields}

    @cached_property
    def wanted(self) -> frozenset[str]:
        names: set[str] = set(self.extra_samples)
        for row in (*self.rows, *self.hook_rows):
            names.update(row.sample_names())
        if self.aliases:
            for n in list(names):
                names.update(self.aliases(n))
        return frozenset(names)

    @cached_property
    def mapped_families(self) -> frozenset[str]:
        fams: set[str] = set()
        for name in (*(s for r in (*self.rows, *self.hook_rows) for s in r.sources), *self.extra_samples):
            fams.add(family_of(name))
        if self.aliases:
            for f in list(fams):
                fams.update(family_of(a) for a in self.aliases(f))
        return frozenset(fams)

    @cached_property
    def strict_samples(self) -> frozenset[str]:
        """Sample names feeding canonical counters and histograms: they must be finite."""
        names: set[str] = set()
        for row in (*self.rows, *self.hook_rows):
            if row.metric.kind is not V.Kind.GAUGE:
                names.update(row.sample_names())
        if self.aliases:
            for n in list(names):
                names.update(self.aliases(n))
        return frozenset(names)

    def mapped_metrics(self) -> frozenset[str]:
        """Keys of canonical metrics this adapter can produce (rows plus hook-produced ones)."""
        rows = (*self.rows, *self.hook_rows)
        return frozenset(r.metric.key for r in rows) | {m.key for m in self.hook_metrics}


def family_of(sample_or_family: str) -> str:
    """Normalise a sample or family name to a family key (``_total``/``_sum``/``_count`` stripped)."""
    for suffix in ("_total", "_sum", "_count", "_bucket"):
        if sample_or_family.endswith(suffix):
            return sample_or_family[: -len(suffix)]
    return sample_or_family


def _first_present(parsed: ParsedText, names: Iterable[str], suffix: str = "") -> str | None:
    for n in names:
        if parsed.samples.get(n + suffix):
            return n
    return None


def _candidates(adapter: EngineAdapter, source: str) -> list[str]:
    out = [source]
    if adapter.aliases:
        out.extend(adapter.aliases(source))
    return out


def _row_names(adapter: EngineAdapter, row: Row, memo: TranslateMemo | None) -> list[str]:
    """``row``'s source names with their aliases, in order of preference (kept by ``memo``)."""
    if memo is not None and (names := memo.names.get(id(row))) is not None:
        return names
    names = [c for s in row.sources for c in _candidates(adapter, s)]
    if memo is not None:
        memo.names[id(row)] = names
    return names


def _present(adapter: EngineAdapter, row: Row, parsed: ParsedText, memo: TranslateMemo) -> bool:
    """Whether ``row`` would read any sample of ``parsed``."""
    if row.metric.kind is V.Kind.HISTOGRAM and row.sum_only:
        return all(parsed.samples.get(name) for name in row.sources)
    names = _row_names(adapter, row, memo)
    if row.metric.kind is V.Kind.HISTOGRAM:
        return any(_first_present(parsed, names, suffix) is not None for suffix in ("_bucket", "_count"))
    return _first_present(parsed, names) is not None


def _map_labels(row: Row, labels: Labels) -> dict[str, str] | None:
    src = dict(labels)
    for k, v in row.match.items():
        if src.get(k) != v:
            return None
    out: dict[str, str] = {}
    for sk, ck in row.labels.items():
        if sk in src:
            out[ck] = src[sk]
    for sk, vmap in row.values.items():
        raw = src.get(sk, "")
        mapped = vmap.get(raw, vmap.get("*"))
        if mapped is None:
            return None
        out[row.labels.get(sk, sk)] = mapped
    out.update(row.const)
    return out


Accept = Callable[[Labels], bool]


def translate_rows(
    adapter: EngineAdapter,
    rows: Iterable[Row],
    parsed: ParsedText,
    ctx: TranslateContext,
    snap: Snapshot,
    accept: Accept | None = None,
    memo: TranslateMemo | None = None,
    tag: Hashable = None,
) -> None:
    """Apply ``rows`` to ``parsed`` into ``snap``; ``accept`` filters source label sets; ``memo`` (a
    target's, for ``ctx``: see :meth:`TranslateMemo.use`) saves the work that repeats between payloads.
    With ``accept``, the memo is used only with a ``tag`` that stands for the filter: two calls with
    the same tag must accept the same label sets (a hook's filter made from the page gives the set
    it was made from). With a memo, a page of a shape met before replays the steps recorded for that
    shape (:func:`~inferwatch.exporters.memo.replay`), none of the rows' look-ups made again."""
    if accept is not None and tag is None:
        memo = None  # a filter is the caller's: what it keeps is not the row's alone
    elif memo is not None and accept is not None and len(memo.keys) > MAX_TAGGED_SLOTS:
        memo.forget_slots()  # tags that do not repeat: keep the memo bounded
    if memo is not None and memo.recording is None and type(rows) is tuple and parsed.shape is not None:
        if not replay(memo, rows, tag, parsed, snap):  # a page of a new shape: its steps are recorded
            with recording(memo, rows, tag, parsed):
                translate_rows(adapter, rows, parsed, ctx, snap, accept, memo, tag)
        return
    vocab = ctx.vocabulary
    if memo is not None and type(rows) is tuple:
        rows = rows_present(memo, rows, parsed, lambda row: _present(adapter, row, parsed, memo))
    for row in rows:
        slot: Hashable = id(row) if accept is None else (id(row), tag)
        if row.metric.kind is V.Kind.HISTOGRAM:
            _translate_histogram(adapter, row, parsed, ctx, snap, vocab, accept, memo, slot)
            continue
        names = _row_names(adapter, row, memo)
        name = _first_present(parsed, names)
        if name is None:
            continue
        _note(snap, row, memo)
        if memo is not None:
            key_of = lambda labels, row=row: _key_of(row, labels, ctx, accept)  # noqa: E731
            by_keys(memo, slot, name, parsed.samples[name], (row.metric, row.divisor), snap, key_of)
            continue
        for labels, value in parsed.samples[name]:
            if accept is not None and not accept(labels):
                continue
            mapped = _map_labels(row, labels)
            if mapped is None:
                continue
            snap.add_value(row.metric, ctx.key(mapped), value / row.divisor)


MAX_TAGGED_SLOTS = 4096
"""most rows x filter tags whose series keys a memo keeps (filters made from pages that keep changing)."""


def _note(snap: Snapshot, row: Row, memo: TranslateMemo | None = None) -> None:
    add_note(snap, row.metric, row.note)
    if row.note and memo is not None and memo.recording is not None:
        memo.recording.append(note_step(row.metric, row.note))


def translate_parsed(
    adapter: EngineAdapter,
    parsed: ParsedText,
    ctx: TranslateContext,
    extend: Hook | None = None,
    memo: TranslateMemo | None = None,
) -> Snapshot:
    """Apply ``adapter``'s rows and hook, then ``extend`` (a session's), to a parsed payload."""
    textparse.check_finite(parsed, adapter.strict_samples)
    snap = Snapshot()
    ctx.memo = memo
    if memo is not None:
        facts = ctx.facts
        memo.use((ctx.engine, ctx.model_override, facts.model, tuple(ctx.extra_labels.items()), ctx.vocabulary))
        snap.label_texts = memo.texts
    translate_rows(adapter, adapter.rows, parsed, ctx, snap, memo=memo)
    if adapter.hook is not None:
        adapter.hook(parsed, ctx, snap)
    if extend is not None:
        extend(parsed, ctx, snap)
    if memo is None:
        _account_unmapped(adapter, parsed, snap)
    else:
        families = tuple(parsed.families)
        if memo.unmapped[0] != families:
            _account_unmapped(adapter, parsed, snap)
            memo.unmapped = (families, snap.unmapped)
        snap.unmapped = list(memo.unmapped[1])
    return snap


def _translate_histogram(
    adapter: EngineAdapter,
    row: Row,
    parsed: ParsedText,
    ctx: TranslateContext,
    snap: Snapshot,
    vocab: V.Vocabulary,
    accept: Accept | None,
    memo: TranslateMemo | None = None,
    slot: Hashable = None,
) -> None:
    if memo is None:
        bounds = vocab.buckets(row.metric)
    elif (got := memo.bounds.get(id(row))) is not None:
        bounds = got
    else:
        bounds = memo.bounds[id(row)] = vocab.buckets(row.metric)
    if row.sum_only:
        if memo is None:
            _translate_sum_only(row, parsed, ctx, snap, bounds, accept)
        else:
            _planned_sum_only(row, parsed, ctx, snap, bounds, accept, memo, slot)
        return
    names = _row_names(adapter, row, memo)
    base = _first_present(parsed, names, "_bucket") or _first_present(parsed, names, "_count")
    if base is None:
        return
    _note(snap, row, memo)
    if memo is not None and _planned(row, parsed, ctx, snap, base, bounds, memo, accept, slot):
        return
    if memo is not None and memo.recording is not None:
        memo.recording.append(None)  # no plan (a boundary given twice): nothing to replay
    series, inf_counts = bucket_series(parsed, base, row.divisor)
    sums = {norm(lbl): v for lbl, v in parsed.samples.get(base + "_sum", ())}
    counts = {norm(lbl): v for lbl, v in parsed.samples.get(base + "_count", ())}
    for key in counts.keys() - series.keys():
        series[key] = (key, [])
    for key, (labels, buckets) in series.items():
        if accept is not None and not accept(labels):
            continue
        mapped = _map_labels(row, labels)
        if mapped is None:
            continue
        buckets.sort()
        total = counts.get(key, inf_counts.get(key, buckets[-1][1] if buckets else 0.0))
        inf = inf_counts.get(key, total)
        canon, exact = rebucket(buckets, bounds) if buckets else (None, False)
        if not exact:
            snap.inexact.add(row.metric)
        snap.add_histogram(
            row.metric, ctx.key(mapped), HistogramValue(bounds, canon, inf, sums.get(key, 0.0) / row.divisor)
        )


def _planned(
    row: Row,
    parsed: ParsedText,
    ctx: TranslateContext,
    snap: Snapshot,
    base: str,
    bounds: tuple[float, ...],
    memo: TranslateMemo,
    accept: Accept | None = None,
    slot: Hashable = None,
) -> bool:
    """Translate a histogram row by its plan (:func:`~inferwatch.exporters.memo.by_histogram_plan`)."""
    samples = parsed.samples
    return by_histogram_plan(
        memo,
        id(row) if slot is None else slot,
        (base, samples.get(base + "_bucket", []), samples.get(base + "_count", []), samples.get(base + "_sum", [])),
        (row.metric, bounds, row.divisor),
        snap,
        lambda labels: _key_of(row, labels, ctx, accept),
    )


def _key_of(row: Row, labels: Labels, ctx: TranslateContext, accept: Accept | None = None) -> SeriesKey | None:
    if accept is not None and not accept(labels):
        return None
    mapped = _map_labels(row, labels)
    return None if mapped is None else ctx.key(mapped)


def _translate_sum_only(
    row: Row,
    parsed: ParsedText,
    ctx: TranslateContext,
    snap: Snapshot,
    bounds: tuple[float, ...],
    accept: Accept | None,
) -> None:
    """A histogram source with no buckets (``row.sources`` is ``(sum_sample, count_sample)``): count and sum only."""
    sum_name, count_name = row.sources
    sum_samples = parsed.samples.get(sum_name)
    count_samples = parsed.samples.get(count_name)
    if not sum_samples or not count_samples:
        return
    count_by = {norm(lbl): v for lbl, v in count_samples}
    for labels, total in sum_samples:
        if accept is not None and not accept(labels):
            continue
        n = count_by.get(norm(labels))
        mapped = _map_labels(row, labels)
        if n is None or mapped is None:
            continue
        snap.add_histogram(row.metric, ctx.key(mapped), HistogramValue(bounds, None, n, total / row.divisor))
        snap.inexact.add(row.metric)
    _note(snap, row)


def _planned_sum_only(
    row: Row,
    parsed: ParsedText,
    ctx: TranslateContext,
    snap: Snapshot,
    bounds: tuple[float, ...],
    accept: Accept | None,
    memo: TranslateMemo,
    slot: Hashable,
) -> None:
    """:func:`_translate_sum_only` by a plan (:func:`~inferwatch.exporters.memo.by_sum_plan`)."""
    sum_samples = parsed.samples.get(row.sources[0])
    count_samples = parsed.samples.get(row.sources[1])
    if sum_samples and count_samples:
        key_of = lambda labels: _key_of(row, labels, ctx, accept)  # noqa: E731
        metric = (row.metric, bounds, row.divisor)
        by_sum_plan(memo, slot, (row.sources[0], row.sources[1]), sum_samples, count_samples, metric, snap, key_of)
        _note(snap, row, memo)


def _account_unmapped(adapter: EngineAdapter, parsed: ParsedText, snap: Snapshot) -> None:
    mapped = adapter.mapped_families
    unmapped = []
    for fam in parsed.families:
        if not fam.startswith(adapter.prefixes) or fam.endswith("_created"):
            continue
        key = family_of(fam)
        if key in mapped or fam in mapped or key in adapter.ignored or fam in adapter.ignored:
            continue
        unmapped.append(fam)
    snap.unmapped = sorted(unmapped)


def translate_text(
    adapter: EngineAdapter,
    text: str,
    ctx: TranslateContext,
    extend: Hook | None = None,
    memo: TranslateMemo | None = None,
) -> Snapshot:
    """Parse and translate one text payload; ``extend`` and ``memo`` are a session's (see
    :meth:`EngineSession.translate`)."""
    parsed = textparse.parse(text, adapter.wanted, memo.lines if memo is not None else None)
    return translate_parsed(adapter, parsed, ctx, extend, memo)


def first(parsed: ParsedText, adapter: EngineAdapter, name: str) -> list[tuple[Labels, float]]:
    """Samples of ``name`` or of its first present alias."""
    for cand in _candidates(adapter, name):
        got = parsed.samples.get(cand)
        if got:
            return got
    return []


def info_key(ctx: TranslateContext, labels: dict[str, str]) -> SeriesKey:
    """Series key for ``ENGINE_INFO``: every info label present, ``unknown`` when not revealed."""
    full = {name: V.UNKNOWN for name in V.INFO_LABELS}
    full[V.LABEL_ENGINE_VERSION] = ctx.facts.version or V.UNKNOWN
    full.update({k: v for k, v in labels.items() if v})
    return ctx.key(full)
