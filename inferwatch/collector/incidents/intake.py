"""Store one Alertmanager notification: alerts once, incidents, the timeline, and what to forward.

An alert is identified by Alertmanager's fingerprint and its ``startsAt``: a re-send (repeat
interval, a retry after a timeout, the other member of an HA pair) changes nothing but its
``last_seen_at``. An incident is one episode of an Alertmanager group (its ``groupKey``): opened
by its first firing alert, resolved when every alert in it is resolved; a group that fires again
later opens a new incident. A notification that changes a state adds one forwarded event to the
incident's timeline (``firing`` for the first alerts, ``updated`` for later ones, ``resolved`` at
the end); one that changes nothing adds none, so receivers hear of each change once.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, select, text, update

from inferwatch.collector.incidents.payload import ALERTNAME, AmAlert, AmNotification
from inferwatch.collector.store.tables import ALERTS_TABLE, INCIDENT_EVENTS_TABLE, INCIDENTS_TABLE, NOTIFICATIONS_TABLE

FIRING = "firing"
RESOLVED = "resolved"
PENDING = "pending"
SKIPPED = "skipped"
SEVERITY_LABEL = "severity"
MAX_NAMES = 10
"""Alert names an incident's title or a timeline event lists (then "N more")."""
MAX_TITLE_CHARS = 1000
"""Longest title or timeline detail (a notification may carry 1,000 alerts of long names and labels)."""


@dataclass
class Intake:
    notification_id: int
    incident_ids: list[int] = field(default_factory=list)
    new_alerts: int = 0
    resolved_alerts: int = 0
    repeats: int = 0
    events: int = 0

    @property
    def changes(self) -> int:
        return self.new_alerts + self.resolved_alerts


def _lock_key(group_key: str) -> int:
    return int.from_bytes(hashlib.sha256(group_key.encode()).digest()[:8], "big", signed=True)


def _names(names: Sequence[str], sep: str) -> str:
    """Distinct ``names`` joined by ``sep``: the first :data:`MAX_NAMES`, then how many more."""
    distinct = sorted(set(names))
    shown = sep.join(distinct[:MAX_NAMES])
    return f"{shown}{sep}{len(distinct) - MAX_NAMES} more" if len(distinct) > MAX_NAMES else shown


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TITLE_CHARS else text[: MAX_TITLE_CHARS - 1] + "\u2026"


def _title(note: AmNotification) -> str:
    labels = {k: v for k, v in note.groupLabels.items() if k != ALERTNAME}
    where = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    title = _names([a.alertname for a in note.alerts if a.alertname], " + ") or "alert"
    return _cut(f"{title} ({where})" if where else title)


def _severity(alerts: Sequence[AmAlert]) -> str | None:
    found = [a.labels.get(SEVERITY_LABEL) for a in alerts if a.labels.get(SEVERITY_LABEL)]
    for preferred in ("page", "critical", "ticket", "warning"):
        if preferred in found:
            return preferred
    return found[0] if found else None


