"""A fast, selective parser for the Prometheus text exposition format (0.0.4 and OpenMetrics text).

The exporter needs only the samples of the families it maps, so the parser takes the set of sample
names it wants and skips every other line after reading its name. Label sets are parsed with one
regular expression and memoised per payload (the same label string repeats across families).
It accepts what engines really send: ``_sum`` before buckets (multiprocess mode), families in any
order, blank lines between families, missing ``# HELP``, timestamps after the value, ``# EOF``.

What it refuses, each with a :class:`ParseError` whose :attr:`~ParseError.reason` names the case:
a line that is not a comment, blank or a sample (``invalid``), and a series of a wanted sample
name given twice in one page, whatever the order of its labels (``duplicate_series``: Prometheus
refuses such a scrape, and summing them would invent values). Families it skips are not checked
for duplicates: they never reach the output. :func:`check_complete` refuses a page cut mid-line
(``truncated``) and :func:`too_many_samples` enforces a limit on sample lines.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass, field

from inferwatch.core import vocabulary as V

Labels = tuple[tuple[str, str], ...]

_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')


class ParseError(ValueError):
    """The payload is not valid text exposition."""

    reason: str = V.SCRAPE_ERROR_INVALID
    """why, as the ``reason`` label of the exporter's scrape-error health series."""


class DuplicateSeries(ParseError):
    """One series (name and label set) appears twice in a page."""

    reason = V.SCRAPE_ERROR_DUPLICATE_SERIES


class TruncatedPage(ParseError):
    """The page does not end with a newline: it was cut mid-line."""

    reason = V.SCRAPE_ERROR_TRUNCATED


class NonFiniteSample(ParseError):
    """A counter or histogram sample is NaN or infinite (legal for gauges only)."""

    reason = V.SCRAPE_ERROR_NON_FINITE


def _unescape(value: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


def parse_labels(text: str) -> Labels:
    """Parse the inside of ``{...}`` into a tuple of ``(name, value)`` pairs, in source order."""
    pairs = _LABEL_RE.findall(text)
    if "\\" in text:
        pairs = [(k, _unescape(v)) for k, v in pairs]
    return tuple(pairs)


@dataclass
class ParsedText:
    """The samples of the wanted names, plus every family name announced by ``# TYPE``."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=dict)
    """family name -> type, from ``# TYPE`` lines."""
    sample_names: set[str] = field(default_factory=set)
    """Names of samples that had no ``# TYPE`` line (untyped), for unmapped-family accounting."""

    def get(self, name: str) -> list[tuple[Labels, float]]:
        return self.samples.get(name, [])


def parse_value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ParseError(f"invalid sample value {text!r}") from None


def parse(text: str, wanted: Container[str]) -> ParsedText:
    """Parse ``text``, keeping only samples whose metric name is in ``wanted``.

    Raises :class:`ParseError` on a line that is not a comment, blank or a well-formed sample.
    """
    out = ParsedText()
    samples = out.samples
    families = out.families
    label_cache: dict[str, tuple[Labels, int]] = {}
    """raw label text -> its labels, and the id of its label set in name order: one object per
    distinct set (kept alive in ``canon_sets``), so equal sets written in another order get the same
    id, and an int hashes for free where a tuple of pairs would be hashed again on every line."""
    canon_sets: dict[Labels, Labels] = {}
    seen: dict[str, tuple[set[int], list[tuple[Labels, float]]]] = {}
    """sample name -> the label sets seen, and its samples."""
    unlabelled = id(())
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# TYPE "):
                parts = line.split(" ", 3)
                if len(parts) == 4:
                    families[parts[2]] = parts[3].strip()
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            if name not in wanted:
                _check_name(name, lineno, line)
                continue
            close = line.rfind("}")
            if close < brace:
                raise ParseError(f"line {lineno}: unterminated label set: {line[:120]!r}")
            raw = line[brace + 1 : close]
            cached = label_cache.get(raw)
            if cached is None:
                labels = parse_labels(raw)
                ordered = tuple(sorted(labels))
                cached = label_cache[raw] = (labels, id(canon_sets.setdefault(ordered, ordered)))
            labels, canon = cached
            rest = line[close + 1 :].split()
        else:
            if space == -1:
                if line.strip():
                    raise ParseError(f"line {lineno}: sample without a value: {line[:120]!r}")
                continue
            name = line[:space]
            if name not in wanted:
                _check_name(name, lineno, line)
                continue
            labels = ()
            canon = unlabelled
            rest = line[space:].split()
        if not rest:
            raise ParseError(f"line {lineno}: sample without a value: {line[:120]!r}")
        entry = seen.get(name)
        if entry is None:
            entry = seen[name] = (set(), samples.setdefault(name, []))
        elif canon in entry[0]:
            raise DuplicateSeries(f"line {lineno}: series given twice in one page: {line[:120]!r}")
        entry[0].add(canon)
        entry[1].append((labels, parse_value(rest[0])))
    return out


def check_complete(text: str) -> None:
    """Raise :class:`TruncatedPage` unless ``text`` is empty or ends with a newline (every line of
    the text format does): a page whose last line is cut, or lacks its newline, is incomplete.
    A page cut exactly at a line boundary cannot be told from a complete one."""
    if text and text[-1] != "\n":
        tail = text[text.rfind("\n") + 1 :]
        raise TruncatedPage(f"the page does not end with a newline (last line {tail[:80]!r}): it was cut")


def too_many_samples(text: str, limit: int) -> bool:
    """Whether ``text`` has more than ``limit`` sample lines (not comments, not blank).

    Its number of lines bounds that from above, so a page under the limit costs one C-level count."""
    if text.count("\n") + 1 <= limit:
        return False
    n = 0
    for line in text.split("\n"):
        if line and line[0] != "#" and not line.isspace():
            n += 1
            if n > limit:
                return True
    return False


_NAME_OK = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


def _check_name(name: str, lineno: int, line: str) -> None:
    # Cheap sanity check on skipped lines so that garbage (HTML, JSON) is refused, not ignored.
    if not name or not (name[0].isalpha() or name[0] in "_:"):
        raise ParseError(f"line {lineno}: not a metric sample: {line[:120]!r}")


def looks_like_text_exposition(text: str) -> bool:
    """True when ``text`` plausibly is Prometheus text (empty counts: TGI sends nothing at first)."""
    stripped = text.lstrip()
    if not stripped:
        return True
    first = stripped[0]
    return first == "#" or bool(_NAME_OK.match(stripped.split("{", 1)[0].split(" ", 1)[0]))
