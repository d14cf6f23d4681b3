"""Rollups by service: the rollups gain a ``service`` key (the value blocks' series too), and are emptied with
their watermark and blocks, so that the rollup job folds every stored row again; the statistics answer by index
walks meanwhile.

Why: where both an engine and ``inferwatch proxy`` send spans, every proxied request is stored twice (the
engine's row and the proxy's, told apart by ``service``). ``/api/v1/stats`` counts one side at a time
(``inferwatch.collector.stats.sides``), and the rollups keyed by engine, model and instance alone could
not answer a side exactly.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DELETE FROM request_values")
    op.execute("DELETE FROM request_rollups")
    op.execute("DELETE FROM rollup_state")
    with op.batch_alter_table("request_rollups") as batch:
        batch.add_column(sa.Column("service", sa.String(), nullable=True))


def downgrade() -> None:
    """Back to rollups without a service: emptied again, for the older collector to fold every row."""
    op.execute("DELETE FROM request_values")
    op.execute("DELETE FROM request_rollups")
    op.execute("DELETE FROM rollup_state")
    with op.batch_alter_table("request_rollups") as batch:
        batch.drop_column("service")
