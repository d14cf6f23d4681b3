"""A fast, selective parser for the Prometheus text exposition format (0.0.4 and OpenMetrics text).

The exporter needs only the samples of the families it maps, so the parser takes the set of sample
names it wants and skips every other line after reading its name. Label sets are parsed with one
regular expression and memoised per payload (the same label string repeats across families).
It accepts what engines really send: ``_sum`` before buckets (multiprocess mode), families in any
order, blank lines between families, missing ``# HELP``, timestamps after the value, ``# EOF``.
A :class:`LineCache` kept across payloads of one target makes a page of the same shape as the last
one cost a dict look-up per line.

What it refuses, each with a :class:`ParseError` whose :attr:`~ParseError.reason` names the case:
a line that is not a comment, blank or a sample (``invalid``), and a series of a wanted sample
name given twice in one page, whatever the order of its labels (``duplicate_series``: Prometheus
refuses such a scrape, and summing them would invent values). Families it skips are not checked
for duplicates: they never reach the output. :func:`check_complete` refuses a page cut mid-line
(``truncated``) and :func:`too_many_samples` enforces a limit on sample lines.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Literal, cast

from inferwatch.core import vocabulary as V

Labels = tuple[tuple[str, str], ...]
_Pick = Callable[[list[Any]], Any]
"""a page's wanted lines' (labels, value) -> one name's: a list (a slice) or a tuple (``operator.itemgetter``)."""
_Entry = tuple[str, Labels, int]
"""a cached sample line: its sample name, its labels (source order) and its series id."""

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
    finite: bool = field(default=False, compare=False)
    """whether every wanted sample's value is known to be finite (False: not known; a cached parse
    tells it from the sum of the page's values, at C speed)."""
    shape: object = field(default=None, compare=False)
    """a cached parse's page plan: the same object for every page whose wanted samples have the same
    names and label sets, in the same order (``None``: a parse without cache)."""

    def get(self, name: str) -> list[tuple[Labels, float]]:
        return self.samples.get(name, [])


def parse_value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ParseError(f"invalid sample value {text!r}") from None


class _Mark:
    """What a comment or blank line's head stands for in :attr:`LineCache.heads` (``family``: the
    family a well-formed ``# TYPE`` line types; ``blank``: the empty line, whose head ``""`` a line
    without any space has too)."""

    __slots__ = ("blank", "family")

    def __init__(self, family: str | None = None, blank: bool = False) -> None:
        self.family = family
        self.blank = blank


_COMMENT = _Mark()
_BLANK = _Mark(blank=True)
_Head = _Entry | Literal[False] | _Mark


class LineCache:
    """What the lines of one target's earlier payloads parsed to, by *head* (a line less its last
    space-separated word, the value): an engine's page keeps its shape from scrape to scrape, so a line
    whose head was seen costs one dict look-up instead of a label parse, and a page whose heads are
    those of the last page, line for line, is read by the last page's plan: its values are taken by
    position, with no decision per line. Kept by a target's session; bounded to a few times the
    lines of the last payload (:func:`parse` empties it past that). Only for one set of wanted names."""

    __slots__ = (
        "blank_at",
        "canon",
        "heads",
        "labels",
        "last_entries",
        "pick",
        "plan",
        "prefixes",
        "type_families",
        "type_lines",
        "type_pick",
        "types",
        "value_slices",
        "wanted",
    )

    def __init__(self) -> None:
        self.heads: dict[str, _Head] = {}
        """head -> (sample name, labels, series id); False for a line of a name not wanted; a
        :class:`_Mark` for a comment or blank line."""
        self.labels: dict[str, Labels] = {}
        """raw label text -> labels, in source order."""
        self.canon: dict[tuple[str, Labels], tuple[str, Labels]] = {}
        """(name, labels in name order) -> itself: one object per series, whose id is the series id
        (equal sets written in another order get the same id; duplicates are found by id)."""
        self.wanted: object = None
        self.last_entries: list[_Entry] = []
        """the wanted lines' entries of the last page, in page order."""
        self.plan: tuple[list[str], list[_Pick], list[Labels]] = ([], [], [])
        """how the last page's values group into samples per name (see :func:`_grouping`)."""
        self.prefixes: list[str] | None = None
        """each line of the last page up to its value (its head and the space; ``""`` for a blank
        line); None when a line's head is not cached (a sample with a timestamp, an odd TYPE line)."""
        self.pick: Callable[[list[str]], tuple[str, ...]] = _picker([])
        """the last page's lines of wanted samples (their entries are :attr:`last_entries`)."""
        self.value_slices: list[slice] = []
        """where the value starts on each of those lines."""
        self.types: list[tuple[int, int, str]] = []
        """the last page's ``# TYPE`` lines: (line, where its type starts, the family)."""
        self.type_pick: Callable[[list[str]], tuple[str, ...]] = _picker([])
        """a page's lines at :attr:`types`."""
        self.type_lines: tuple[str, ...] | None = None
        """those lines of the last page read by plan, and the families they gave: a page whose TYPE
        lines are these, whole, gives the same (one tuple comparison instead of a slice per line)."""
        self.type_families: dict[str, str] = {}
        self.blank_at: list[int] = []
        """the last page's blank lines (a line without a space has the same head: it is checked)."""

    def clear(self) -> None:
        self.heads.clear()
        self.labels.clear()
        self.canon.clear()
        self.last_entries = []
        self.plan = ([], [], [])
        self.prefixes = None
        self.type_lines = None


