"""A target's memo (line cache, series keys, histogram plans, label texts) changes the cost of a
scrape, never its output: every fixture payload, translated by one long-lived session in any order,
renders byte for byte as a fresh translation without memo does; errors stay the same errors."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from inferwatch.core import vocabulary as V
from inferwatch.exporters import textparse
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.mapping import EngineSession, TranslateContext, translate_text
from inferwatch.exporters.render import RenderCache, format_values, render
from inferwatch.exporters.runtime import with_health
from inferwatch.exporters.samples import HistogramValue, Snapshot, merge_snapshots
from tests.conftest import ENGINE_FIXTURES, fixture_dirs
from tests.support.fixtures import fixture_context, fixture_payloads, fixture_session, load_fixture_meta

_VALUE = re.compile(r"^([^#\n][^\n]*) ([0-9.e+-]+)$", re.M)


def text_cases() -> list[tuple[Path, str]]:
    cases: list[tuple[Path, str]] = []
    for d in fixture_dirs():
        meta = load_fixture_meta(d)
        cases.extend((d, p) for p in fixture_payloads(meta) if not p.endswith(".json"))
    return cases


def _render(snap: Snapshot, ctx: TranslateContext, cache: RenderCache | None = None) -> str:
    return render(with_health(snap, "t", ctx.engine, {}, 0.0), ctx.vocabulary, cache=cache)


def _reference(session: EngineSession, text: str, ctx: TranslateContext) -> str:
    """The translation without memo (the session only lends its hook)."""
    return _render(translate_text(session.adapter, text, ctx, session.extend), ctx)


def scaled(text: str, factor: float) -> str:
    """The same page (same shape) with every finite sample value multiplied by ``factor``."""
    return _VALUE.sub(lambda m: f"{m.group(1)} {float(m.group(2)) * factor!r}", text)


@pytest.mark.parametrize("engine", sorted({d.relative_to(ENGINE_FIXTURES).parts[0] for d in fixture_dirs()}))
def test_one_session_renders_every_page_as_a_fresh_translation(engine: str, registry: EngineRegistry) -> None:
    cases = [(d, p) for d, p in text_cases() if d.relative_to(ENGINE_FIXTURES).parts[0] == engine]
    if not cases:
        pytest.skip(f"{engine} has no text payload")
    vocab = V.Vocabulary()
    sessions: dict[Path, EngineSession] = {}
    cache = RenderCache()  # one for all pages: layouts change, repeat and are kept
    checked = 0
    # twice over, and each page also with other values: shapes change, repeat and keep their plans
    for _ in range(2):
        for directory, payload in cases:
            meta = load_fixture_meta(directory)
            adapter = registry.get(str(meta["engine"]))
            ctx = fixture_context(directory, meta, adapter, vocab)
            session = sessions.setdefault(directory, fixture_session(meta, adapter))
            page = (directory / payload).read_text()
            for text in (page, scaled(page, 3.0), page):
                fresh = fixture_session(meta, adapter)
                got = _render(session.translate(text, ctx), ctx, cache)
                assert got == _reference(fresh, text, ctx), (directory, payload)
                checked += 1
    assert checked == 6 * len(cases)


def _vllm_case(registry: EngineRegistry) -> tuple[dict[str, Any], TranslateContext, EngineSession, str]:
    """The real vLLM capture's fixture: its meta, context, a session and its final page."""
    directory = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu"
    meta = load_fixture_meta(directory)
    adapter = registry.get(V.ENGINE_VLLM)
    ctx = fixture_context(directory, meta, adapter, V.Vocabulary())
    return meta, ctx, fixture_session(meta, adapter), (directory / "metrics-final.txt").read_text()


