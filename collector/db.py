"""The collector's database: engines, schema migrations (Alembic, configured from code) and the
request store's write primitives.

Supported back ends: SQLite (the default, a file under the data directory) and PostgreSQL
(``postgresql+psycopg://…``). Nothing here is created at import time: callers make an engine with
:func:`make_engine` and pass it around.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import URL, Connection, Engine, Executable, create_engine, delete, event, inspect, make_url, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.pool import StaticPool

from inferwatch.collector.models import REQUEST_TABLE
from inferwatch.collector.record import RequestRecord
from inferwatch.core import resources

DB_FILENAME: Final = "inferwatch.db"
VERSION_TABLE: Final = "alembic_version"
SQLITE_BUSY_TIMEOUT_S: Final = 30.0
PG_CONNECT_TIMEOUT_S: Final = 10
# pg_advisory_xact_lock key serialising concurrent ensure_schema calls (several collectors, one database).
PG_MIGRATION_LOCK_KEY: Final = 0x1F_E4_77_A7


class SchemaError(RuntimeError):
    """The database holds something the collector must not touch or cannot handle."""


def migrations_dir() -> Path:
    """The Alembic script directory, package data of the installed inferwatch (``inferwatch/migrations``)."""
    try:
        return resources.migrations_dir()
    except resources.ResourceError as exc:
        raise SchemaError(str(exc)) from None


# --- engines ---------------------------------------------------------------------------------------------------------


def default_url(data_dir: Path) -> str:
    """URL of the default store: the SQLite file ``inferwatch.db`` under ``data_dir``."""
    return URL.create("sqlite+pysqlite", database=str(data_dir / DB_FILENAME)).render_as_string(hide_password=False)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
    finally:
        cursor.close()


def _sqlite_in_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


def make_engine(url: str | URL) -> Engine:
    """An engine for the request store.

    SQLite: WAL journal, ``synchronous=NORMAL``, foreign keys on, a busy timeout, usable from any
    thread (the writer runs in its own); the file's directory is created when missing. An
    in-memory database gets a single shared connection. PostgreSQL: ``pool_pre_ping`` and a
    connect timeout (unless the URL sets one), so an unreachable server fails fast.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        connect_args: dict[str, Any] = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}
        if _sqlite_in_memory(parsed):
            engine = create_engine(parsed, connect_args=connect_args, poolclass=StaticPool)
        else:
            assert parsed.database is not None
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(parsed, connect_args=connect_args)
        event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    if backend == "postgresql":
        pg_args: dict[str, Any] = {}
        if "connect_timeout" not in parsed.query:
            pg_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
        return create_engine(parsed, pool_pre_ping=True, connect_args=pg_args)
    return create_engine(parsed, pool_pre_ping=True)


# --- migrations ------------------------------------------------------------------------------------------------------


def _escape(value: str) -> str:
    """Alembic's config is a ConfigParser: ``%`` must be doubled."""
    return value.replace("%", "%%")


def _base_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", _escape(str(migrations_dir())))
    cfg.set_main_option("path_separator", "os")
    return cfg


def alembic_config(engine_or_url: Engine | str | URL) -> Config:
    """An Alembic configuration for the store (no ini file): script location and database.

    With an engine, ``env.py`` uses it (``config.attributes["engine"]``); the URL is also set as
    ``sqlalchemy.url`` for commands that need one (offline ``--sql`` mode).
    """
    cfg = _base_config()
    if isinstance(engine_or_url, Engine):
        cfg.attributes["engine"] = engine_or_url
        url = engine_or_url.url
    else:
        url = make_url(engine_or_url)
    cfg.set_main_option("sqlalchemy.url", _escape(url.render_as_string(hide_password=False)))
    return cfg


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(_base_config())