def parse(text: str, wanted: Container[str], cache: LineCache | None = None) -> ParsedText:
    """Parse ``text``, keeping only samples whose metric name is in ``wanted``; ``cache`` (a target's)
    carries what earlier payloads' lines parsed to, and gives the same result faster.

    Raises :class:`ParseError` on a line that is not a comment, blank or a well-formed sample.
    """
    if cache is None:
        return _parse(text, wanted, LineCache(), False)
    if cache.wanted is not wanted:
        cache.clear()
        cache.wanted = wanted
    try:
        return _parse_cached(text, wanted, cache)
    except ParseError:
        # the reference parse says what is wrong, and where (the cached one keeps no line numbers)
        _parse(text, wanted, LineCache(), False)
        raise


def _parse(text: str, wanted: Container[str], cache: LineCache, remember: bool) -> ParsedText:
    """The reference parse: line by line, every check where the line is."""
    out = ParsedText()
    samples = out.samples
    families = out.families
    get_samples = samples.get
    seen: set[int] = set()
    seen_add = seen.add
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        if line[0] == "#":
            _type_line(line, families)
            continue
        entry, value = _sample(line, lineno, wanted, cache, remember)
        if entry is False:
            continue
        name, labels, sid = entry
        if sid in seen:
            raise DuplicateSeries(f"line {lineno}: series given twice in one page: {line[:120]!r}")
        seen_add(sid)
        number = parse_value(value)
        got = get_samples(name)
        if got is None:
            got = samples[name] = []
        got.append((labels, number))
    return out


def _parse_cached(text: str, wanted: Container[str], cache: LineCache) -> ParsedText:
    """:func:`_parse` with ``cache``. A page whose every line starts as the last page's did, up to its
    value, is read by the last page's plan (:func:`_by_plan`); another is read line by line, where a
    line whose head is known costs a look-up, and its plan is kept for the next. The values are
    converted in one pass and grouped by the plan. Its errors carry no line number (:func:`parse`
    finds it)."""
    out = ParsedText()
    families = out.families
    lines = text.split("\n")
    numbers = _by_plan(lines, cache, families)
    if numbers is None:
        families.clear()
        values, entries = _read_lines(lines, wanted, cache, families)
        if entries != cache.last_entries:
            if len({sid for _, _, sid in entries}) != len(entries):
                raise DuplicateSeries("a series is given twice in one page")
            cache.plan = _grouping(entries)
            cache.last_entries = entries
        _remember_page(cache, lines)
        try:
            numbers = list(map(float, values))
        except ValueError:
            raise ParseError("invalid sample value") from None
    total = sum(numbers)
    out.finite = total - total == 0.0  # a NaN or an infinity makes it NaN
    names, picks, labels = cache.plan
    out.shape = cache.plan
    # every wanted line's (labels, value), then each name's lines picked from them: C-level loops only
    pairs = list(zip(labels, numbers, strict=True))
    out.samples = dict(zip(names, map(list, map(operator.call, picks, repeat(pairs))), strict=True))
    if len(cache.heads) > 2 * len(lines) + 256:  # shapes that do not repeat (timestamps, churning labels)
        cache.clear()
    return out


