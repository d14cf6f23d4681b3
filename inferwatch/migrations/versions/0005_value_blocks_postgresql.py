"""Value blocks on PostgreSQL too: the rollups are emptied and their watermark reset there, so that the rollup
job folds every stored row again, into the rollups and the value blocks together (they must agree); the
statistics answer by index walks meanwhile. SQLite has kept the blocks since 0004: nothing to do there.

Why: read in binary and gathered with numpy, a small window's blocks answer faster than PostgreSQL's own
``percentile_disc`` over the window's rows (docs/collector.md, Measured).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DELETE FROM request_values")
        op.execute("DELETE FROM request_rollups")
        op.execute("DELETE FROM rollup_state")


def downgrade() -> None:
    """The blocks stay; an older collector on PostgreSQL never reads them."""