def _run_command(connection: Connection, direction: str, revision: str) -> None:
    cfg = alembic_config(connection.engine)
    cfg.attributes["connection"] = connection
    if direction == "upgrade":
        command.upgrade(cfg, revision)
    else:
        command.downgrade(cfg, revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the schema up to ``revision``, in one transaction (PostgreSQL DDL is transactional)."""
    with engine.begin() as conn:
        _run_command(conn, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the schema down to ``revision`` (``"base"``: drop everything the migrations made)."""
    with engine.begin() as conn:
        _run_command(conn, "downgrade", revision)


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: never migrated, or downgraded to base)."""
    with engine.connect() as conn:
        return _current(conn)


def head_revision() -> str:
    """The newest revision of the migrations."""
    head = _script().get_current_head()
    if head is None:
        raise SchemaError("the migrations directory has no revision")
    return head


def at_head(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()


def is_empty(engine: Engine) -> bool:
    """True when the database (its default schema) has no table at all."""
    with engine.connect() as conn:
        return not inspect(conn).get_table_names()


def ensure_schema(engine: Engine) -> None:
    """Bring the schema to the head revision: create it in an empty database, upgrade an older one.

    Raises :class:`SchemaError` for a database that has tables but no Alembic version (not ours, or
    created outside the migrations) and for a revision these migrations do not know (written by a
    newer inferwatch). On PostgreSQL an advisory lock serialises collectors starting together.
    """
    script = _script()
    head = script.get_current_head()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATION_LOCK_KEY})
        tables = set(inspect(conn).get_table_names())
        current = _current(conn) if VERSION_TABLE in tables else None
        if current is None:
            foreign = sorted(tables - {VERSION_TABLE})
            if foreign:
                raise SchemaError(
                    f"database {engine.url.render_as_string()} has tables ({', '.join(foreign)}) but no Alembic "
                    "version: it was not created by inferwatch's migrations; refusing to change it "
                    "(use an empty database, or migrate/stamp it by hand)"
                )
        elif current == head:
            return
        else:
            try:
                script.get_revision(current)
            except CommandError as exc:
                raise SchemaError(
                    f"database {engine.url.render_as_string()} is at schema revision {current!r}, which this "
                    f"inferwatch does not know (head is {head!r}): was it written by a newer version?"
                ) from exc
        _run_command(conn, "upgrade", "head")


# --- writes ----------------------------------------------------------------------------------------------------------

_CONFLICT_COLUMNS: Final = ("trace_id", "span_id")


@functools.cache
def _insert_statement(dialect: str) -> Executable:
    """INSERT … ON CONFLICT (trace_id, span_id) DO NOTHING for the dialect (built once per dialect)."""
    statement: sqlite.Insert | postgresql.Insert
    if dialect == "sqlite":
        statement = sqlite.insert(REQUEST_TABLE).on_conflict_do_nothing(index_elements=list(_CONFLICT_COLUMNS))
    elif dialect == "postgresql":
        statement = postgresql.insert(REQUEST_TABLE).on_conflict_do_nothing(index_elements=list(_CONFLICT_COLUMNS))
    else:
        raise ValueError(f"the request store supports SQLite and PostgreSQL, not {dialect}")
    # executemany: both drivers sum the rows each parameter set inserted (0 on conflict).
    return statement.execution_options(preserve_rowcount=True)


def insert_records(engine: Engine, records: Sequence[RequestRecord]) -> tuple[int, int]:
    """Store records, skipping those already stored (same trace and span id): (inserted, duplicates).

    One transaction, one executemany of ``INSERT … ON CONFLICT DO NOTHING``; duplicates inside the
    batch count as duplicates too. Column names are the record's field names, so a record's
    ``__dict__`` is its row.
    """
    if not records:
        return 0, 0
    statement = _insert_statement(engine.dialect.name)
    received_at = datetime.now(UTC)
    rows = []
    for record in records:
        row = dict(vars(record))
        row["received_at"] = received_at
        rows.append(row)
    with engine.begin() as conn:
        result = conn.execute(statement, rows)
        inserted = result.rowcount
    if inserted < 0:
        raise RuntimeError(f"the {engine.dialect.name} driver did not report how many rows it inserted")
    return inserted, len(records) - inserted


def delete_older_than(engine: Engine, cutoff: datetime) -> int:
    """Delete the requests that started before ``cutoff`` (naive: UTC); the number deleted."""
    with engine.begin() as conn:
        result = conn.execute(delete(REQUEST_TABLE).where(REQUEST_TABLE.c.start_time < cutoff))
        return result.rowcount
