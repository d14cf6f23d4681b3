"""Records as the store's rows and as the spool's lines, made in one pass, and what the database would refuse.

The ingest path's hot loop: every accepted record becomes a driver row (a tuple in :data:`ROW_COLUMNS`
order, values already in the form the driver takes, so no per-value bind processing happens at insert
time) and a spool line (:func:`record_to_json`); the attributes are serialised to JSON once and shared
by both. The row forms:

* SQLite: times as the text SQLAlchemy's ``DateTime`` stores on SQLite (``YYYY-MM-DD HH:MM:SS.ffffff``,
  UTC), the attributes as JSON text, booleans as the driver binds them (0/1);
* PostgreSQL: the row's line of COPY's text format (:data:`COPY_COLUMNS`, tab-separated, ``\\N`` for
  NULL, no newline), made here so that the collector's process sends the batch's text as it is instead of
  formatting every value through the driver (psycopg's ``write_row``, costly per row in the process that
  also receives and commits: docs/collector.md, 'measurements'). The numbers and times of a row are written
  by one ``orjson.dumps`` (shortest round-trip floats, RFC 3339 times) and the text columns joined as they
  are; a value that COPY would read differently (a backslash, tab, newline or carriage return in text, a
  non-finite float, a time not in UTC) sends its row down the field-by-field path (:func:`copy_line`), which
  escapes it.

JSON is written with orjson (faster than the standard library's C encoder on these records, the largest
cost of preparing one: docs/collector.md, 'measurements'), falling back to the standard library for what
orjson refuses or would change: lone surrogates, integers beyond 64 bits, non-string keys, and NaN/Infinity
(which orjson writes as ``null``). Either way a line reads back into the same record.

Nothing here imports SQLAlchemy or a driver: the module runs in the ingest worker processes too
(:mod:`inferwatch.collector.ingest.prepare`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from inferwatch.collector.store.record import RequestRecord

Row = tuple[Any, ...]
"""One record's values as a driver binds them, in :data:`ROW_COLUMNS` order (SQLite's row; :func:`values`)."""
DriverRow = Row | str
"""One record as :func:`inferwatch.collector.store.inserts.insert_rows` takes it: a :data:`Row` on SQLite, the line of
COPY's text format on PostgreSQL."""

DATETIME_FIELDS: Final[tuple[str, ...]] = ("start_time", "end_time")
RECORD_FIELDS: Final[frozenset[str]] = frozenset(f.name for f in dataclasses.fields(RequestRecord))
_PLAIN: Final[tuple[str, ...]] = tuple(
    f.name for f in dataclasses.fields(RequestRecord) if f.name not in (*DATETIME_FIELDS, "attributes")
)
ROW_COLUMNS: Final[tuple[str, ...]] = (*_PLAIN, *DATETIME_FIELDS, "attributes")
"""The request table's columns a row fills, in row order (``id`` and ``received_at`` are the insert's)."""
_plain: Final[Callable[[RequestRecord], tuple[Any, ...]]] = operator.attrgetter(*_PLAIN)
_FLOATS: Final[tuple[str, ...]] = tuple(
    f.name for f in dataclasses.fields(RequestRecord) if f.type in ("float | None", "float")
)
_floats: Final[Callable[[RequestRecord], tuple[Any, ...]]] = operator.attrgetter(*_FLOATS)
_TEXTS: Final[tuple[str, ...]] = tuple(
    f.name for f in dataclasses.fields(RequestRecord) if f.type in ("str | None", "str")
)
_SCALARS: Final[tuple[str, ...]] = tuple(
    f.name for f in dataclasses.fields(RequestRecord) if f.name not in (*_TEXTS, *DATETIME_FIELDS, "attributes")
)
COPY_COLUMNS: Final[tuple[str, ...]] = (*_TEXTS, *_SCALARS, *DATETIME_FIELDS, "attributes")
"""The columns of a PostgreSQL row's COPY line, in line order: the text columns, the numbers and flags, the
times, the attributes (the order that lets :func:`_copy_lines` write each group in one call)."""
_texts: Final[Callable[[RequestRecord], tuple[Any, ...]]] = operator.attrgetter(*_TEXTS)
_scalars_and_times: Final[Callable[[RequestRecord], tuple[Any, ...]]] = operator.attrgetter(*_SCALARS, *DATETIME_FIELDS)

DIALECTS: Final = ("sqlite", "postgresql")


# --- JSON (the spool's lines, the attributes column) ---------------------------------------------------------------


@functools.cache
def _encoder() -> json.JSONEncoder:
    return json.JSONEncoder(separators=(",", ":"), default=str, check_circular=False)


