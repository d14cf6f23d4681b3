"""Value blocks: per minute, every latency value of the requests that ended in it (exact small windows).

SQLite keeps them (PostgreSQL's own ``percentile_disc`` over a small window's rows is faster than reading blocks
into Python; the table stays empty there). On SQLite the rollups are emptied and their watermark reset, so that
the rollup job folds every stored row again, into the rollups and the new blocks together (they must agree):
about 20k rows/s, in the background; ``/api/v1/stats`` answers by index walks meanwhile.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VALUES = "request_values"


def upgrade() -> None:
    op.create_table(
        VALUES,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("period_seconds", sa.Integer(), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("series", sa.Text(), nullable=False),
        sa.Column("counts", sa.LargeBinary(), nullable=False),
        sa.Column("vals", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{VALUES}")),
    )
    op.create_index(op.f(f"ix_{VALUES}_period_seconds"), VALUES, ["period_seconds", "period_start"], unique=True)
    if op.get_bind().dialect.name == "sqlite":  # the blocks are kept there only
        op.execute("DELETE FROM request_rollups")
        op.execute("DELETE FROM rollup_state")


def downgrade() -> None:
    op.drop_index(op.f(f"ix_{VALUES}_period_seconds"), table_name=VALUES)
    op.drop_table(VALUES)
