"""The requests' tenant: a nullable ``tenant`` column on the request table.

Why: ``inferwatch proxy`` names who sent each request (a keyed hash of its API key, or a header's value) on its
span, and ``/api/v1/usage?group_by=tenant`` sums the stored requests by it (chargeback). Rows stored before, and
rows from the engines' own spans, have none (NULL). No index: the usage reads a time range (``end_time``'s
index) and groups what it finds.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("inference_requests") as batch:
        batch.add_column(sa.Column("tenant", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("inference_requests") as batch:
        batch.drop_column("tenant")