def test_scaled_values_reach_the_output(registry: EngineRegistry) -> None:
    """The plans carry positions, not values: a page of the same shape with other values renders them."""
    _, ctx, session, page = _vllm_case(registry)
    first = session.translate(page, ctx)
    second = session.translate(scaled(page, 2.0), ctx)
    ttft = first.histogram(V.TIME_TO_FIRST_TOKEN)
    ttft2 = second.histogram(V.TIME_TO_FIRST_TOKEN)
    assert ttft is not None and ttft2 is not None and ttft.inf > 0
    assert ttft2.inf == 2 * ttft.inf and ttft2.total == pytest.approx(2 * ttft.total)
    assert second.value(V.PROMPT_TOKENS) == 2 * first.value(V.PROMPT_TOKENS) > 0


def _page(*lines: str) -> str:
    return "\n".join(["# TYPE a counter", *lines]) + "\n"


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (_page('a_total{x="1"} 1', 'a_total{x="2"} 2', 'a_total{x="1"} 3'), textparse.DuplicateSeries),
        (_page('a_total{x="1",y="2"} 1', 'a_total{y="2",x="1"} 2'), textparse.DuplicateSeries),
        (_page('a_total{x="1"} 1', 'a_total{x="2"} one'), textparse.ParseError),
        (_page('a_total{x="1"} 1', "<html>"), textparse.ParseError),
    ],
)
def test_a_cached_parse_refuses_what_the_fresh_one_refuses(bad: str, error: type[Exception]) -> None:
    wanted = frozenset({"a_total"})
    cache = textparse.LineCache()
    good = _page('a_total{x="1"} 1', 'a_total{x="2"} 2')
    assert textparse.parse(good, wanted, cache).get("a_total") == [((("x", "1"),), 1.0), ((("x", "2"),), 2.0)]
    with pytest.raises(error) as fresh:
        textparse.parse(bad, wanted)
    with pytest.raises(error) as cached:
        textparse.parse(bad, wanted, cache)
    assert str(cached.value) == str(fresh.value)  # the line number too
    assert textparse.parse(good, wanted, cache).get("a_total")[1][1] == 2.0  # and it still parses pages after


def test_a_cached_parse_reads_timestamps_and_odd_spacing_as_the_fresh_one() -> None:
    wanted = frozenset({"a_total", "b"})
    cache = textparse.LineCache()
    for step in range(3):
        page = _page(f'a_total{{x="1"}} {step} 17000000{step}', f"b  {step}.5", f'a_total{{x="2"}}\t{step}')
        assert textparse.parse(page, wanted, cache) == textparse.parse(page, wanted)
    assert len(cache.heads) < 10


@pytest.mark.parametrize(
    "then",
    [
        # the shape of the first page, other values and types
        _page("# HELP a_total A.", "# TYPE a_total gauge", 'a_total{x="1"} 5', "", "# TYPE b counter", "b 7"),
        # a blank line becomes a line without a value (its head is the blank line's: "")
        _page("# HELP a_total A.", "# TYPE a_total counter", 'a_total{x="1"} 5', "junk", "# TYPE b counter", "b 7"),
        # a value that is not a number
        _page("# HELP a_total A.", "# TYPE a_total counter", 'a_total{x="1"} five', "", "# TYPE b counter", "b 7"),
        # a TYPE line with a word more, and one with a word less
        _page("# HELP a_total A.", "# TYPE a_total counter x", 'a_total{x="1"} 5', "", "# TYPE b counter", "b 7"),
        _page("# HELP a_total A.", "# TYPE a_total", 'a_total{x="1"} 5', "", "# TYPE b counter", "b 7"),
        _page("# HELP a_total A.", "# TYPE a_total  gauge", 'a_total{x="1"} 5', "", "# TYPE b counter", "b 7"),
        # a line more, a line less, two lines swapped
        _page("# HELP a_total A.", "# TYPE a_total counter", 'a_total{x="1"} 5', 'a_total{x="2"} 1', "", "b 7"),
        _page("# TYPE a_total counter", 'a_total{x="1"} 5', "", "# TYPE b counter", "b 7"),
        _page("# HELP a_total A.", "# TYPE a_total counter", "b 7", "", "# TYPE b counter", 'a_total{x="1"} 5'),
        # a timestamp after a value (read line by line), a name that the last one's is a prefix of
        _page(
            "# HELP a_total A.", "# TYPE a_total counter", 'a_total{x="1"} 5 1700000000', "", "# TYPE b counter", "b 7"
        ),
        _page("# HELP a_total A.", "# TYPE a_total counter", 'a_total{x="1"} 5', "", "# TYPE b counter", "bb 7"),
    ],
    ids=[
        "values-and-types",
        "blank-to-junk",
        "bad-value",
        "type-word-more",
        "type-word-less",
        "type-two-spaces",
        "more",
        "less",
        "swap",
        "timestamp",
        "longer-name",
    ],
)
def test_a_page_read_by_the_last_pages_plan_parses_as_the_fresh_one(then: str) -> None:
    """The plan of a page (where its values are, line by line) serves the next page only when every
    line's head is the same: any other page is read line by line, and refused where the fresh parse
    refuses it."""
    wanted = frozenset({"a_total", "b"})
    cache = textparse.LineCache()
    first = _page("# HELP a_total A.", "# TYPE a_total counter", 'a_total{x="1"} 1', "", "# TYPE b counter", "b 2")
    for page in (first, first, then, then, first):
        try:
            want = textparse.parse(page, wanted)
        except textparse.ParseError as exc:
            with pytest.raises(type(exc)):
                textparse.parse(page, wanted, cache)
            continue
        got = textparse.parse(page, wanted, cache)
        assert (got.samples, got.families) == (want.samples, want.families)
        assert list(got.families.items()) == list(want.families.items())
    assert cache.prefixes is not None  # the last page was read by its plan


