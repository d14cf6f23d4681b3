"""Stats at scale: an end_time index, the covering stats indexes by end time (with instance), and the
per-minute/per-hour rollups with their watermark.

The covering indexes are rebuilt: on a large table this migration takes minutes (PostgreSQL: about 1 min per
index per 10M rows on a 2-core machine) and holds the table's write lock meanwhile.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "inference_requests"
STATS_COLUMNS = ("time_to_first_token", "time_per_output_token", "request_duration", "request_queue")
ROLLUPS = "request_rollups"


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False)


def upgrade() -> None:
    op.create_index(op.f(f"ix_{TABLE}_end_time"), TABLE, ["end_time"])
    for col in STATS_COLUMNS:
        op.drop_index(op.f(f"ix_{TABLE}_{col}_stats"), table_name=TABLE)
        op.create_index(op.f(f"ix_{TABLE}_{col}_stats"), TABLE, [col, "end_time", "engine", "model", "instance"])
    op.create_table(
        ROLLUPS,
        _id(),
        sa.Column("period_seconds", sa.Integer(), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=True),
        sa.Column("instance", sa.String(), nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("failed", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens_count", sa.BigInteger(), nullable=False),
        sa.Column("generation_tokens", sa.BigInteger(), nullable=False),
        sa.Column("generation_tokens_count", sa.BigInteger(), nullable=False),
        *(
            c
            for col in STATS_COLUMNS
            for c in (
                sa.Column(f"{col}_count", sa.BigInteger(), nullable=False),
                sa.Column(f"{col}_sketch", sa.LargeBinary(), nullable=False),
            )
        ),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{ROLLUPS}")),
    )
    op.create_index(op.f(f"ix_{ROLLUPS}_period_seconds"), ROLLUPS, ["period_seconds", "period_start"])
    op.create_table(
        "rollup_state",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("folded_id", sa.BigInteger(), nullable=False),
        sa.Column("seen_id", sa.BigInteger(), nullable=True),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_rollup_state")),
    )


def downgrade() -> None:
    op.drop_table("rollup_state")
    op.drop_index(op.f(f"ix_{ROLLUPS}_period_seconds"), table_name=ROLLUPS)
    op.drop_table(ROLLUPS)
    for col in reversed(STATS_COLUMNS):
        op.drop_index(op.f(f"ix_{TABLE}_{col}_stats"), table_name=TABLE)
        op.create_index(op.f(f"ix_{TABLE}_{col}_stats"), TABLE, [col, "start_time", "engine", "model"])
    op.drop_index(op.f(f"ix_{TABLE}_end_time"), table_name=TABLE)
