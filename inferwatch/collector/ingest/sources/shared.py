"""What the source modules share: OTLP value decoding, ids, times, resources and the span view.

Rejection reasons are short fixed strings (no ids, no values), so they can serve as a metric label.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from inferwatch.collector.store import record as R
from inferwatch.collector.store.record import RequestRecord

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
EARLIEST: Final = datetime(2000, 1, 1, tzinfo=UTC)
"""Spans starting before this are refused (a clock at 0, a unit error)."""
MAX_FUTURE: Final = timedelta(days=1)
"""Spans starting or ending more than this after the collector's clock are refused (a unit error, a broken clock)."""
INT64_MAX: Final = 2**63 - 1
INT32_MAX: Final = 2**31 - 1
TRACE_ID_BYTES: Final = 16
SPAN_ID_BYTES: Final = 8

SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
HOST_NAME: Final = "host.name"
PROCESS_PID: Final = "process.pid"


class Rejected(Exception):
    """A span a source claimed but cannot turn into a record; ``reason`` is a short fixed string."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- OTLP values -------------------------------------------------------------------------------------
def any_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a JSON-able Python value (bytes as base64, an empty value as ``None``)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, kind)


_SCALARS: Final = frozenset({"string_value", "double_value", "int_value", "bool_value"})


def attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP ``KeyValue`` list → dict (a repeated key keeps its last value, as the SDKs do)."""
    out: dict[str, Any] = {}
    scalars = _SCALARS
    for kv in kvs:  # the hot path of ingest: scalars inline, the rest through any_value
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = getattr(value, kind) if kind in scalars else any_value(value)
    return out


def hex_id(raw: bytes, size: int) -> str | None:
    """A trace (16 bytes) or span (8 bytes) id as lowercase hex; ``None`` when its length is wrong or it is all zero."""
    if len(raw) != size or not any(raw):
        return None
    return raw.hex()


def trace_id(raw: bytes) -> str | None:
    return hex_id(raw, TRACE_ID_BYTES)


def span_id(raw: bytes) -> str | None:
    return hex_id(raw, SPAN_ID_BYTES)


_EXACT_FLOAT_NS: Final = 2**32 * 10**9
"""Below this (the year 2106) a microsecond count divided by 10**6 is within a quarter of a microsecond of
the exact time, so :meth:`datetime.fromtimestamp` (which rounds to the nearest microsecond) gives it exactly."""


def timestamp(time_unix_nano: int) -> datetime:
    """``time_unix_nano`` → aware UTC datetime (microsecond precision, exact: the microseconds of the
    nanoseconds, truncated). Before 2106 through the float of the microseconds (exact there, a third of the
    time of the integer arithmetic, tested against it); after, by that arithmetic."""
    if time_unix_nano < _EXACT_FLOAT_NS:
        return datetime.fromtimestamp(time_unix_nano // 1000 / 1e6, UTC)
    return EPOCH + timedelta(microseconds=time_unix_nano // 1000)


@dataclass(frozen=True)
class ResourceInfo:
    service: str | None
    instance: str | None
    attributes: dict[str, Any] = field(default_factory=dict)


def resource_info(resource: Resource) -> ResourceInfo:
    """``service.name`` and the emitting process: ``service.instance.id``, else ``host.name/process.pid``."""
    attrs = attributes(resource.attributes)
    service = _text(attrs.get(SERVICE_NAME))
    instance = _text(attrs.get(SERVICE_INSTANCE_ID))
    if instance is None:
        parts = [p for p in (_text(attrs.get(HOST_NAME)), _text(attrs.get(PROCESS_PID))) if p is not None]
        instance = "/".join(parts) or None
    return ResourceInfo(service, instance, attrs)


def _text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return str(value)


# -- typed attribute access --------------------------------------------------------------------------
def number(attrs: Mapping[str, Any], key: str) -> float | None:
    """A float attribute (int, double or numeric string); ``Rejected`` for anything else."""
    return as_number(attrs.get(key), key)


def as_number(value: Any, key: str) -> float | None:
    """:func:`number` of the value of ``key``."""
    if value is None:
        return None
    if type(value) is float and math.isfinite(value):
        return value
    if isinstance(value, bool):
        raise Rejected(f"{key} is not a number")
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value)
        except ValueError:
            raise Rejected(f"{key} is not a number") from None
    else:
        raise Rejected(f"{key} is not a number")
    if not math.isfinite(result):
        raise Rejected(f"{key} is not finite")
    return result


_INTEGER = re.compile(r"-?[0-9]+")


def integer(attrs: Mapping[str, Any], key: str) -> int | None:
    """An int attribute (int, integral double or digit string); ``Rejected`` for anything else."""
    return as_integer(attrs.get(key), key)


def as_integer(value: Any, key: str) -> int | None:
    """:func:`integer` of the value of ``key``."""
    if value is None:
        return None
    if type(value) is int:
        return value
    if isinstance(value, bool):
        raise Rejected(f"{key} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value)
    raise Rejected(f"{key} is not an integer")


def text(attrs: Mapping[str, Any], key: str) -> str | None:
    """A string attribute; other scalars are stringified (trtllm-serve's request id is an int)."""
    return as_text(attrs.get(key))


def as_text(value: Any) -> str | None:
    """:func:`text` of a value."""
    if type(value) is str:
        return value or None
    if value is None or isinstance(value, list | dict):
        return None
    return str(value) if value != "" else None


def first_of(attrs: Mapping[str, Any], *keys: str) -> str | None:
    """The first key of ``keys`` present in ``attrs``."""
    return next((k for k in keys if k in attrs), None)


def string_list(value: Any) -> list[str]:
    """A string[] attribute that may also arrive JSON-encoded (``'["stop"]'``) or as one plain string."""
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v) for v in value if v is not None]
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                decoded = json.loads(stripped)
            except ValueError:
                decoded = None
            if isinstance(decoded, list):
                return [str(v) for v in decoded if v is not None]
        return [stripped] if stripped else []
    return [str(value)]


