"""The collector's database: engines and schema migrations (Alembic, configured from code).

Supported back ends: SQLite (the default, a file under the data directory) and PostgreSQL
(``postgresql+psycopg://…``). Nothing here is created at import time: callers make an engine with
:func:`make_engine` and pass it around. The request store's inserts are
:mod:`~inferwatch.collector.store.inserts`, its retention deletes :mod:`~inferwatch.collector.store.retention`.

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
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
    Engine,
    create_engine,
    event,
    inspect,
    make_url,
    text,
)
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import StaticPool

from inferwatch.core import resources

log = logging.getLogger("inferwatch.collector")

DB_FILENAME: Final = "inferwatch.db"
VERSION_TABLE: Final = "alembic_version"
SQLITE_CACHE_KIB: Final = 65_536
"""SQLite's page cache per connection (``PRAGMA cache_size``; its default is 2 MiB), filled only as pages are read.
The request table's unique and covering indexes take random keys, so each insert touches pages all over them: on
a growing table the default cache re-reads them from the OS on every insert (the driver's own fast path went from
51 to 81 us of CPU per row between 100k and 600k rows, and 47 to 52 with this cache; docs/collector.md)."""
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


def ping(engine: Engine) -> None:
    """One round trip to the database (raises when it cannot be reached)."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


# --- engines ---------------------------------------------------------------------------------------------------------


def default_url(data_dir: Path) -> str:
    """URL of the default store: the SQLite file ``inferwatch.db`` under ``data_dir``."""
    return URL.create("sqlite+pysqlite", database=str(data_dir / DB_FILENAME)).render_as_string(hide_password=False)


_STATEMENT_END: Final = "inferwatch_statement_end"
"""Key of the running statement's deadline in a SQLite connection's ``info``."""
_STATEMENT_LIMIT: Final = "inferwatch_statement_limit"
"""Key of the statement timeout in a SQLite connection's ``info`` (for statements run on the raw connection)."""


def _sqlite_setup(timeouts: DbTimeouts) -> tuple[Any, Any, Any]:
    """The connect listener (pragmas, the statement deadline's progress handler) and the cursor listeners that
    arm and disarm that deadline."""

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk (the WAL fsync'd) when it returns, what the writer acknowledges on
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(timeouts.busy * 1000)}")
        finally:
            cursor.close()
        info = record.info
        info[_STATEMENT_LIMIT] = timeouts.statement

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


@contextlib.contextmanager
def sqlite_statement_deadline(conn: Connection) -> Iterator[None]:
    """SQLite: the statement deadline the engine's statements get (:func:`deadline` included), for a statement run
    on the raw driver connection, which the engine's events do not see."""
    info = conn.info
    limit = info.get(_STATEMENT_LIMIT)
    if limit is not None:
        info[_STATEMENT_END] = time.monotonic() + _bound(limit)
    try:
        yield
    finally:
        info.pop(_STATEMENT_END, None)


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


def in_memory(url: str | URL) -> bool:
    """An in-memory SQLite database: one process's alone (no other process can open it)."""
    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and _sqlite_in_memory(parsed)


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
        return _pg_engine(parsed, timeouts)
    return create_engine(parsed, pool_pre_ping=True, pool_timeout=timeouts.pool)


def _pg_engine(parsed: URL, timeouts: DbTimeouts, **kwargs: Any) -> Engine:
    engine = create_engine(parsed, pool_pre_ping=True, pool_timeout=timeouts.pool, **kwargs)
    if parsed.get_driver_name() == "psycopg":
        event.listen(engine, "do_connect", _pg_connect_listener(timeouts))
        _bound_ping(engine)
    return engine


STATS_ISOLATION: Final = "REPEATABLE READ"
"""The isolation of a statistics read on PostgreSQL: its statements see one snapshot (the rollups, their watermark
and the table agree)."""


NEVER_BY_COUNT: Final = 2**31 - 1
"""A stats connection's ``prepare_threshold``: psycopg prepares a statement after this many runs (never)."""
GENERIC_PLANS_FROM: Final = 120000
"""The PostgreSQL version (``server_version_num``) from which ``plan_cache_mode`` exists."""


def make_stats_engine(url: str | URL, timeouts: DbTimeouts | None = None) -> Engine | None:
    """PostgreSQL: an engine of its own for the statistics reads (``/api/v1/stats``), as :func:`make_engine`
    but with its own pool, whose connections start their transactions at :data:`STATS_ISOLATION`, are reused
    newest first, prepare only the statements run with ``prepare=True`` and plan those once for any parameters
    (``plan_cache_mode = force_generic_plan``, PostgreSQL 12+). None on other back ends (the store's engine
    serves them).

    Why a pool of their own: psycopg forgets every prepared statement of a connection at a rollback (it sends
    ``DEALLOCATE ALL``), and the API's other reads end in rollbacks. On a shared pool the statistics statements
    were parsed and planned afresh at each request; on their own connections, whose reads end in a commit, they
    stay prepared. Why generic plans: PostgreSQL plans a prepared statement for its parameters at each of its
    first five runs, then keeps a generic plan only when its estimate is no worse, and with the time ranges
    unknown a generic estimate always is: the small-window statement was planned at every request. What both
    cost: docs/collector.md, 'measurements'. The statements prepared here are written for a generic plan
    (:func:`inferwatch.collector.stats.planner.compute_stats`); no other statement is prepared (psycopg's own
    preparation after five runs is off), so none gets a generic plan it was not written for."""
    timeouts = timeouts or DbTimeouts()
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return None
    engine = _pg_engine(parsed, timeouts, pool_use_lifo=True, isolation_level=STATS_ISOLATION)
    if parsed.get_driver_name() == "psycopg":
        event.listen(engine, "connect", _stats_connection)
    return engine


def _stats_connection(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.prepare_threshold = NEVER_BY_COUNT  # None would refuse prepare=True too
    if dbapi_connection.info.server_version >= GENERIC_PLANS_FROM:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SET plan_cache_mode = force_generic_plan")
        finally:
            cursor.close()
        dbapi_connection.commit()


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


def _migration_lock(conn: Connection) -> None:
    """PostgreSQL: wait for the migration lock (released with the transaction), which every schema change takes
    (:func:`ensure_schema` at a collector's start, ``inferwatch db upgrade``): one migrates at a time."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATION_LOCK_KEY})


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the schema up to ``revision``, in one transaction (PostgreSQL DDL is transactional), under the
    migration lock that collectors starting take too."""
    with engine.begin() as conn:
        _migration_lock(conn)
        _run_command(conn, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the schema down to ``revision`` (``"base"``: drop everything the migrations made), under the
    migration lock."""
    with engine.begin() as conn:
        _migration_lock(conn)
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
        _migration_lock(conn)
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