def dumps(value: Any) -> str:
    """Compact JSON (floats round-trip exactly), as the spool and the attributes column hold it."""
    out = _orjson(value)
    return _encoder().encode(value) if out is None else out.decode()


def _orjson(value: Any) -> bytes | None:
    """orjson's JSON of ``value``; None where it refuses it or would change it (then the standard library's)."""
    try:
        out = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # a lone surrogate, an int beyond 64 bits, a non-str key…
        return None
    if b"null" in out and _non_finite(value):  # orjson writes NaN and Infinity as null: keep them
        return None
    return out


def _non_finite(value: Any, depth: int = 0) -> bool:
    if type(value) is float:
        return not math.isfinite(value)
    if depth > 64:
        return True  # let the standard library's encoder decide
    if isinstance(value, dict):
        return any(_non_finite(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(v, depth + 1) for v in value)
    return False


def _utc(value: datetime) -> datetime:
    """Aware UTC (naive datetimes are taken to be UTC already, as the table's ``UTCDateTime`` does)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    if value.tzinfo is UTC:
        return value
    return value.astimezone(UTC)


def record_to_dict(record: RequestRecord) -> dict[str, Any]:
    """A JSON-ready dict of the record: datetimes as ISO 8601 strings (naive ones taken as UTC)."""
    data = dict(vars(record))
    for name in DATETIME_FIELDS:
        data[name] = _utc(data[name]).isoformat()
    return data


def record_from_dict(data: dict[str, Any]) -> RequestRecord:
    """The inverse of :func:`record_to_dict`; keys that are not record fields are ignored."""
    values = {k: v for k, v in data.items() if k in RECORD_FIELDS}
    for name in DATETIME_FIELDS:
        values[name] = _utc(datetime.fromisoformat(values[name]))
    return RequestRecord(**values)


def _floats_finite(record: RequestRecord) -> bool:
    """Every float field is a finite number or None (orjson would write NaN and Infinity as null); False also
    for a value that is not a number, which the standard library's encoder then names."""
    try:
        return math.isfinite(sum(filter(None, _floats(record))))
    except TypeError:
        return False


def _line(plain: tuple[Any, ...], start: datetime, end: datetime, attributes_json: str, *, finite: bool) -> str:
    """The spool line of a record from its parts (the attributes' JSON spliced in, not encoded again)."""
    data = dict(zip(_PLAIN, plain, strict=True))
    data["start_time"] = start.isoformat()
    data["end_time"] = end.isoformat()
    head = None
    if finite:
        try:
            head = orjson.dumps(data).decode()
        except (TypeError, orjson.JSONEncodeError):  # a lone surrogate, an int beyond 64 bits…
            head = None
    if head is None:
        head = _encoder().encode(data)
    return f'{head[:-1]},"attributes":{attributes_json}}}'


def _spool_line(
    record: RequestRecord, plain: tuple[Any, ...], start: datetime, end: datetime, *, finite: bool, utc: bool
) -> tuple[str, str]:
    """The record's spool line and its attributes' JSON (the column's text). ``finite``: its float fields are
    (:func:`_floats_finite`); ``utc``: both its times are aware UTC already."""
    raw = _orjson(record.attributes)
    if raw is not None and utc and finite:
        try:  # orjson writes the dataclass itself (its fields in order, times in ISO 8601): one C call for the
            # usual record, faster than assembling the line (docs/collector.md, 'measurements')
            return orjson.dumps(record).decode(), raw.decode()
        except (TypeError, orjson.JSONEncodeError):
            pass
    attributes = _encoder().encode(record.attributes) if raw is None else raw.decode()
    return _line(plain, start, end, attributes, finite=finite), attributes


def _is_utc(record: RequestRecord) -> bool:
    return record.start_time.tzinfo is UTC and record.end_time.tzinfo is UTC


def record_to_json(record: RequestRecord) -> str:
    """One line of JSON (no newline inside); floats round-trip exactly."""
    start, end = _utc(record.start_time), _utc(record.end_time)
    return _spool_line(record, _plain(record), start, end, finite=_floats_finite(record), utc=_is_utc(record))[0]


def record_from_json(line: str | bytes) -> RequestRecord:
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("a spooled record is a JSON object")
    return record_from_dict(data)


# --- rows ----------------------------------------------------------------------------------------------------------


def sqlite_time(value: datetime) -> str:
    """The text SQLAlchemy's ``DateTime`` stores on SQLite for ``value`` (UTC, naive taken as UTC)."""
    return _utc(value).replace(tzinfo=None).isoformat(" ", "microseconds")


def values(record: RequestRecord) -> Row:
    """The record's values in :data:`ROW_COLUMNS` order as psycopg binds them: times aware UTC, the attributes
    as JSON text (what :func:`copy_line` writes as text; also the baseline of ``bench/collector.py``)."""
    return (*_plain(record), _utc(record.start_time), _utc(record.end_time), dumps(record.attributes))


COPY_NULL: Final = "\\N"
_NULLS: Final[dict[Any, str]] = {None: COPY_NULL}
_COPY_SPECIAL: Final = re.compile("[\\\\\t\n\r]")
"""What COPY's text format reads as more than itself: the escape character, the delimiter, the row ends."""
_TAB: Final = "\t"
_TIME_QUOTES: Final = 2 * len(DATETIME_FIELDS)
"""The quotes of a fast row's numbers and times as orjson writes them: those of its two times."""
_COPY_ESCAPES: Final = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_field(value: Any) -> str:
    """One value in COPY's text format, escaped (the field-by-field path)."""
    if value is None:
        return COPY_NULL
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, datetime):
        return _utc(value).isoformat()
    return str(value).translate(_COPY_ESCAPES)


