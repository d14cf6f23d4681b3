"""Day rollups: the rollups, their watermark and the value blocks are emptied on both back ends, so that the rollup
job folds every stored row again, into minutes, hours and days (UTC) together (they must agree, and the blocks
with them); the statistics answer by index walks meanwhile.

Why: a week's window merged 168 hourly sketches per series and field (5M rows, 32 series: 24k sketches, 2.5M
bucket counts, 150-185 ms); from whole days it merges 7 (docs/collector.md, Measured).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DELETE FROM request_values")
    op.execute("DELETE FROM request_rollups")
    op.execute("DELETE FROM rollup_state")


def downgrade() -> None:
    """The day rollups stay; an older collector never reads them (it selects minutes and hours by period)."""
