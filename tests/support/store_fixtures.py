"""The fixtures of an empty or a migrated request store on both back ends (SQLite, PostgreSQL): a test module
imports ``db_url_fixture``, ``engine_fixture`` and ``store_fixture`` to use ``db_url``, ``engine`` and ``store``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from inferwatch.collector.store import db
from tests.conftest import postgres_schema


@pytest.fixture(name="db_url", params=["sqlite", "postgresql"])
def db_url_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty database: a SQLite file, or a fresh PostgreSQL schema dropped afterwards."""
    if request.param == "sqlite":
        yield db.default_url(tmp_path / "data")
        return
    with postgres_schema() as url:
        yield url


@pytest.fixture(name="engine")
def engine_fixture(db_url: str) -> Iterator[Engine]:
    """An engine on the empty database (no schema yet)."""
    eng = db.make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture(name="store")
def store_fixture(engine: Engine) -> Engine:
    """An engine on a database migrated to head."""
    db.upgrade(engine)
    return engine
