"""Rows into a store at an older revision: the tests of a migration store rows first, then upgrade.

:func:`inferwatch.collector.store.inserts.insert_records` writes every column of the current table, which an
older revision may lack (``tenant`` came with 0008): here each record is written with the columns the database
has, through SQLAlchemy Core (slow, and fine for the few thousand rows of a migration test).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Engine, inspect

from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.tables import REQUEST_TABLE


def insert_at_revision(engine: Engine, records: Sequence[RequestRecord]) -> int:
    """Insert ``records`` with the request table's columns as the database has them now; returns the count."""
    present = {c["name"] for c in inspect(engine).get_columns(REQUEST_TABLE.name)}
    now = datetime.now(UTC)
    rows = [{k: v for k, v in {**vars(r), "received_at": now}.items() if k in present} for r in records]
    with engine.begin() as conn:
        conn.execute(REQUEST_TABLE.insert(), rows)
    return len(rows)
