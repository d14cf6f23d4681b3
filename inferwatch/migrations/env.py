"""Alembic environment of the collector's request store.

Configured from code (``inferwatch.collector.store.db.alembic_config``), not from an ini file; the target
metadata is the store's Core table (``inferwatch.collector.store.tables.METADATA``). The database comes,
in this order, from ``config.attributes["connection"]`` (run inside the caller's transaction),
``config.attributes["engine"]``, or the ``sqlalchemy.url`` option.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, Engine, create_engine, pool

from inferwatch.collector.store.tables import METADATA


def run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=METADATA,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline(url: str) -> None:
    """``--sql`` mode: emit the DDL instead of running it."""
    context.configure(
        url=url,
        target_metadata=METADATA,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=url.startswith("sqlite"),
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    attributes = context.config.attributes
    connection = attributes.get("connection")
    if isinstance(connection, Connection):
        run_with(connection)
        return
    engine = attributes.get("engine")
    if isinstance(engine, Engine):
        with engine.connect() as conn:
            run_with(conn)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database for the migrations: pass a connection or engine, or set sqlalchemy.url")
    own = create_engine(url, poolclass=pool.NullPool)
    try:
        with own.connect() as conn:
            run_with(conn)
    finally:
        own.dispose()


if context.is_offline_mode():
    offline_url = context.config.get_main_option("sqlalchemy.url")
    if not offline_url:
        raise RuntimeError("offline migrations need the sqlalchemy.url option")
    run_offline(offline_url)
else:
    run_online()
