"""Alertmanager's webhook payload, version 4 (what Alertmanager 0.25 and later POST to a webhook).

Unknown fields are ignored (Alertmanager may add some); a missing or malformed required field, or
another version, is rejected with a message that says which. The body is hostile until checked, and
every limit below is a :class:`PayloadError` (a 400 naming it), never a server error:

- **UTF-8 JSON**, nested at most :data:`MAX_DEPTH` arrays and objects deep. The depth is measured by a
  linear scan of the bytes before any parser sees them (Python's ``json`` recurses once per level: a
  body of 5,000 nested arrays raised ``RecursionError``). ``NaN`` and ``Infinity`` are not JSON.
- **Sizes**: at most :data:`MAX_ALERTS` alerts (Alertmanager's ``max_alerts`` in the webhook
  configuration keeps a larger group under it), :data:`MAX_PAIRS` labels or annotations per map,
  names of :data:`MAX_NAME_CHARS`, label values and other strings of :data:`MAX_VALUE_CHARS`,
  annotation values of :data:`MAX_ANNOTATION_CHARS` (the body itself is limited by the route to the
  setting ``max_webhook_bytes``, 1 MiB by default: a 413).
- **Integers**: ``truncatedAlerts`` in 0..:data:`MAX_TRUNCATED` (a PostgreSQL ``integer``), refused
  beyond rather than clamped: no Alertmanager truncates two billion alerts.
- **Times**: ``startsAt`` is a time in [now - :data:`MAX_AGE`, now + :data:`MAX_AHEAD`] (ten years
  back, a day ahead; not the zero time); ``endsAt`` is Alertmanager's zero time ``0001-01-01T00:00:00Z``
  (unset: Alertmanager sends it for every firing alert) or a time in the same window. The window is
  wide on the past side on purpose: Prometheus keeps an alert's ``startsAt`` for as long as it fires,
  and an always-firing alert (a Watchdog) or a long-standing warning is years old after a long uptime;
  refusing a notification loses it (Alertmanager does not retry a 4xx). It refuses what no sender
  means (``startsAt: 5`` is 1970, year 9999) and what overflows the date arithmetic of the enrichment
  and the pages.
- **alertname**: every alert has a non-empty ``alertname`` label (incidents, titles and messages are
  named by it).
- **Text the stores cannot hold** (NUL: PostgreSQL has none in text or JSON; lone UTF-16 surrogates,
  which have no UTF-8 encoding) is replaced by U+FFFD, as on the OTLP ingest: kept, not refused
  (Go's JSON encoder can write a NUL that a label value holds).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

SUPPORTED_VERSION = "4"
ZERO_TIME_YEAR = 1
"""Alertmanager sends ``endsAt: 0001-01-01T00:00:00Z`` for an alert that has not ended."""
ALERTNAME: Final = "alertname"

MAX_DEPTH: Final = 16
"""Arrays and objects nested in the body; Alertmanager's deepest is 4 (notification, alerts, alert, labels)."""
MAX_ALERTS: Final = 1000
MAX_PAIRS: Final = 256
"""Labels (or annotations) of one map."""
MAX_NAME_CHARS: Final = 1024
"""A label's or an annotation's name."""
MAX_VALUE_CHARS: Final = 16384
"""A label's value, and every other string of the payload but annotation values."""
MAX_ANNOTATION_CHARS: Final = 65536
MAX_TRUNCATED: Final = 2**31 - 1
"""Largest ``truncatedAlerts``: what the column (a PostgreSQL ``integer``) holds."""
MAX_AGE: Final = timedelta(days=3653)
"""Oldest ``startsAt`` (and ``endsAt``) accepted: ten years before now."""
MAX_AHEAD: Final = timedelta(days=1)
"""Latest ``startsAt`` (and ``endsAt``) accepted: a day after now (senders' clocks run ahead a little)."""
MAX_QUOTED: Final = 64
"""Characters of the body's own text quoted in a message."""

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_MAY_BE_UNSTORABLE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


class PayloadError(ValueError):
    """The body is not an Alertmanager version-4 webhook payload; the message says why."""


def nesting(body: bytes) -> int:
    """How deep arrays and objects nest in the JSON ``body`` (UTF-8), brackets in strings left out.

    Linear, in C loops: escapes go first (after them no string holds a quote), then every other
    quote-separated piece is outside strings; what is left is summed as +1 per opening bracket and -1
    per closing one. A body that is not JSON gets a number too; the parser refuses it after.
    """
    outside = b"".join(_ESCAPE.sub(b"", body).split(b'"')[::2])
    brackets = outside.translate(None, _NOT_BRACKET)
    if len(brackets) <= MAX_DEPTH:
        return len(brackets)
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets))))


