"""Alert webhooks: Alertmanager's notifications, incidents and their alerts and timeline, the delivery outbox.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False)


def _ref(owner: str, name: str, table: str) -> sa.Column[int]:
    return sa.Column(
        name,
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        sa.ForeignKey(f"{table}.id", name=op.f(f"fk_{owner}_{name}_{table}"), ondelete="CASCADE"),
        nullable=False,
    )


def _time(name: str, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _json(name: str, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "alert_notifications",
        _id(),
        _time("received_at"),
        sa.Column("receiver", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("group_key", sa.Text(), nullable=False),
        _json("group_labels"),
        _json("common_labels"),
        sa.Column("external_url", sa.Text(), nullable=True),
        sa.Column("alert_count", sa.Integer(), nullable=False),
        sa.Column("truncated_alerts", sa.Integer(), nullable=False),
        sa.Column("changes", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_notifications")),
    )
    op.create_index("ix_alert_notifications_received_at", "alert_notifications", ["received_at"])
    op.create_table(
        "incidents",
        _id(),
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("severity", sa.String(), nullable=True),
        _json("labels"),
        _time("opened_at"),
        _time("updated_at"),
        _time("resolved_at", nullable=True),
        sa.Column("enrichment_state", sa.String(length=16), nullable=False),
        _json("enrichment", nullable=True),
        _time("enriched_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incidents")),
    )
    op.create_index("ix_incidents_status_opened_at", "incidents", ["status", "opened_at"])
    op.create_index("ix_incidents_group_key", "incidents", ["group_key"])
    op.create_table(
        "alerts",
        _id(),
        _ref("alerts", "incident_id", "incidents"),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        _time("starts_at"),
        _time("ends_at", nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("alertname", sa.String(), nullable=False),
        sa.Column("severity", sa.String(), nullable=True),
        _json("labels"),
        _json("annotations"),
        sa.Column("generator_url", sa.Text(), nullable=True),
        _time("first_seen_at"),
        _time("last_seen_at"),
        _time("resolved_at", nullable=True),
        sa.Column("times_seen", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("fingerprint", "starts_at", name=op.f("uq_alerts_fingerprint_starts_at")),
    )
    op.create_index("ix_alerts_incident_id", "alerts", ["incident_id"])
    op.create_table(
        "incident_events",
        _id(),
        _ref("incident_events", "incident_id", "incidents"),
        _time("at"),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("alert_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("forward", sa.Boolean(), nullable=False),
        sa.Column("fanned_out", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incident_events")),
    )
    op.create_index("ix_incident_events_incident_id", "incident_events", ["incident_id"])
    op.create_index("ix_incident_events_fanned_out", "incident_events", ["forward", "fanned_out"])
    op.create_table(
        "deliveries",
        _id(),
        _ref("deliveries", "incident_id", "incidents"),
        _ref("deliveries", "event_id", "incident_events"),
        sa.Column("receiver", sa.String(), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=64), nullable=False),
        _json("payload"),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        _time("created_at"),
        _time("next_attempt_at"),
        _time("lease_until", nullable=True),
        _time("delivered_at", nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_deliveries_idempotency_key")),
        sa.UniqueConstraint("event_id", "receiver", name=op.f("uq_deliveries_event_id_receiver")),
    )
    op.create_index("ix_deliveries_state_next_attempt_at", "deliveries", ["state", "next_attempt_at"])
    op.create_index("ix_deliveries_incident_id", "deliveries", ["incident_id"])
    op.create_table(
        "delivery_attempts",
        _id(),
        _ref("delivery_attempts", "delivery_id", "deliveries"),
        _time("at"),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_seconds", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_delivery_attempts")),
    )
    op.create_index("ix_delivery_attempts_delivery_id", "delivery_attempts", ["delivery_id"])


def downgrade() -> None:
    for table in ("delivery_attempts", "deliveries", "incident_events", "alerts", "incidents", "alert_notifications"):
        op.drop_table(table)