def copy_line(record: RequestRecord, attributes_json: str | None = None) -> str:
    """The record's line of PostgreSQL's COPY text format (:data:`COPY_COLUMNS`; no newline), field by field:
    every value escaped as COPY reads it back (the reference for the batched :func:`_copy_lines`)."""
    if attributes_json is None:
        attributes_json = dumps(record.attributes)
    fields = [getattr(record, name) for name in COPY_COLUMNS[:-1]]
    return "\t".join([*map(_copy_field, fields), attributes_json.translate(_COPY_ESCAPES)])


def _copy_lines(records: Sequence[RequestRecord], attributes: Sequence[str], fast: Sequence[bool]) -> list[str]:
    """The COPY lines of ``records`` (``attributes``: each one's JSON; ``fast``: its floats are finite and its
    times aware UTC). A fast record's text columns are joined as they are (None as ``\\N``) and its numbers,
    flags and times written by one ``orjson.dumps`` (``[1.5,false,null,"2024-05-01T12:00:00+00:00"]`` becomes
    ``1.5<TAB>false<TAB>\\N<TAB>2024-05-01T12:00:00+00:00``: no text there holds a comma, quote or ``null``
    but these); its row goes the field-by-field way when a text value needs escaping (checked once for the
    whole batch) or orjson refuses a value."""
    lines: list[str] = []
    texts: list[str] = []
    get = _NULLS.get
    dumps_ = orjson.dumps
    for record, attributes_json, ok in zip(records, attributes, fast, strict=True):
        line = None
        if ok:
            text = _texts(record)
            try:
                head = _TAB.join(map(get, text, text))
                scalars = dumps_(_scalars_and_times(record)).decode()
            except (TypeError, orjson.JSONEncodeError):  # not text where text belongs, an int beyond 64 bits…
                pass
            else:
                if scalars.count('"') == _TIME_QUOTES:  # else text where a number or a time belongs
                    texts += filter(None, text)
                    scalars = scalars[1:-1].replace(",", _TAB).replace("null", COPY_NULL).replace('"', "")
                    if "\\" in attributes_json:  # JSON's own escapes (a quote, a control character in a string)
                        attributes_json = attributes_json.replace("\\", "\\\\")
                    line = f"{head}\t{scalars}\t{attributes_json}"
        lines.append(copy_line(record, attributes_json) if line is None else line)
    if texts and _COPY_SPECIAL.search("".join(texts)):  # rare: find the fast rows that need escaping
        for i, (record, attributes_json, ok) in enumerate(zip(records, attributes, fast, strict=True)):
            if ok and any(isinstance(v, str) and _COPY_SPECIAL.search(v) for v in _texts(record)):
                lines[i] = copy_line(record, attributes_json)
    return lines


def prepare(records: Sequence[RequestRecord], dialect: str) -> tuple[list[DriverRow], list[str]]:
    """Each record's driver row for ``dialect`` (a :data:`Row` for SQLite, the COPY line for PostgreSQL) and
    its spool line (:func:`record_to_json`), in one pass."""
    if dialect not in DIALECTS:
        raise ValueError(f"the request store supports SQLite and PostgreSQL, not {dialect}")
    rows: list[DriverRow] = []
    lines: list[str] = []
    attributes: list[str] = []
    fast: list[bool] = []
    sqlite = dialect == "sqlite"
    for record in records:
        plain = _plain(record)
        utc = _is_utc(record)
        start, end = _utc(record.start_time), _utc(record.end_time)
        finite = _floats_finite(record)
        line, attributes_json = _spool_line(record, plain, start, end, finite=finite, utc=utc)
        lines.append(line)
        if sqlite:
            rows.append(
                (
                    *plain,
                    start.replace(tzinfo=None).isoformat(" ", "microseconds"),
                    end.replace(tzinfo=None).isoformat(" ", "microseconds"),
                    attributes_json,
                )
            )
        else:
            attributes.append(attributes_json)
            fast.append(finite and utc)
    if not sqlite:
        rows += _copy_lines(records, attributes, fast)
    return rows, lines