def _storable(text: str) -> str:
    return _UNSTORABLE.sub("\ufffd", text)


def _clean(value: Any) -> Any:
    """``value`` with :func:`_storable` strings (keys too); depth is bounded by :data:`MAX_DEPTH`."""
    if isinstance(value, str):
        return _storable(value)
    if isinstance(value, dict):
        return {_storable(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _quote(value: Any) -> str:
    """``value`` as a message may quote it: its repr, cut to :data:`MAX_QUOTED` characters."""
    text = repr(value) if not isinstance(value, list | dict) else type(value).__name__
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 3] + "..."


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)]
Value = Annotated[str, StringConstraints(max_length=MAX_VALUE_CHARS)]
AnnotationValue = Annotated[str, StringConstraints(max_length=MAX_ANNOTATION_CHARS)]
Labels = Annotated[dict[Name, Value], Field(max_length=MAX_PAIRS)]
Annotations = Annotated[dict[Name, AnnotationValue], Field(max_length=MAX_PAIRS)]


def _in_window(value: datetime, info: ValidationInfo) -> datetime:
    given = info.context.get("now") if isinstance(info.context, dict) else None
    now = given if isinstance(given, datetime) else datetime.now(UTC)
    if not now - MAX_AGE <= value <= now + MAX_AHEAD:
        raise ValueError(
            f"{value.isoformat()} is outside the accepted window, from now - {MAX_AGE.days} days"
            f" to now + {MAX_AHEAD.days} day"
        )
    return value


def _utc(value: datetime) -> datetime:
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # year 1 east of UTC, year 9999 west of it
        raise ValueError("outside the range of dates") from None


class AmAlert(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: Labels = Field(min_length=1)
    annotations: Annotations = Field(default_factory=dict)
    startsAt: datetime
    endsAt: datetime | None = None
    generatorURL: Value = ""
    fingerprint: str = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _named(self) -> AmAlert:
        # after the fields: a message names the first malformed field before a missing name
        if not self.labels.get(ALERTNAME):
            raise ValueError(f"no {ALERTNAME} label: every alert needs one")
        return self

    @field_validator("startsAt")
    @classmethod
    def _start(cls, value: datetime, info: ValidationInfo) -> datetime:
        if value.year == ZERO_TIME_YEAR:
            raise ValueError("Alertmanager's zero time is not a start")
        return _in_window(_utc(value), info)

    @field_validator("endsAt")
    @classmethod
    def _end(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        if value is None or value.year == ZERO_TIME_YEAR:
            return None  # unset
        return _in_window(_utc(value), info)

    @property
    def alertname(self) -> str:
        return self.labels.get(ALERTNAME, "")


class AmNotification(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: str
    groupKey: Value = Field(min_length=1)
    truncatedAlerts: int = Field(0, ge=0, le=MAX_TRUNCATED)
    status: Literal["firing", "resolved"]
    receiver: Value
    groupLabels: Labels = Field(default_factory=dict)
    commonLabels: Labels = Field(default_factory=dict)
    commonAnnotations: Annotations = Field(default_factory=dict)
    externalURL: Value = ""
    alerts: list[AmAlert] = Field(min_length=1, max_length=MAX_ALERTS)


def parse(body: bytes, now: datetime | None = None) -> AmNotification:
    """Validate a webhook body (times against ``now``, default the clock); :class:`PayloadError` names what
    is wrong. Linear in the body's size, whatever it holds."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(f"the body is not UTF-8 JSON: an invalid byte at offset {exc.start}") from None
    depth = nesting(body)
    if depth > MAX_DEPTH:
        raise PayloadError(f"the body nests arrays and objects {depth} levels deep: at most {MAX_DEPTH} are accepted")
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"the body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise PayloadError("the body is not a JSON object")
    if _MAY_BE_UNSTORABLE.search(body):
        raw = _clean(raw)
    version = raw.get("version")
    if version != SUPPORTED_VERSION:
        raise PayloadError(
            f"unsupported payload version {_quote(version)}: Alertmanager's webhook version {SUPPORTED_VERSION}"
            " is expected"
        )
    try:
        return AmNotification.model_validate(raw, context={"now": now or datetime.now(UTC)})
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0]
        where = ".".join(_quote(p) if isinstance(p, str) and len(p) > MAX_QUOTED else str(p) for p in first["loc"])
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise PayloadError(f"{where or '(body)'}: {first['msg']}{more}") from None
