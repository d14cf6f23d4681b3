"""Alertmanager webhook payloads (version 4) as Alertmanager 0.25+ sends them, for tests."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

ZERO_TIME = "0001-01-01T00:00:00Z"


def alert(
    name: str, labels: dict[str, str], *, status: str = "firing", starts: datetime, ends: datetime | None = None
) -> dict[str, Any]:
    full = {"alertname": name, **labels}
    fingerprint = hashlib.sha256(repr(sorted(full.items())).encode()).hexdigest()[:16]
    return {
        "status": status,
        "labels": full,
        "annotations": {"summary": f"{name} summary", "runbook_url": f"alerts/runbooks.md#{name.lower()}"},
        "startsAt": starts.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "endsAt": ends.astimezone(UTC).isoformat().replace("+00:00", "Z") if ends else ZERO_TIME,
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint,
    }


def notification(
    alerts: list[dict[str, Any]], *, group: dict[str, str], receiver: str = "inferwatch-page"
) -> dict[str, Any]:
    firing = any(a["status"] == "firing" for a in alerts)
    common = {k: v for k, v in alerts[0]["labels"].items() if all(a["labels"].get(k) == v for a in alerts)}
    return {
        "version": "4",
        "groupKey": "{}:{" + ",".join(f'{k}="{v}"' for k, v in sorted(group.items())) + "}",
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": receiver,
        "groupLabels": group,
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": alerts,
    }
