"""A fast, selective parser for the Prometheus text exposition format (0.0.4 and OpenMetrics text).

The exporter needs only the samples of the families it maps, so the parser takes the set of sample
names it wants and skips every other line after reading its name. Label sets are parsed with one
regular expression and memoised per payload (the same label string repeats across families).
It accepts what engines really send: ``_sum`` before buckets (multiprocess mode), families in any
order, blank lines between families, missing ``# HELP``, timestamps after the value, ``# EOF``.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]

_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')


class ParseError(ValueError):
    """The payload is not valid text exposition."""


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
    label_cache: dict[str, Labels] = {}
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
            labels = label_cache.get(raw)
            if labels is None:
                labels = parse_labels(raw)
                label_cache[raw] = labels
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
            rest = line[space:].split()
        if not rest:
            raise ParseError(f"line {lineno}: sample without a value: {line[:120]!r}")
        samples.setdefault(name, []).append((labels, parse_value(rest[0])))
    return out


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