def _read_lines(
    lines: list[str], wanted: Container[str], cache: LineCache, families: dict[str, str]
) -> tuple[list[str], list[_Entry]]:
    """The wanted lines' value texts and entries, line by line, caching each head met (the first page,
    or one whose shape changed); ``families`` gets the ``# TYPE`` lines."""
    heads = cache.heads
    get_head = heads.get
    values: list[str] = []
    entries: list[_Entry] = []
    for line in lines:
        if not line:
            heads[""] = _BLANK
            continue
        if line[0] == "#":
            head, _, word = line.rpartition(" ")
            if line.startswith("# TYPE "):
                _type_line(line, families)
                parts = line.split(" ")
                if len(parts) == 4 and parts[2] and word and word == word.strip():
                    heads[head] = _Mark(parts[2])  # else not cached: such a page is read line by line
            elif head not in heads:
                heads[head] = _COMMENT
            continue
        head, _, value = line.rpartition(" ")
        entry = get_head(head)
        if entry is None or entry.__class__ is _Mark:
            entry, value = _sample(line, 0, wanted, cache, True)
        if entry is not False:
            entries.append(cast(_Entry, entry))
            values.append(value)
    return values, entries


def _by_plan(lines: list[str], cache: LineCache, families: dict[str, str]) -> list[float] | None:
    """The wanted values of a page of the last page's shape, taken by position (its TYPE lines into
    ``families``); None when the page has another shape, or a value is not a plain number (then the
    page is read line by line, which tells a timestamp from garbage)."""
    prefixes = cache.prefixes
    if (
        prefixes is None
        or len(lines) != len(prefixes)
        or not all(map(str.startswith, lines, prefixes))
        or any(lines[i] for i in cache.blank_at)
    ):
        return None
    try:
        numbers = list(map(float, cast(Iterator[str], map(operator.getitem, cache.pick(lines), cache.value_slices))))
    except ValueError:
        return None
    type_lines = cache.type_pick(lines)
    if type_lines == cache.type_lines:
        families.update(cache.type_families)
    else:
        for i, start, family in cache.types:
            families[family] = lines[i][start:].strip()
        cache.type_lines = type_lines
        cache.type_families = dict(families)
    return numbers


def _picker(where: list[int]) -> Callable[[list[str]], tuple[str, ...]]:
    """``lines`` -> the lines at ``where``, as a tuple (``operator.itemgetter`` returns one item bare)."""
    if len(where) > 1:
        return cast(Callable[[list[str]], tuple[str, ...]], operator.itemgetter(*where))
    return lambda lines: tuple(lines[i] for i in where)


def _remember_page(cache: LineCache, lines: list[str]) -> None:
    """Keep the plan of a page just read line by line: each line up to its value, where the values
    and TYPE lines are; none when a line's head is not cached."""
    get_head = cache.heads.get
    heads = [line.rpartition(" ")[0] for line in lines]
    marks = list(map(get_head, heads))
    if None in marks:
        cache.prefixes = None
        return
    prefixes = cache.prefixes = ["" if m is _BLANK else h + " " for h, m in zip(heads, marks, strict=True)]
    values_at = [i for i, m in enumerate(marks) if m.__class__ is tuple]
    cache.pick = _picker(values_at)
    cache.value_slices = [slice(len(prefixes[i]), None) for i in values_at]
    cache.types = [
        (i, len(prefixes[i]), m.family) for i, m in enumerate(marks) if isinstance(m, _Mark) and m.family is not None
    ]
    cache.type_pick = _picker([i for i, _, _ in cache.types])
    cache.type_lines = None
    cache.blank_at = [i for i, m in enumerate(marks) if m is _BLANK]


def _grouping(entries: list[_Entry]) -> tuple[list[str], list[_Pick], list[Labels]]:
    """Per sample name, in order of first appearance: the name and how to pick its samples from the
    page's wanted lines (a slice where they are contiguous, else their positions); and the labels of
    every wanted line."""
    groups: dict[str, list[int]] = {}
    for i, (name, _, _) in enumerate(entries):
        where = groups.get(name)
        if where is None:
            where = groups[name] = []
        where.append(i)
    picks: list[_Pick] = []
    for where in groups.values():
        first, last = where[0], where[-1]
        if last - first + 1 == len(where):  # contiguous
            picks.append(operator.itemgetter(slice(first, last + 1)))
        else:
            picks.append(operator.itemgetter(*where))
    return list(groups), picks, [labels for _, labels, _ in entries]