@dataclasses.dataclass(slots=True)
class Prepared:
    """Records ready to be written: each one's driver row (for one dialect) and its spool line, in order."""

    rows: list[DriverRow]
    lines: list[str]

    @classmethod
    def of(cls, records: Sequence[RequestRecord], dialect: str) -> Prepared:
        return cls(*prepare(records, dialect))

    def __len__(self) -> int:
        return len(self.rows)

    def part(self, start: int, stop: int) -> Prepared:
        return Prepared(self.rows[start:stop], self.lines[start:stop])

    def records(self) -> list[RequestRecord]:
        """The records again (read back from their spool lines)."""
        return [record_from_json(line) for line in self.lines]

    @classmethod
    def join(cls, parts: Sequence[Prepared]) -> Prepared:
        if len(parts) == 1:
            return parts[0]
        return cls([r for p in parts for r in p.rows], [line for p in parts for line in p.lines])


# --- what the database refuses -----------------------------------------------------------------------------------

INT64: Final = (-(2**63), 2**63 - 1)
INT32: Final = (-(2**31), 2**31 - 1)
_BIGINT_FIELDS: Final = ("prompt_tokens", "generation_tokens", "prefix_cache_hit_tokens", "max_tokens")
_TEXT_FIELDS: Final = (
    "trace_id",
    "span_id",
    "request_id",
    "engine",
    "model",
    "instance",
    "service",
    "finish_reason",
    "error",
    "lora_adapter",
    "tenant",
)
NUL: Final = "\x00"
_PG_BAD_TEXT: Final = re.compile("[\x00\ud800-\udfff]")
"""PostgreSQL text and JSON hold neither NUL nor a lone surrogate."""
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
"""No driver can encode a lone surrogate as UTF-8 (JSON text escapes it, which SQLite keeps)."""


def _json_refusal(value: Any, depth: int = 0) -> str | None:
    """Why PostgreSQL's jsonb refuses ``value`` (NUL or a lone surrogate, a non-finite number), else None."""
    if type(value) is dict and depth < 64:  # the usual attributes: flat, ASCII, finite, without a call per value
        for k, v in value.items():
            t = type(v)
            if not (
                (t is str and v.isascii() and NUL not in v)
                or t is int
                or t is bool
                or v is None
                or (t is float and math.isfinite(v))
            ) or not (type(k) is str and k.isascii() and NUL not in k):
                break
        else:
            return None
    if isinstance(value, str):
        return "a NUL character or lone surrogate in an attribute" if _PG_BAD_TEXT.search(value) else None
    if isinstance(value, float):
        return None if math.isfinite(value) else "a non-finite number in an attribute"
    if depth > 64:
        return "attributes nested too deep"
    if isinstance(value, dict):
        for k, v in value.items():
            reason = _json_refusal(k, depth + 1) or _json_refusal(v, depth + 1)
            if reason:
                return reason
    elif isinstance(value, list):
        for v in value:
            reason = _json_refusal(v, depth + 1)
            if reason:
                return reason
    return None


def refusal(record: RequestRecord, dialect: str) -> str | None:
    """Why the database (``sqlite`` or ``postgresql``) would refuse ``record``, or None.

    The column limits, checked before a record is accepted so that a client is told (a
    ``partial_success``) instead of the record being refused after the answer: integers within their
    columns (BIGINT; ``n`` INTEGER, 32-bit on PostgreSQL), no lone surrogate in text, and on PostgreSQL
    no NUL character in text or attributes and no NaN/Infinity among the attributes.
    """
    for name in _BIGINT_FIELDS:
        value = getattr(record, name)
        if value is not None and not INT64[0] <= value <= INT64[1]:
            return f"{name} out of range for the database"
    limits = INT32 if dialect == "postgresql" else INT64
    if record.n is not None and not limits[0] <= record.n <= limits[1]:
        return "n out of range for the database"
    postgres = dialect == "postgresql"
    for name in _TEXT_FIELDS:
        value = getattr(record, name)
        if value is None or (value.isascii() and (not postgres or NUL not in value)):
            continue  # ASCII holds no lone surrogate
        if (_PG_BAD_TEXT if postgres else _SURROGATE).search(value):
            return f"{name} has a character the database cannot store (NUL or a lone surrogate)"
    if dialect == "postgresql" and record.attributes:
        return _json_refusal(record.attributes)
    return None
