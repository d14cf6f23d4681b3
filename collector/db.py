"""The collector's database: engines, schema migrations (Alembic, configured from code) and the
request store's write primitives.

Supported back ends: SQLite (the default, a file under the data directory) and PostgreSQL
(``postgresql+psycopg://…``). Nothing here is created at import time: callers make an engine with
:func:`make_engine` and pass it around.

Timeouts (:class:`DbTimeouts`): every wait on the database is bounded, so an unreachable or silent
database turns into an error within seconds instead of a hung thread. PostgreSQL: ``connect_timeout``,
a server-side ``statement_timeout``, a client-side deadline on every round trip (a server that stops
answering while the TCP connection stays open, e.g. behind a proxy or NAT that lost its peer, cannot
cancel anything: the client gives up on the connection), and the pool's checkout timeout. SQLite:
the busy timeout (waiting for another writer's lock), a statement deadline (the progress handler
interrupts a statement running past it) and the pool's checkout timeout. :func:`deadline` tightens
the bound for one operation (a readiness probe, one batch of the writer). :func:`is_unreachable`
tells "cannot reach the database now" from "the database refuses this".
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import (
    URL,
    Connection,
    Dialect,
    Engine,
    Executable,
    create_engine,
    delete,
    event,
    inspect,
    make_url,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import StaticPool

from inferwatch.collector.models import REQUEST_TABLE
from inferwatch.collector.record import RequestRecord
from inferwatch.core import resources

log = logging.getLogger("inferwatch.collector")

DB_FILENAME: Final = "inferwatch.db"
VERSION_TABLE: Final = "alembic_version"
SQLITE_PROGRESS_STEPS: Final = 10_000
"""SQLite virtual-machine steps between two checks of the statement deadline."""
CLIENT_MARGIN_S: Final = 2.0
"""The client-side deadline of a PostgreSQL round trip is the server's statement_timeout plus this: a server
that answers cancels the statement itself first (and the connection stays usable)."""
MIN_CONNECT_TIMEOUT_S: Final = 2
"""libpq waits at least 2 s for a connection, whatever connect_timeout says."""
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


# --- timeouts --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DbTimeouts:
    """Bounds on every wait for the database, in seconds (the collector's ``db_*`` settings)."""

    connect: float = 5.0
    """establishing a connection (PostgreSQL ``connect_timeout``, at least 2 s)."""
    statement: float = 10.0
    """one statement: PostgreSQL ``statement_timeout`` (server side) plus a client-side deadline
    :data:`CLIENT_MARGIN_S` later; SQLite: interrupted past it."""
    pool: float = 5.0
    """waiting for a free connection of the pool."""
    busy: float = 5.0
    """SQLite: waiting for another connection's write lock (``busy_timeout``)."""

    def __post_init__(self) -> None:
        if min(self.connect, self.statement, self.pool, self.busy) <= 0:
            raise ValueError("database timeouts must be positive")


_DEADLINE: Final[contextvars.ContextVar[float | None]] = contextvars.ContextVar("inferwatch_db_deadline", default=None)
"""The monotonic time by which the current operation must be done (None: only the per-statement bounds)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Bound every database wait inside the block to end ``seconds`` from now (nested blocks keep the earlier
    end). The block's connection attempts, round trips and statements fail with an ``OperationalError``
    past it, which :func:`is_unreachable` counts as unreachable."""
    end = time.monotonic() + seconds
    outer = _DEADLINE.get()
    token = _DEADLINE.set(end if outer is None else min(outer, end))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def remaining() -> float | None:
    """Seconds left before the :func:`deadline` of the current block (None outside one)."""
    end = _DEADLINE.get()
    return None if end is None else end - time.monotonic()


def _bound(limit: float) -> float:
    """``limit`` seconds, or less when the current :func:`deadline` ends sooner."""
    left = remaining()
    return limit if left is None else min(limit, left)


def is_unreachable(exc: BaseException) -> bool:
    """Whether a database error means "cannot reach the database now" (retry later: connection refused or
    lost, a timeout, the pool exhausted, a lock not granted) rather than "the database refuses this data"."""
    if isinstance(exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeoutError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def describe(exc: BaseException) -> str:
    """A one-line account of a database error: the driver's class and first line (no SQL echo)."""
    if isinstance(exc, PoolTimeoutError):
        return "TimeoutError: no free database connection within the pool timeout"
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    name = orig.__class__.__name__
    return f"{name}: {lines[0]}"[:300] if lines else name


# --- engines ---------------------------------------------------------------------------------------------------------


def default_url(data_dir: Path) -> str:
    """URL of the default store: the SQLite file ``inferwatch.db`` under ``data_dir``."""
    return URL.create("sqlite+pysqlite", database=str(data_dir / DB_FILENAME)).render_as_string(hide_password=False)


_STATEMENT_END: Final = "inferwatch_statement_end"
"""Key of the running statement's deadline in a SQLite connection's ``info``."""


def _sqlite_setup(timeouts: DbTimeouts) -> tuple[Any, Any, Any]:
    """The connect listener (pragmas, the statement deadline's progress handler) and the cursor listeners that
    arm and disarm that deadline."""

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk (the WAL fsync'd) when it returns, what the writer acknowledges on
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(timeouts.busy * 1000)}")
        finally:
            cursor.close()
        info = record.info

        def progress() -> int:
            end = info.get(_STATEMENT_END)
            return 1 if end is not None and time.monotonic() > end else 0

        dbapi_connection.set_progress_handler(progress, SQLITE_PROGRESS_STEPS)

    def arm(conn: Connection, *_args: Any) -> None:
        conn.info[_STATEMENT_END] = time.monotonic() + _bound(timeouts.statement)

    def disarm(conn: Connection, *_args: Any) -> None:
        conn.info.pop(_STATEMENT_END, None)

    return on_connect, arm, disarm


def _disarm_on_error(context: Any) -> None:
    conn = context.connection
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.info.pop(_STATEMENT_END, None)


@functools.cache
def _deadline_connection() -> type[Any]:
    """A psycopg connection whose every round trip has a client-side deadline.

    psycopg waits for the server without a limit; a server behind a silent network (the TCP connection
    open, nothing coming back) would hold the thread forever, and ``statement_timeout`` cannot help, the
    server never getting to say so. Past the deadline the connection is abandoned (closed) and an
    ``OperationalError`` raised: SQLAlchemy sees a disconnect and discards it.
    """
    import inspect

    import psycopg

    wait_timeout: Any = getattr(psycopg.errors, "_WaitTimeout", None)
    if "timeout" not in inspect.signature(psycopg.Connection.wait).parameters:  # an older psycopg
        log.warning(
            "psycopg %s cannot time out a wait: statement_timeout only, no client deadline", psycopg.__version__
        )
        return psycopg.Connection

    class DeadlineConnection(psycopg.Connection[Any]):
        round_trip_limit: float = math.inf

        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            limit = _bound(self.round_trip_limit)
            if math.isinf(limit) or (timeout is not None and timeout <= limit):
                return super().wait(gen, interval, timeout)
            started = time.monotonic()
            try:
                if limit <= 0:
                    raise psycopg.OperationalError("deadline already passed")
                return super().wait(gen, interval, limit)
            except psycopg.OperationalError as exc:
                timed_out = (wait_timeout is not None and isinstance(exc, wait_timeout)) or (
                    time.monotonic() - started >= limit
                )
                if not timed_out:
                    raise
                self.pgconn.finish()  # the protocol state is unknown: never reuse this connection
                raise psycopg.OperationalError(
                    f"the database did not answer within {max(limit, 0):.1f} s (client-side deadline); "
                    "connection abandoned"
                ) from None

    return DeadlineConnection


PING_TIMEOUT_S: Final = 2.0
"""The pool's liveness check of a pooled connection: a server that does not answer an empty statement within
this is not there (the connection is discarded and a new one made)."""


def _bound_ping(engine: Engine) -> None:
    """Give this engine's pre-ping :data:`PING_TIMEOUT_S`, not the statement's deadline: a pooled connection into
    a silent network is found dead in 2 s, not 12."""
    dialect = engine.dialect
    ping = dialect.do_ping

    def bounded(dbapi_connection: Any) -> bool:
        with deadline(PING_TIMEOUT_S):
            return ping(dbapi_connection)

    dialect.do_ping = bounded  # type: ignore[method-assign]  # this engine's dialect instance only


def _pg_connect_listener(timeouts: DbTimeouts) -> Any:
    """``do_connect``: a :func:`_deadline_connection`, with connect_timeout and statement_timeout added to what
    the URL asks (the URL's own values win)."""

    def do_connect(_dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        import psycopg

        connect = _bound(float(cparams.get("connect_timeout", timeouts.connect)))
        if connect <= 0:
            raise psycopg.OperationalError("deadline passed before a connection could be made")
        cparams["connect_timeout"] = max(MIN_CONNECT_TIMEOUT_S, math.ceil(connect))
        options = str(cparams.get("options", ""))
        statement = timeouts.statement
        if "statement_timeout" not in options:
            options = f"{options} -c statement_timeout={int(statement * 1000)}".strip()
            cparams["options"] = options
        conn = _deadline_connection().connect(*cargs, **cparams)
        conn.round_trip_limit = statement + CLIENT_MARGIN_S
        return conn

    return do_connect


def _sqlite_in_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


def make_engine(url: str | URL, timeouts: DbTimeouts | None = None) -> Engine:
    """An engine for the request store, every wait bounded by ``timeouts`` (default: :class:`DbTimeouts`).

    SQLite: WAL journal, ``synchronous=FULL`` (a commit is durable when it returns), foreign keys on, the
    busy timeout and the statement deadline, usable from any thread (the writer runs in its own); the
    file's directory is created when missing. An in-memory database gets a single shared connection.
    PostgreSQL (psycopg): ``pool_pre_ping``, ``connect_timeout`` and ``statement_timeout`` (unless the URL
    sets them) and the client-side round-trip deadline. Both: the pool's checkout timeout.
    """
    timeouts = timeouts or DbTimeouts()
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        connect_args: dict[str, Any] = {"check_same_thread": False, "timeout": timeouts.busy}
        if _sqlite_in_memory(parsed):
            engine = create_engine(parsed, connect_args=connect_args, poolclass=StaticPool)
        else:
            assert parsed.database is not None
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(parsed, connect_args=connect_args, pool_timeout=timeouts.pool)
        on_connect, arm, disarm = _sqlite_setup(timeouts)
        event.listen(engine, "connect", on_connect)
        event.listen(engine, "before_cursor_execute", arm)
        event.listen(engine, "after_cursor_execute", disarm)
        event.listen(engine, "handle_error", _disarm_on_error)
        return engine
    if backend == "postgresql":
        engine = create_engine(parsed, pool_pre_ping=True, pool_timeout=timeouts.pool)
        if parsed.get_driver_name() == "psycopg":
            event.listen(engine, "do_connect", _pg_connect_listener(timeouts))
            _bound_ping(engine)
        return engine
    return create_engine(parsed, pool_pre_ping=True, pool_timeout=timeouts.pool)


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


@dataclass(frozen=True)
class _RawInsert:
    """The insert compiled once for a dialect, with each column's bind processor (None: the value as is)."""

    sql: str
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]
    positional: bool


@functools.lru_cache(maxsize=64)
def _raw_insert(dialect: Dialect) -> _RawInsert:
    keys = [c.key for c in REQUEST_TABLE.c if c.key != "id"]
    compiled = _insert_statement(dialect.name).compile(dialect=dialect, column_keys=keys)  # type: ignore[attr-defined]
    names = tuple(compiled.positiontup) if dialect.positional else tuple(keys)
    processors = tuple(REQUEST_TABLE.c[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names)
    return _RawInsert(compiled.string, names, processors, dialect.positional)


def insert_records(engine: Engine, records: Sequence[RequestRecord]) -> tuple[int, int]:
    """Store records, skipping those already stored (same trace and span id): (inserted, duplicates).

    One transaction, one executemany of ``INSERT … ON CONFLICT DO NOTHING``; duplicates inside the
    batch count as duplicates too. Column names are the record's field names, so a record's
    ``__dict__`` is its row. The statement is compiled once per dialect and the rows bound with the
    columns' own bind processors (the stored values are exactly what ``conn.execute(insert, rows)``
    would store) but without SQLAlchemy's per-row parameter machinery: the ingest path's hot loop.
    """
    if not records:
        return 0, 0
    raw = _raw_insert(engine.dialect)
    received = datetime.now(UTC)
    plan = [(name, proc) for name, proc in zip(raw.names, raw.processors, strict=True) if name != "received_at"]
    at = raw.names.index("received_at")
    received_proc = raw.processors[at]
    received_value = received_proc(received) if received_proc is not None else received
    rows: list[Any] = []
    for record in records:
        values = vars(record)
        row = [proc(values[name]) if proc is not None else values[name] for name, proc in plan]
        row.insert(at, received_value)
        rows.append(tuple(row) if raw.positional else dict(zip(raw.names, row, strict=True)))
    with engine.begin() as conn:
        result = conn.execution_options(preserve_rowcount=True).exec_driver_sql(raw.sql, rows)
        inserted = result.rowcount
    if inserted < 0:
        raise RuntimeError(f"the {engine.dialect.name} driver did not report how many rows it inserted")
    return inserted, len(records) - inserted


# --- what the database refuses -----------------------------------------------------------------------------------

INT64: Final = (-(2**63), 2**63 - 1)
INT32: Final = (-(2**31), 2**31 - 1)
_BIGINT_FIELDS: Final = ("prompt_tokens", "generation_tokens", "prefix_cache_hit_tokens", "max_tokens")
_TEXT_FIELDS: Final = (
    "trace_id",
    "span_id",
    "request_id",
    "engine",
    "model",
    "instance",
    "service",
    "finish_reason",
    "error",
    "lora_adapter",
)
_PG_BAD_TEXT: Final = re.compile("[\x00\ud800-\udfff]")
"""PostgreSQL text and JSON hold neither NUL nor a lone surrogate."""
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
"""No driver can encode a lone surrogate as UTF-8 (JSON text escapes it, which SQLite keeps)."""


def _json_refusal(value: Any, depth: int = 0) -> str | None:
    """Why PostgreSQL's jsonb refuses ``value`` (NUL or a lone surrogate, a non-finite number), else None."""
    if isinstance(value, str):
        return "a NUL character or lone surrogate in an attribute" if _PG_BAD_TEXT.search(value) else None
    if isinstance(value, float):
        return None if math.isfinite(value) else "a non-finite number in an attribute"
    if depth > 64:
        return "attributes nested too deep"
    if isinstance(value, dict):
        for k, v in value.items():
            reason = _json_refusal(k, depth + 1) or _json_refusal(v, depth + 1)
            if reason:
                return reason
    elif isinstance(value, list):
        for v in value:
            reason = _json_refusal(v, depth + 1)
            if reason:
                return reason
    return None


def refusal(record: RequestRecord, dialect: str) -> str | None:
    """Why the database (``sqlite`` or ``postgresql``) would refuse ``record``, or None.

    The column limits, checked before a record is accepted so that a client is told (a
    ``partial_success``) instead of the record being refused after the answer: integers within their
    columns (BIGINT; ``n`` INTEGER, 32-bit on PostgreSQL), no lone surrogate in text, and on PostgreSQL
    no NUL character in text or attributes and no NaN/Infinity among the attributes.
    """
    for name in _BIGINT_FIELDS:
        value = getattr(record, name)
        if value is not None and not INT64[0] <= value <= INT64[1]:
            return f"{name} out of range for the database"
    limits = INT32 if dialect == "postgresql" else INT64
    if record.n is not None and not limits[0] <= record.n <= limits[1]:
        return "n out of range for the database"
    postgres = dialect == "postgresql"
    for name in _TEXT_FIELDS:
        value = getattr(record, name)
        if value is None or (value.isascii() and not postgres):
            continue
        if (_PG_BAD_TEXT if postgres else _SURROGATE).search(value):
            return f"{name} has a character the database cannot store (NUL or a lone surrogate)"
    if dialect == "postgresql" and record.attributes:
        return _json_refusal(record.attributes)
    return None


DELETE_CHUNK: Final = 10_000
"""Rows one retention statement deletes at most: each statement stays short (well within the statement
timeout, no long lock on SQLite)."""


def delete_older_than(engine: Engine, cutoff: datetime, chunk: int = DELETE_CHUNK) -> int:
    """Delete the requests that started before ``cutoff`` (naive: UTC), ``chunk`` rows per transaction;
    the number deleted."""
    t = REQUEST_TABLE
    oldest = select(t.c.id).where(t.c.start_time < cutoff).order_by(t.c.start_time).limit(chunk)
    total = 0
    while True:
        with engine.begin() as conn:
            deleted = conn.execute(delete(t).where(t.c.id.in_(oldest.scalar_subquery()))).rowcount
        total += deleted
        if deleted < chunk:
            return total
