"""Create the request store: one row per finished LLM request (collector.record.RequestRecord).

Revision ID: 0001
Revises:
Create Date: 2024-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "inference_requests"
STATS_COLUMNS = ("time_to_first_token", "time_per_output_token", "request_duration", "request_queue")


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.Column("span_id", sa.String(length=16), nullable=False),
        sa.Column("request_id", sa.String(), nullable=True),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=True),
        sa.Column("instance", sa.String(), nullable=True),
        sa.Column("service", sa.String(), nullable=True),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("time_to_first_token", sa.Double(), nullable=True),
        sa.Column("ttft_derived", sa.Boolean(), nullable=False),
        sa.Column("time_per_output_token", sa.Double(), nullable=True),
        sa.Column("request_duration", sa.Double(), nullable=True),
        sa.Column("request_queue", sa.Double(), nullable=True),
        sa.Column("request_prefill", sa.Double(), nullable=True),
        sa.Column("request_decode", sa.Double(), nullable=True),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=True),
        sa.Column("generation_tokens", sa.BigInteger(), nullable=True),
        sa.Column("prefix_cache_hit_tokens", sa.BigInteger(), nullable=True),
        sa.Column("finish_reason", sa.String(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("n", sa.Integer(), nullable=True),
        sa.Column("max_tokens", sa.BigInteger(), nullable=True),
        sa.Column("temperature", sa.Double(), nullable=True),
        sa.Column("lora_adapter", sa.String(), nullable=True),
        sa.Column("attributes", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{TABLE}")),
        sa.UniqueConstraint("trace_id", "span_id", name=op.f(f"uq_{TABLE}_trace_id_span_id")),
    )
    op.create_index(op.f(f"ix_{TABLE}_start_time"), TABLE, ["start_time"])
    op.create_index(op.f(f"ix_{TABLE}_engine_model_start_time"), TABLE, ["engine", "model", "start_time"])
    op.create_index(op.f(f"ix_{TABLE}_request_id"), TABLE, ["request_id"])
    for col in STATS_COLUMNS:
        op.create_index(op.f(f"ix_{TABLE}_{col}_stats"), TABLE, [col, "start_time", "engine", "model"])


def downgrade() -> None:
    for col in reversed(STATS_COLUMNS):
        op.drop_index(op.f(f"ix_{TABLE}_{col}_stats"), table_name=TABLE)
    op.drop_index(op.f(f"ix_{TABLE}_request_id"), table_name=TABLE)
    op.drop_index(op.f(f"ix_{TABLE}_engine_model_start_time"), table_name=TABLE)
    op.drop_index(op.f(f"ix_{TABLE}_start_time"), table_name=TABLE)
    op.drop_table(TABLE)