# -- the span as the sources see it ------------------------------------------------------------------
class ExportIndex:
    """All spans of one export request, to look up a span's descendants (TGI folds children in)."""

    def __init__(self) -> None:
        self._children: dict[tuple[bytes, bytes], list[SpanView]] = {}

    def add(self, view: SpanView) -> None:
        span = view.span
        if span.parent_span_id:
            self._children.setdefault((span.trace_id, span.parent_span_id), []).append(view)

    def children(self, view: SpanView) -> list[SpanView]:
        return self._children.get((view.span.trace_id, view.span.span_id), [])

    def descendants(self, view: SpanView, stop: Callable[[SpanView], bool] | None = None) -> Iterator[SpanView]:
        """Depth-first descendants in the same export; ``stop(child)`` true keeps its subtree out."""
        seen: set[bytes] = {view.span.span_id}
        stack = list(self.children(view))
        while stack:
            child = stack.pop()
            if child.span.span_id in seen:  # a malformed export could loop
                continue
            seen.add(child.span.span_id)
            if stop is not None and stop(child):
                continue
            yield child
            stack.extend(self.children(child))


@dataclass
class SpanView:
    """One span with its scope name, resource and decoded attributes."""

    span: Span
    scope: str
    resource: ResourceInfo
    index: ExportIndex
    _attrs: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attrs(self) -> dict[str, Any]:
        if self._attrs is None:
            self._attrs = attributes(self.span.attributes)
        return self._attrs

    @property
    def duration(self) -> float:
        """Seconds from start to end (0 when the end is missing or earlier)."""
        return max(0, self.span.end_time_unix_nano - self.span.start_time_unix_nano) / 1e9

    @property
    def failed(self) -> bool:
        return self.span.status.code == Status.STATUS_CODE_ERROR

    def error_text(self) -> str | None:
        """Why the span failed: the status message, else its first ERROR-level event's name, else ``error``."""
        if not self.failed:
            return None
        if self.span.status.message:
            return self.span.status.message
        for event in self.span.events:
            level = attributes(event.attributes).get("level")
            if isinstance(level, str) and level.upper() == "ERROR" and event.name:
                return str(event.name)
        return "error"


def base_record(
    view: SpanView, engine: str, unmapped: Mapping[str, Any], fields: Mapping[str, Any] | None = None
) -> RequestRecord:
    """The columns every source fills the same way: ids, times, service, instance, leftover attributes (a dict is
    taken as it is, not copied); ``fields``: more record fields (those :func:`split` read)."""
    span = view.span
    tid = trace_id(span.trace_id)
    if tid is None:
        raise Rejected("bad trace id")
    sid = span_id(span.span_id)
    if sid is None:
        raise Rejected("bad span id")
    if not span.start_time_unix_nano or not span.end_time_unix_nano:
        raise Rejected("span without start or end time")
    if span.end_time_unix_nano < span.start_time_unix_nano:
        raise Rejected("span ends before it starts")
    return RequestRecord(
        trace_id=tid,
        span_id=sid,
        engine=engine,
        start_time=timestamp(span.start_time_unix_nano),
        end_time=timestamp(span.end_time_unix_nano),
        instance=view.resource.instance,
        service=view.resource.service,
        attributes=unmapped if type(unmapped) is dict else dict(unmapped),
        **(fields or {}),
    )


def unmapped(attrs: Mapping[str, Any], mapped: Iterable[str]) -> dict[str, Any]:
    """``attrs`` without the keys stored in columns."""
    used = set(mapped)
    return {k: v for k, v in attrs.items() if k not in used}


# -- attribute → column tables -------------------------------------------------------------------------
Kind = Literal["float", "int", "str"]