class Intaker:
    """Records notifications; serialised in this process, and per group with a lock on PostgreSQL."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()

    def record(self, note: AmNotification, now: datetime) -> Intake:
        with self._lock, self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # HA pairs and several collectors: one group at a time
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key(note.groupKey)})
            return self._record(conn, note, now)

    def _record(self, conn: Connection, note: AmNotification, now: datetime) -> Intake:
        n = NOTIFICATIONS_TABLE
        note_id = conn.execute(
            n.insert()
            .values(
                received_at=now,
                receiver=note.receiver,
                status=note.status,
                group_key=note.groupKey,
                group_labels=note.groupLabels,
                common_labels=note.commonLabels,
                external_url=note.externalURL or None,
                alert_count=len(note.alerts),
                truncated_alerts=note.truncatedAlerts,
                changes=0,
            )
            .returning(n.c.id)
        ).scalar_one()
        intake = Intake(notification_id=int(note_id))
        i, a = INCIDENTS_TABLE, ALERTS_TABLE
        open_row = conn.execute(
            select(i.c.id).where(i.c.group_key == note.groupKey, i.c.status == FIRING).order_by(i.c.id.desc()).limit(1)
        ).first()
        incident_id: int | None = int(open_row[0]) if open_row else None
        opened_now = False
        new_names: list[str] = []
        resolved_names: list[str] = []
        touched: set[int] = set()
        for alert in note.alerts:
            row = conn.execute(
                select(a.c.id, a.c.status, a.c.incident_id).where(
                    a.c.fingerprint == alert.fingerprint, a.c.starts_at == alert.startsAt
                )
            ).first()
            if row is not None:
                alert_id, status, owner = int(row[0]), str(row[1]), int(row[2])
                values: dict[str, Any] = {"last_seen_at": now, "times_seen": a.c.times_seen + 1}
                if status == FIRING and alert.status == RESOLVED:
                    values.update(status=RESOLVED, ends_at=alert.endsAt, resolved_at=now)
                    resolved_names.append(alert.alertname)
                    touched.add(owner)
                    self._event(conn, owner, now, RESOLVED, f"{alert.alertname} resolved", alert_id, forward=False)
                elif status == RESOLVED and alert.status == FIRING:
                    # fired again with the same startsAt (senders other than Prometheus do this): the
                    # alert joins the group's open incident, or opens one, and is forwarded again
                    if incident_id is None:
                        incident_id, opened_now = self._open(conn, note, now), True
                    values.update(status=FIRING, ends_at=alert.endsAt, resolved_at=None, incident_id=incident_id)
                    new_names.append(alert.alertname)
                    touched.add(incident_id)
                    detail = f"{alert.alertname} firing again"
                    self._event(conn, incident_id, now, FIRING, detail, alert_id, forward=False)
                else:
                    intake.repeats += 1
                conn.execute(update(a).where(a.c.id == alert_id).values(**values))
                continue
            if alert.status == RESOLVED and incident_id is None:
                # resolved before we ever saw it fire (e.g. the collector was down): keep it, forward nothing
                intake.repeats += 1
                continue
            if incident_id is None:
                incident_id, opened_now = self._open(conn, note, now), True
            alert_id = int(
                conn.execute(
                    a.insert()
                    .values(
                        incident_id=incident_id,
                        fingerprint=alert.fingerprint,
                        starts_at=alert.startsAt,
                        ends_at=alert.endsAt,
                        status=alert.status,
                        alertname=alert.alertname,
                        severity=alert.labels.get(SEVERITY_LABEL),
                        labels=alert.labels,
                        annotations=alert.annotations,
                        generator_url=alert.generatorURL or None,
                        first_seen_at=now,
                        last_seen_at=now,
                        resolved_at=now if alert.status == RESOLVED else None,
                        times_seen=1,
                    )
                    .returning(a.c.id)
                ).scalar_one()
            )
            touched.add(incident_id)
            if alert.status == FIRING:
                new_names.append(alert.alertname)
                self._event(conn, incident_id, now, FIRING, f"{alert.alertname} firing", alert_id, forward=False)
        intake.new_alerts, intake.resolved_alerts = len(new_names), len(resolved_names)
        if new_names and incident_id is not None:
            kind = FIRING if opened_now else "updated"
            detail = _cut(f"{len(new_names)} alert(s) firing: {_names(new_names, ', ')}")
            self._event(conn, incident_id, now, kind, detail, None, forward=True)
            intake.events += 1
            if not opened_now:  # more alerts: the enrichment is redone for the new state
                conn.execute(update(i).where(i.c.id == incident_id).values(enrichment_state=PENDING))
        for owner in sorted(touched):
            still = conn.execute(select(a.c.id).where(a.c.incident_id == owner, a.c.status == FIRING).limit(1)).first()
            conn.execute(update(i).where(i.c.id == owner).values(updated_at=now))
            if still is None:
                status = conn.execute(select(i.c.status).where(i.c.id == owner)).scalar_one()
                if status == FIRING:
                    conn.execute(update(i).where(i.c.id == owner).values(status=RESOLVED, resolved_at=now))
                    self._event(conn, owner, now, RESOLVED, "every alert resolved", None, forward=True)
                    intake.events += 1
        intake.incident_ids = sorted(touched)
        conn.execute(update(n).where(n.c.id == intake.notification_id).values(changes=intake.changes))
        return intake

    @staticmethod
    def _open(conn: Connection, note: AmNotification, now: datetime) -> int:
        """A new firing incident for ``note``'s group."""
        i = INCIDENTS_TABLE
        return int(
            conn.execute(
                i.insert()
                .values(
                    group_key=note.groupKey,
                    status=FIRING,
                    title=_title(note),
                    severity=_severity(note.alerts),
                    labels={**note.commonLabels, **note.groupLabels},
                    opened_at=now,
                    updated_at=now,
                    enrichment_state=PENDING,
                )
                .returning(i.c.id)
            ).scalar_one()
        )

    @staticmethod
    def _event(
        conn: Connection, incident_id: int, at: datetime, kind: str, detail: str, alert_id: int | None, *, forward: bool
    ) -> None:
        conn.execute(
            INCIDENT_EVENTS_TABLE.insert().values(
                incident_id=incident_id,
                at=at,
                kind=kind,
                detail=detail,
                alert_id=alert_id,
                forward=forward,
                fanned_out=False,
            )
        )
