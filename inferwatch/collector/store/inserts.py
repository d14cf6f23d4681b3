"""The request store's inserts: a batch of prepared rows (:mod:`inferwatch.collector.store.rows`) in one
transaction, through the driver's fast path (``executemany`` on SQLite, ``COPY`` on PostgreSQL), skipping the
rows already stored (same trace and span id). Errors are SQLAlchemy's, as from ``conn.execute``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from inferwatch.collector.store import db
from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.rows import COPY_COLUMNS, ROW_COLUMNS, DriverRow, Row, prepare, sqlite_time
from inferwatch.collector.store.tables import REQUEST_TABLE

_CONFLICT_COLUMNS: Final = ("trace_id", "span_id")
_COLUMNS_SQL: Final = ", ".join(ROW_COLUMNS)
_TABLE: Final = REQUEST_TABLE.name
_STAGING: Final = "inferwatch_ingest_staging"
"""PostgreSQL: the session's temporary table a batch is COPY'd into (emptied at every commit)."""
_STAGING_READY: Final = "inferwatch_staging_ready"
"""Key in a PostgreSQL connection's ``info``: its staging table exists (the info is cleared on reconnect)."""
_SQLITE_INSERT: Final = (
    f"INSERT INTO {_TABLE} ({_COLUMNS_SQL}, received_at) VALUES ({', '.join('?' * (len(ROW_COLUMNS) + 1))}) "
    f"ON CONFLICT ({', '.join(_CONFLICT_COLUMNS)}) DO NOTHING"
)
_PG_STAGING: Final = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGING} ON COMMIT DELETE ROWS AS "
    f"SELECT {_COLUMNS_SQL} FROM {_TABLE} WITH NO DATA"
)
_PG_COPY: Final = f"COPY pg_temp.{_STAGING} ({', '.join(COPY_COLUMNS)}) FROM STDIN"
_PG_INSERT: Final = (
    f"INSERT INTO {_TABLE} ({_COLUMNS_SQL}, received_at) SELECT {_COLUMNS_SQL}, %s FROM pg_temp.{_STAGING} "
    f"ON CONFLICT ({', '.join(_CONFLICT_COLUMNS)}) DO NOTHING"
)


def _driver_error(conn: Connection, statement: str, exc: Exception, cursor: Any) -> DBAPIError:
    """A driver's exception as SQLAlchemy's (``OperationalError``…, as ``conn.execute`` would raise it), the
    connection invalidated when the driver says it is gone."""
    dialect = conn.dialect
    dbapi_connection = conn.connection.dbapi_connection
    gone = dialect.is_disconnect(exc, dbapi_connection, cursor)  # type: ignore[arg-type]  # a driver Error
    if gone:
        conn.invalidate(exc)
    error = DBAPIError.instance(
        statement,
        None,
        exc,
        dialect.loaded_dbapi.Error,
        hide_parameters=True,
        connection_invalidated=gone,
        dialect=dialect,
    )
    return cast(DBAPIError, error)


def _sqlite_insert(conn: Connection, rows: Sequence[Row], received: datetime) -> int:
    """``executemany`` of the rows (tuples, values as the driver binds them) on the raw sqlite3 connection,
    under the statement deadline the engine's other statements get."""
    at = sqlite_time(received)
    params = [(*row, at) for row in rows]
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        with db.sqlite_statement_deadline(conn):
            cursor.executemany(_SQLITE_INSERT, params)
        return int(cursor.rowcount)
    except Exception as exc:
        if isinstance(exc, conn.dialect.loaded_dbapi.Error):
            raise _driver_error(conn, _SQLITE_INSERT, exc, cursor) from exc
        raise
    finally:
        cursor.close()


def _postgres_insert(conn: Connection, rows: Sequence[str], received: datetime) -> int:
    """COPY the rows (lines of COPY's text format, :func:`inferwatch.collector.store.rows.prepare`) into the session's
    staging table as one text, then ``INSERT … SELECT … ON CONFLICT DO NOTHING`` (psycopg 3's ``cursor.copy``,
    which encodes the text in the connection's encoding; every round trip under its client-side deadline)."""
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    statement = _PG_STAGING
    try:
        if not conn.info.get(_STAGING_READY):
            cursor.execute(_PG_STAGING)
            conn.info[_STAGING_READY] = True
        statement = _PG_COPY
        with cursor.copy(_PG_COPY) as copy:
            copy.write("\n".join(rows) + "\n")
        statement = _PG_INSERT
        cursor.execute(_PG_INSERT, (received,))
        return int(cursor.rowcount)
    except Exception as exc:
        conn.info.pop(_STAGING_READY, None)
        if isinstance(exc, conn.dialect.loaded_dbapi.Error):
            raise _driver_error(conn, statement, exc, cursor) from exc
        raise
    finally:
        cursor.close()


def insert_rows(engine: Engine, rows: Sequence[DriverRow]) -> tuple[int, int]:
    """Store prepared rows (:func:`inferwatch.collector.store.rows.prepare` for this engine's dialect), skipping those
    already stored (same trace and span id): (inserted, duplicates).

    One transaction, through the driver's fast path: ``executemany`` of tuples on SQLite, ``COPY`` of the
    rows' text lines into a temporary table and ``INSERT … SELECT … ON CONFLICT DO NOTHING`` on PostgreSQL.
    Duplicates inside the batch count as duplicates too. Errors are SQLAlchemy's, as from ``conn.execute``.
    """
    if not rows:
        return 0, 0
    dialect = engine.dialect.name
    received = datetime.now(UTC)
    if isinstance(rows[0], str) != (dialect == "postgresql"):
        raise TypeError(f"rows prepared for another database than {dialect} (inferwatch.collector.store.rows.prepare)")
    if dialect == "sqlite":
        with engine.begin() as conn:
            inserted = _sqlite_insert(conn, cast("Sequence[Row]", rows), received)
    elif dialect == "postgresql" and engine.dialect.driver == "psycopg":
        info: dict[Any, Any] = {}
        try:
            with engine.begin() as conn:
                info = conn.info
                inserted = _postgres_insert(conn, cast("Sequence[str]", rows), received)
        except BaseException:
            info.pop(_STAGING_READY, None)  # a rolled-back transaction took the staging table with it
            raise
    else:
        raise ValueError(f"the request store supports SQLite and PostgreSQL (psycopg), not {engine.dialect.name}")
    if inserted < 0:
        raise RuntimeError(f"the {dialect} driver did not report how many rows it inserted")
    return inserted, len(rows) - inserted


def insert_records(engine: Engine, records: Sequence[RequestRecord]) -> tuple[int, int]:
    """Store records, skipping those already stored (same trace and span id): (inserted, duplicates).

    :func:`insert_rows` of the records' rows (the stored values are exactly what ``conn.execute(insert,
    rows)`` would store).
    """
    rows, _ = prepare(records, engine.dialect.name)
    return insert_rows(engine, rows)
