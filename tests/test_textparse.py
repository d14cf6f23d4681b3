"""The selective text parser on the quirks engines really send."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferwatch.exporters.model import rebucket
from inferwatch.exporters.textparse import ParseError, parse, parse_labels


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