@dataclass(frozen=True)
class Column:
    """Where one span attribute goes: a :class:`RequestRecord` field and the attribute's value kind."""

    field: str
    kind: Kind


def fill(record: RequestRecord, attrs: Mapping[str, Any], table: Mapping[str, Column]) -> None:
    """Set the record's fields from the attributes present in ``table`` (``Rejected`` on a wrong type)."""
    readers = {"float": number, "int": integer, "str": text}
    for key, column in table.items():
        if key in attrs:
            value = readers[column.kind](attrs, key)
            if value is not None:
                setattr(record, column.field, value)


def split(
    attrs: Mapping[str, Any], table: Mapping[str, Column], also: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One walk over the attributes: the record fields of those in ``table`` (converted to their kind;
    ``Rejected`` on a wrong type) and every other attribute but those in ``also`` (stored as they are).
    What :func:`fill` and :func:`unmapped` do, without walking the attributes twice."""
    fields: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in attrs.items():
        column = table.get(key)
        if column is None:
            if key not in also:
                rest[key] = value
            continue
        kind = column.kind
        if kind == "float":
            converted: Any = value if type(value) is float and math.isfinite(value) else as_number(value, key)
        elif kind == "int":
            converted = value if type(value) is int else as_integer(value, key)
        else:
            converted = as_text(value)
        if converted is not None:
            fields[column.field] = converted
    return fields, rest


MODEL_KEYS: Final = ("gen_ai.response.model", "gen_ai.request.model")


def model_of(view: SpanView) -> str | None:
    """The served model from the span's attributes, else from its resource (``None`` when neither says)."""
    for source in (view.attrs, view.resource.attributes):
        for key in MODEL_KEYS:
            value = text(source, key)
            if value is not None:
                return value
    return None


# -- validation of a mapped record ---------------------------------------------------------------------
LATENCIES: Final = (*(f for f in R.LATENCY_FIELDS if f != R.TPOT), R.TPOT)
"""The latency columns, the derived TPOT last (a reason names what the engine sent where it can)."""
TOKEN_FIELDS: Final = (R.PROMPT_TOKENS, R.GENERATION_TOKENS, R.CACHED_TOKENS, "max_tokens")
TEXT_FIELDS: Final = (
    "request_id",
    "model",
    "instance",
    "service",
    "finish_reason",
    "error",
    "lora_adapter",
    "tenant",
)
NUL: Final = "\x00"
REPLACEMENT: Final = "\ufffd"


def validate(record: RequestRecord, now: datetime) -> None:
    """Refuse (``Rejected``) a record whose times or values cannot be true; make its text storable.

    Times: starting before :data:`EARLIEST`, or starting or ending more than :data:`MAX_FUTURE` after
    ``now``. Latencies: negative or not finite. Counts: negative or beyond the columns (int64, ``n``
    int32). NUL characters, which PostgreSQL cannot store in text or JSON, become U+FFFD, and
    non-finite numbers among the attributes become strings (``"NaN"``, ``"Infinity"``), which JSON
    columns can hold.
    """
    if record.start_time < EARLIEST:
        raise Rejected("span starts before 2000")
    if record.start_time > now + MAX_FUTURE or record.end_time > now + MAX_FUTURE:
        raise Rejected("span time more than a day in the future")
    for name in LATENCIES:
        value = getattr(record, name)
        if value is None:
            continue
        if not math.isfinite(value):
            raise Rejected(f"{name} is not finite")
        if value < 0:
            raise Rejected(f"{name} is negative")
    for name in TOKEN_FIELDS:
        value = getattr(record, name)
        if value is not None and not 0 <= value <= INT64_MAX:
            raise Rejected(f"{name} out of range")
    if record.n is not None and not 0 <= record.n <= INT32_MAX:
        raise Rejected("n out of range")
    if record.temperature is not None and not math.isfinite(record.temperature):
        raise Rejected("temperature is not finite")
    for name in TEXT_FIELDS:
        value = getattr(record, name)
        if value is not None and NUL in value:
            setattr(record, name, value.replace(NUL, REPLACEMENT))
    if _needs_cleaning(record.attributes):
        record.attributes = _clean(record.attributes)


def _needs_cleaning(value: Any) -> bool:
    if type(value) is dict:  # the usual attributes: flat, without a call per value
        for k, v in value.items():
            t = type(v)
            if t is str:
                if NUL in v:
                    return True
            elif t is float:
                if not math.isfinite(v):
                    return True
            elif not (t is int or t is bool or v is None) and _needs_cleaning(v):
                return True
            if NUL in k:
                return True
        return False
    if isinstance(value, str):
        return NUL in value
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(NUL in k or _needs_cleaning(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_needs_cleaning(v) for v in value)
    return False


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k.replace(NUL, REPLACEMENT): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value