def _type_line(line: str, families: dict[str, str]) -> None:
    if line.startswith("# TYPE "):
        parts = line.split(" ", 3)
        if len(parts) == 4:
            families[parts[2]] = parts[3].strip()


def _sample(
    line: str, lineno: int, wanted: Container[str], cache: LineCache, remember: bool
) -> tuple[_Entry | Literal[False], str]:
    """Parse one sample line whose head is not cached: (its entry, or False when its name is not
    wanted; its value text). With ``remember``, caches the entry when the line is ``head value``."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        if name not in wanted:
            return _unwanted(name, lineno, line, cache, remember)
        close = line.rfind("}")
        if close < brace:
            raise ParseError(f"line {lineno}: unterminated label set: {line[:120]!r}")
        raw = line[brace + 1 : close]
        labels = cache.labels.get(raw)
        if labels is None:
            labels = cache.labels[raw] = parse_labels(raw)
        end = close + 1
    else:
        if space == -1:
            if line.strip():
                raise ParseError(f"line {lineno}: sample without a value: {line[:120]!r}")
            return False, ""
        name = line[:space]
        if name not in wanted:
            return _unwanted(name, lineno, line, cache, remember)
        labels = ()
        end = space
    rest = line[end:].split()
    if not rest:
        raise ParseError(f"line {lineno}: sample without a value: {line[:120]!r}")
    series = (name, tuple(sorted(labels)))
    entry = (name, labels, id(cache.canon.setdefault(series, series)))
    if remember and line[end:] == " " + rest[0]:  # no timestamp, no odd spacing: the head is the series
        cache.heads[line[:end]] = entry
    return entry, rest[0]


def _unwanted(name: str, lineno: int, line: str, cache: LineCache, remember: bool) -> tuple[Literal[False], str]:
    """A line of a name not wanted: checked for garbage, its head cached (with ``remember``), skipped."""
    _check_name(name, lineno, line)
    if remember:
        _remember(cache, line, False)
    return False, ""


def _remember(cache: LineCache, line: str, entry: Literal[False]) -> None:
    """Cache a skipped line by its head (any line with that head has the same name)."""
    head = line.rpartition(" ")[0]
    if head:
        cache.heads[head] = entry


def check_complete(text: str) -> None:
    """Raise :class:`TruncatedPage` unless ``text`` is empty or ends with a newline (every line of
    the text format does): a page whose last line is cut, or lacks its newline, is incomplete.
    A page cut exactly at a line boundary cannot be told from a complete one."""
    if text and text[-1] != "\n":
        tail = text[text.rfind("\n") + 1 :]
        raise TruncatedPage(f"the page does not end with a newline (last line {tail[:80]!r}): it was cut")


def too_many_samples(text: str, limit: int) -> bool:
    """Whether ``text`` has more than ``limit`` sample lines (not comments, not blank).

    Its length bounds that from above (a sample line takes at least 4 characters: ``a 1`` and its
    newline), then its number of lines: a page under the limit costs at most one C-level count."""
    if len(text) // 4 + 1 <= limit or text.count("\n") + 1 <= limit:
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


def check_finite(parsed: ParsedText, names: Iterable[str]) -> None:
    """Raise :class:`NonFiniteSample` when a sample of ``names`` (those feeding a canonical counter or
    histogram: an adapter's ``strict_samples``) is NaN or infinite. Such a value is garbage (a counter counts
    events), and it cannot be dropped alone: where several series sum into one canonical series, serving the
    sum without it would look like a counter reset. Gauges may be NaN (the format allows it)."""
    if parsed.finite:  # every sample is: so are these
        return
    samples = parsed.samples
    for name in names:
        got = samples.get(name)
        if not got or math.isfinite(sum([v for _, v in got])):
            continue
        for labels, v in got:
            if not math.isfinite(v):
                shown = ",".join(f'{k}="{val}"' for k, val in labels)
                raise NonFiniteSample(f"{name}{{{shown}}} is {v!r}; a counter or histogram sample must be finite")
