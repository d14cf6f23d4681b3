"""The selective text parser on the quirks engines really send."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.core import vocabulary as V
from inferwatch.exporters.samples import rebucket
from inferwatch.exporters.textparse import (
    DuplicateSeries,
    NonFiniteSample,
    ParseError,
    TruncatedPage,
    check_complete,
    parse,
    parse_labels,
    too_many_samples,
)


def test_skips_unwanted_and_reads_wanted() -> None:
    text = '# TYPE a counter\na_total{x="1"} 3\n\n# TYPE b gauge\nb 2.5 1700000000\nc{y="2"} 1\n'
    parsed = parse(text, {"b", "c"})
    assert parsed.get("b") == [((), 2.5)]
    assert parsed.get("c") == [((("y", "2"),), 1.0)]
    assert "a_total" not in parsed.samples
    assert parsed.families == {"a": "counter", "b": "gauge"}


def test_escapes_and_odd_values() -> None:
    labels = parse_labels(r'path="a\\b",msg="say \"hi\"\n",e=""')
    assert labels == (("path", "a\\b"), ("msg", 'say "hi"\n'), ("e", ""))
    parsed = parse('m{le="+Inf"} +Inf\nm{le="1"} NaN\nm{v="}"} 1\n', {"m"})
    values = [v for _, v in parsed.get("m")]
    assert values[0] == float("inf") and values[1] != values[1] and values[2] == 1.0


def test_label_values_with_spaces_and_braces() -> None:
    parsed = parse('info{a="x y",b="[1, 2]"} 1.0\n', {"info"})
    assert parsed.get("info") == [((("a", "x y"), ("b", "[1, 2]")), 1.0)]


@pytest.mark.parametrize("garbage", ["<html><body>oops</body></html>", '[{"iter": 1}]', 'm{a="1"}\n'])
def test_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(ParseError):
        parse(garbage, {"m"})


def test_invalid_value() -> None:
    with pytest.raises(ParseError):
        parse("m 12abc\n", {"m"})


def test_openmetrics_eof_and_empty() -> None:
    assert parse("# EOF\n", {"m"}).samples == {}
    assert parse("", {"m"}).samples == {}


def test_rebucket_exact_and_floor() -> None:
    source = [(0.5, 2.0), (1.0, 5.0), (2.0, 9.0)]
    counts, exact = rebucket(source, [0.5, 1.0, 2.0])
    assert counts == [2.0, 5.0, 9.0] and exact
    counts, exact = rebucket(source, [0.25, 0.75, 1.0, 4.0])
    assert counts == [0.0, 2.0, 5.0, 9.0] and not exact


bounds = st.lists(st.floats(min_value=1e-4, max_value=1e4, allow_nan=False), min_size=1, max_size=25, unique=True)


@given(
    obs=st.lists(st.floats(min_value=0, max_value=2e4, allow_nan=False), max_size=200),
    src=bounds,
    canon=bounds,
)
def test_rebucket_never_overstates(obs: list[float], src: list[float], canon: list[float]) -> None:
    src, canon = sorted(src), sorted(canon)
    source = [(b, float(sum(1 for o in obs if o <= b))) for b in src]
    counts, exact = rebucket(source, canon)
    for b, c in zip(canon, counts, strict=True):
        truth = sum(1 for o in obs if o <= b)
        assert c <= truth
        if b in src:
            assert c == truth
    assert counts == sorted(counts)
    assert exact == all(b in src for b in canon)


# -- duplicates, truncation, the sample limit --------------------------------------------------------
@pytest.mark.parametrize(
    "page",
    [
        'm{a="1",b="2"} 1\nm{a="1",b="2"} 2\n',
        'm{a="1",b="2"} 1\nm{b="2",a="1"} 2\n',
        "m 1\nm 2\n",
        'm{a="1"} 1\nx 3\n# TYPE y gauge\nm{ a = "1" } 1\n',
    ],
    ids=["same-line", "labels-reordered", "unlabelled", "far-apart"],
)
def test_a_series_given_twice_is_refused(page: str) -> None:
    with pytest.raises(DuplicateSeries, match="line"):
        parse(page, {"m"})


def test_distinct_series_and_unwanted_repeats_are_fine() -> None:
    parsed = parse('m{a="1"} 1\nm{a="2"} 2\nm_total{a="1"} 3\nskipped 1\nskipped 1\n', {"m", "m_total"})
    assert [v for _, v in parsed.get("m")] == [1.0, 2.0]


def test_complete_and_truncated_pages() -> None:
    check_complete("")
    check_complete("m 1\n")
    check_complete("# EOF\n")
    for cut in ("m 1", 'm{a="1"} 12', "# HELP m the"):
        with pytest.raises(TruncatedPage):
            check_complete("x 1\n" + cut)


def test_sample_limit_counts_samples_not_comments() -> None:
    page = '# HELP m h\n# TYPE m gauge\n\nm 1\nm{a="x"} 2\n\n'
    assert not too_many_samples(page, 2)
    assert too_many_samples(page, 1)
    assert not too_many_samples("", 0)


def test_every_refusal_carries_its_reason() -> None:
    assert ParseError("x").reason == V.SCRAPE_ERROR_INVALID
    assert DuplicateSeries("x").reason == V.SCRAPE_ERROR_DUPLICATE_SERIES
    assert TruncatedPage("x").reason == V.SCRAPE_ERROR_TRUNCATED
    assert NonFiniteSample("x").reason == V.SCRAPE_ERROR_NON_FINITE


# -- properties ------------------------------------------------------------------------------------
TOKENS = ["m", "m_total", "a", "{", "}", '"', "=", ",", " ", "\t", "\\", "\\n", '\\"', "1", "-2.5e3", "NaN", "+Inf"]
TOKENS += ["# TYPE m counter", "# HELP m x", "# EOF", "\n", "\n", "é", "\x00", "1700000000", "{}", "le"]
exposition_ish = st.lists(st.sampled_from(TOKENS), max_size=60).map("".join)


@settings(deadline=None, max_examples=300)
@given(text=st.one_of(st.text(max_size=300), exposition_ish), wanted=st.sets(st.sampled_from(["m", "m_total", "a"])))
def test_parse_raises_nothing_but_parse_error(text: str, wanted: set[str]) -> None:
    """Any input: a parse, or a ParseError (never an IndexError, a KeyError, a re error...)."""
    with contextlib.suppress(ParseError):
        parse(text, wanted)
    with contextlib.suppress(ParseError):
        check_complete(text)
    assert too_many_samples(text, 1_000) is False


metric_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,15}", fullmatch=True)
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True)
label_values = st.text(max_size=12)
label_sets = st.dictionaries(label_names, label_values, max_size=4)
values = st.floats(allow_nan=True, allow_infinity=True)
Family = tuple[str, str, str, list[tuple[dict[str, str], float, int | None]]]


@st.composite
def families(draw: st.DrawFn) -> list[Family]:
    names = draw(st.lists(metric_names, min_size=1, max_size=5, unique=True))
    out: list[Family] = []
    for name in names:
        kind = draw(st.sampled_from(["counter", "gauge", "untyped"]))
        help_text = draw(st.text(max_size=20))
        series = draw(st.lists(label_sets, max_size=5, unique_by=lambda d: frozenset(d.items())))
        stamps = st.one_of(st.none(), st.integers(min_value=0, max_value=2**45))
        out.append((name, kind, help_text, [(labels, draw(values), draw(stamps)) for labels in series]))
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write(fams: list[Family]) -> str:
    """Text exposition of ``fams``, written the way the format says (and engines do)."""
    lines = []
    for name, kind, help_text, series in fams:
        lines.append(f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, v, stamp in series:
            inside = ",".join(f'{k}="{_escape(val)}"' for k, val in labels.items())
            lbl = "{" + inside + "}" if labels else ""
            lines.append(f"{name}{lbl} {V.format_value(v)}" + (f" {stamp}" if stamp is not None else ""))
        lines.append("")
    return "\n".join(lines) + "\n"


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


@settings(deadline=None, max_examples=200)
@given(fams=families())
def test_well_formed_families_round_trip(fams: list[Family]) -> None:
    text = write(fams)
    check_complete(text)
    parsed = parse(text, {name for name, *_ in fams})
    assert parsed.families == {name: kind for name, kind, *_ in fams}
    for name, _, _, series in fams:
        got = parsed.get(name)
        assert [lb for lb, _ in got] == [tuple(labels.items()) for labels, _, _ in series]
        assert all(_same(g, v) for (_, g), (_, v, _) in zip(got, series, strict=True))
    total = sum(len(series) for *_, series in fams)
    assert not too_many_samples(text, total) and (total == 0 or too_many_samples(text, total - 1))


@settings(deadline=None, max_examples=100)
@given(fams=families(), data=st.data())
def test_a_repeated_series_is_always_caught(fams: list[Family], data: st.DataObject) -> None:
    with_series = [f for f in fams if f[3]]
    if not with_series:
        return
    name, kind, help_text, series = data.draw(st.sampled_from(with_series))
    labels, _, _ = data.draw(st.sampled_from(series))
    again = dict(reversed(list(labels.items())))  # the same set, written in another order
    text = write(fams) + write([(name, kind, help_text, [(again, 1.0, None)])])
    with pytest.raises(DuplicateSeries):
        parse(text, {name})


@settings(deadline=None, max_examples=100)
@given(fams=families(), data=st.data())
def test_a_page_cut_mid_line_is_always_caught(fams: list[Family], data: st.DataObject) -> None:
    text = write(fams)
    at = data.draw(st.integers(min_value=1, max_value=len(text) - 1))
    if text[at - 1] == "\n":
        check_complete(text[:at])  # cut at a line boundary: cannot be told from a complete page
    else:
        with pytest.raises(TruncatedPage):
            check_complete(text[:at])