def test_a_page_with_timestamps_has_no_plan_and_parses_as_the_fresh_one() -> None:
    wanted = frozenset({"a_total"})
    cache = textparse.LineCache()
    for step in range(3):
        page = _page("# TYPE a_total counter", f'a_total{{x="1"}} {step} 17000000{step}', f'a_total{{x="2"}} {step}')
        assert textparse.parse(page, wanted, cache) == textparse.parse(page, wanted)
        assert cache.prefixes is None


def test_the_line_cache_is_bounded_when_heads_never_repeat() -> None:
    wanted = frozenset({"a_total"})
    cache = textparse.LineCache()
    for step in range(50):
        page = _page(*(f'a_total{{x="{step}-{i}"}} 1' for i in range(100)))
        textparse.parse(page, wanted, cache)
        assert len(cache.heads) <= 2 * 102 + 256


def test_a_histogram_with_a_boundary_written_twice_is_translated_without_plan(registry: EngineRegistry) -> None:
    adapter = registry.get(V.ENGINE_VLLM)
    name = next(r.sources[0] for r in adapter.rows if r.metric is V.TIME_TO_FIRST_TOKEN)
    lbl = 'engine="0",model_name="m"'
    page = "\n".join(
        [
            f"# TYPE {name} histogram",
            f'{name}_bucket{{{lbl},le="1"}} 3',
            f'{name}_bucket{{{lbl},le="1.0"}} 2',
            f'{name}_bucket{{{lbl},le="+Inf"}} 4',
            f"{name}_count{{{lbl}}} 4",
            f"{name}_sum{{{lbl}}} 2.5",
        ]
    )
    ctx = TranslateContext(engine=adapter.name)
    session = adapter.open()
    for _ in range(2):
        assert _render(session.translate(page + "\n", ctx), ctx) == _reference(adapter.open(), page + "\n", ctx)
    assert session.memo is not None
    assert all(rows is not adapter.rows for _, rows, _ in session.memo.programs.values())  # nothing to replay


def test_format_values_is_format_value_for_any_value() -> None:
    values: list[float] = [0.0, -0.0, 1.0, 1e21, 0.1 + 0.2, 3.0]
    assert format_values(values) == [V.format_value(v) for v in values]
    odd: list[float] = [1.0, 2, math.nan, math.inf, -math.inf, True, 1e308, 1e308]
    cases: list[list[float]] = [odd, [2, 3], [math.nan], [1e308, 1e308]]
    for case in cases:
        assert format_values(case) == [V.format_value(v) for v in case]


