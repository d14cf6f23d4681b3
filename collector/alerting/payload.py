"""Alertmanager's webhook payload, version 4 (what Alertmanager 0.25 and later POST to a webhook).

Unknown fields are ignored (Alertmanager may add some); a missing or malformed required field, or
another version, is rejected with a message that says which.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SUPPORTED_VERSION = "4"
ZERO_TIME_YEAR = 1
"""Alertmanager sends ``endsAt: 0001-01-01T00:00:00Z`` for an alert that has not ended."""


class PayloadError(ValueError):
    """The body is not an Alertmanager version-4 webhook payload; the message says why."""


class AmAlert(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(min_length=1)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: datetime
    endsAt: datetime | None = None
    generatorURL: str = ""
    fingerprint: str = Field(min_length=1, max_length=64)

    @field_validator("startsAt", "endsAt")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return None if value.year == ZERO_TIME_YEAR else value

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")


class AmNotification(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: str
    groupKey: str = Field(min_length=1)
    truncatedAlerts: int = Field(0, ge=0)
    status: Literal["firing", "resolved"]
    receiver: str
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[AmAlert] = Field(min_length=1)


def parse(body: bytes) -> AmNotification:
    """Validate a webhook body; :class:`PayloadError` names what is wrong."""
    import json

    try:
        raw = json.loads(body)
    except ValueError as exc:
        raise PayloadError(f"the body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise PayloadError("the body is not a JSON object")
    version = raw.get("version")
    if version != SUPPORTED_VERSION:
        raise PayloadError(
            f"unsupported payload version {version!r}: Alertmanager's webhook version {SUPPORTED_VERSION} is expected"
        )
    try:
        return AmNotification.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(body)"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise PayloadError(f"{where}: {first['msg']}{more}") from None