def test_merging_leaves_the_merged_snapshots_as_they_were() -> None:
    key = (("engine", "x"),)
    a, b = Snapshot(), Snapshot()
    a.add_histogram(V.TIME_TO_FIRST_TOKEN, key, HistogramValue((1.0,), [1.0], 2.0, 3.0))
    b.add_histogram(V.TIME_TO_FIRST_TOKEN, key, HistogramValue((1.0,), [4.0], 5.0, 6.0))
    a.add_value(V.PROMPT_TOKENS, key, 1.0)
    b.add_value(V.PROMPT_TOKENS, key, 2.0)
    merged = merge_snapshots([a, b])
    again = merge_snapshots([merged, b])
    assert merged.histograms[V.TIME_TO_FIRST_TOKEN][key] == HistogramValue((1.0,), [5.0], 7.0, 9.0)
    assert again.histograms[V.TIME_TO_FIRST_TOKEN][key] == HistogramValue((1.0,), [9.0], 12.0, 15.0)
    assert a.histograms[V.TIME_TO_FIRST_TOKEN][key] == HistogramValue((1.0,), [1.0], 2.0, 3.0)
    assert b.histograms[V.TIME_TO_FIRST_TOKEN][key] == HistogramValue((1.0,), [4.0], 5.0, 6.0)
    assert (a.value(V.PROMPT_TOKENS), merged.value(V.PROMPT_TOKENS), again.value(V.PROMPT_TOKENS)) == (1.0, 3.0, 5.0)


def test_a_page_of_a_known_shape_replays_its_recorded_steps(
    registry: EngineRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of a shape translated before is translated by the steps recorded then (no row is looked
    up again), with its own values; a page of another shape is translated row by row."""
    from inferwatch.exporters import mapping

    meta, ctx, session, page = _vllm_case(registry)
    adapter = session.adapter
    session.translate(page, ctx)

    def looked_up(*_: object) -> list[str]:
        raise AssertionError("a row was looked up")

    text = scaled(page, 2.0)
    expected = _reference(fixture_session(meta, adapter), text, ctx)
    monkeypatch.setattr(mapping, "_row_names", looked_up)
    assert _render(session.translate(text, ctx), ctx) == expected
    other = "\n".join(line for line in page.splitlines() if 'le="+Inf"' not in line) + "\n"
    with pytest.raises(AssertionError, match="a row was looked up"):
        session.translate(other, ctx)


def test_huge_finite_values_are_finite_and_a_nan_is_not() -> None:
    """The finiteness check sums at C speed; finite values whose sum overflows are still finite (they
    once raised StopIteration, a scrape failing as an internal error), and a NaN is caught."""
    from inferwatch.exporters.samples import check_finite_snapshot
    from inferwatch.exporters.textparse import NonFiniteSample

    snap = Snapshot()
    assert V.PROMPT_TOKENS.kind is V.Kind.COUNTER
    for model in ("a", "b"):
        snap.add_value(V.PROMPT_TOKENS, ((V.LABEL_MODEL, model),), 1e308)
    snap.add_histogram(V.TIME_TO_FIRST_TOKEN, ((V.LABEL_MODEL, "a"),), HistogramValue((1.0,), [1e308], 1e308, 1e308))
    check_finite_snapshot(snap)
    nan = Snapshot()
    nan.add_histogram(V.TIME_TO_FIRST_TOKEN, ((V.LABEL_MODEL, "a"),), HistogramValue((1.0,), [math.nan], 1.0, 1.0))
    with pytest.raises(NonFiniteSample, match="histogram"):
        check_finite_snapshot(nan)
    snap.add_value(V.PROMPT_TOKENS, ((V.LABEL_MODEL, "c"),), math.inf)
    with pytest.raises(NonFiniteSample, match="counter"):
        check_finite_snapshot(snap)
