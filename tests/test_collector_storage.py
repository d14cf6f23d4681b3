"""The collector's request store: migrations, idempotent inserts, and the rows and spool lines the driver's fast
path writes. The writer and its spool are ``tests/test_collector_writer.py``'s.

Every test runs on SQLite (a file under tmp_path) and on PostgreSQL (a fresh schema per test, on
``INFERWATCH_TEST_POSTGRES_URL`` or the local default). PostgreSQL tests skip when the server is
unreachable, but fail when the ``CI`` environment variable is set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, Index, MetaData, RowMapping, inspect, select, text

from inferwatch.collector.store import db, inserts, retention
from inferwatch.collector.store.record import CACHED_TOKENS, E2E, TTFT, RequestRecord
from inferwatch.collector.store.rows import RECORD_FIELDS, record_from_json, record_to_json
from inferwatch.collector.store.tables import METADATA, NAMING_CONVENTION, REQUEST_TABLE, TABLE_NAME
from tests.conftest import postgres_schema
from tests.support.store_fixtures import db_url_fixture, engine_fixture, store_fixture  # noqa: F401 (fixtures)
from tests.support.store_records import (
    T0,
    batch,
    count,
    keys,
    make_record,
    stored_keys,
)

# --- fixtures --------------------------------------------------------------------------------------------------------


def as_record(row: RowMapping) -> RequestRecord:
    """A stored row back as a record (``id`` and ``received_at`` dropped): the row's keys are its fields."""
    return RequestRecord(**{k: v for k, v in row.items() if k not in ("id", "received_at")})


# --- schema and migrations -------------------------------------------------------------------------------------------


def test_upgrade_creates_the_table(engine: Engine) -> None:
    assert db.is_empty(engine)
    assert db.current_revision(engine) is None
    db.upgrade(engine)
    assert db.current_revision(engine) == db.head_revision()
    assert db.at_head(engine)
    insp = inspect(engine)
    assert REQUEST_TABLE.name in insp.get_table_names()
    columns = {c["name"] for c in insp.get_columns(REQUEST_TABLE.name)}
    assert columns == RECORD_FIELDS | {"id", "received_at"}
    indexed = {tuple(ix["column_names"]) for ix in insp.get_indexes(REQUEST_TABLE.name)}
    assert {("start_time",), ("engine", "model", "start_time"), ("request_id",)} <= indexed
    assert {("end_time",), *((c, "end_time", "engine", "model", "instance") for c in (TTFT, E2E))} <= indexed
    uniques = [tuple(uc["column_names"]) for uc in insp.get_unique_constraints(REQUEST_TABLE.name)]
    assert uniques == [("trace_id", "span_id")]


def test_record_fields_are_the_columns() -> None:
    """Column names (and Core keys) are RequestRecord's field names: a record's __dict__ is its row."""
    assert set(REQUEST_TABLE.c.keys()) == RECORD_FIELDS | {"id", "received_at"}
    assert all(column.key == column.name for column in REQUEST_TABLE.c)
    assert REQUEST_TABLE.name == TABLE_NAME
    assert REQUEST_TABLE.c[TTFT].name == "time_to_first_token"
    assert REQUEST_TABLE.c[CACHED_TOKENS].name == "prefix_cache_hit_tokens"


def test_downgrade_to_base_and_upgrade_again(store: Engine) -> None:
    assert inserts.insert_records(store, batch(3)) == (3, 0)
    db.downgrade(store, "base")
    assert db.current_revision(store) is None
    assert REQUEST_TABLE.name not in inspect(store).get_table_names()
    db.upgrade(store)
    assert db.at_head(store)
    assert count(store) == 0


def test_models_match_migrations(store: Engine) -> None:
    """The tables of ``collector.models`` are what the migrations create: autogenerate finds nothing to do."""
    assert list(METADATA.tables) == [
        TABLE_NAME,
        "alert_notifications",
        "incidents",
        "alerts",
        "incident_events",
        "deliveries",
        "delivery_attempts",
        "request_rollups",
        "request_values",
        "rollup_state",
    ]
    with store.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        assert compare_metadata(context, METADATA) == []
        # the comparison sees indexes and nullability: a changed copy of the table differs
        changed = MetaData(naming_convention=NAMING_CONVENTION)
        for other in METADATA.tables.values():
            if other is not REQUEST_TABLE:
                other.to_metadata(changed)
        table = REQUEST_TABLE.to_metadata(changed)
        Index(f"ix_{TABLE_NAME}_probe", table.c.service)
        table.c.model.nullable = False
        diff = compare_metadata(context, changed)
    assert {d[0] if isinstance(d, tuple) else d[0][0] for d in diff} == {"add_index", "modify_nullable"}


def test_ensure_schema(engine: Engine) -> None:
    db.ensure_schema(engine)
    assert db.at_head(engine)
    db.ensure_schema(engine)  # at head: nothing to do
    assert db.at_head(engine)

    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffffffff'"))
    with pytest.raises(db.SchemaError, match="does not know"):
        db.ensure_schema(engine)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE alembic_version SET version_num = '{db.head_revision()}'"))

    db.downgrade(engine, "base")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE somebody_elses (x INTEGER)"))
    with pytest.raises(db.SchemaError, match="no Alembic version"):
        db.ensure_schema(engine)


def test_ensure_schema_creates_and_upgrades(engine: Engine) -> None:
    db.ensure_schema(engine)  # empty database
    assert db.at_head(engine)
    db.downgrade(engine, "base")  # alembic_version left, empty
    db.ensure_schema(engine)
    assert db.at_head(engine)


def test_sqlite_engine_settings(tmp_path: Path) -> None:
    url = db.default_url(tmp_path / "new" / "dir")
    assert url.endswith("inferwatch.db")
    eng = db.make_engine(url)
    try:
        with eng.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL: a commit is on disk when it returns
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
            assert cast(int, conn.execute(text("PRAGMA busy_timeout")).scalar()) > 0
    finally:
        eng.dispose()
    assert (tmp_path / "new" / "dir" / "inferwatch.db").exists()


def test_alembic_config_needs_no_ini() -> None:
    cfg = db.alembic_config("sqlite://")
    assert cfg.config_file_name is None
    assert Path(cfg.get_main_option("script_location") or "").joinpath("env.py").is_file()
    assert db.head_revision() == "0008"


# --- inserts ---------------------------------------------------------------------------------------------------------


def test_insert_is_idempotent(store: Engine) -> None:
    records = batch(3)
    assert inserts.insert_records(store, records) == (3, 0)
    assert inserts.insert_records(store, records) == (0, 3)
    assert count(store) == 3
    # the two samples of an n=2 request: one request id, two spans
    samples = [make_record(10, trace=7, request_id="r-n2"), make_record(11, trace=7, request_id="r-n2")]
    assert inserts.insert_records(store, samples) == (2, 0)
    # duplicates inside one batch count as duplicates
    assert inserts.insert_records(store, [*batch(2, trace=8), *batch(2, trace=8)]) == (2, 2)
    assert inserts.insert_records(store, []) == (0, 0)
    assert count(store) == 7


def test_values_round_trip(store: Engine) -> None:
    cest = timezone(timedelta(hours=2))
    record = RequestRecord(
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
        engine="tgi",
        start_time=datetime(2024, 5, 1, 14, 3, 4, 123456, tzinfo=cest),
        end_time=datetime(2024, 5, 1, 12, 3, 9, 654321, tzinfo=UTC),
        request_id="chatcmpl-1",
        model="meta-llama/Llama-3.1-8B-Instruct",
        instance="host-1:8000",
        service="tgi",
        time_to_first_token=0.1 + 0.2,
        ttft_derived=True,
        time_per_output_token=2.2250738585072014e-308,
        request_duration=123456.78901234567,
        request_queue=1.7976931348623157e308,
        request_prefill=0.0,
        request_decode=1 / 3,
        prompt_tokens=2**40,
        generation_tokens=1,
        prefix_cache_hit_tokens=0,
        finish_reason="length",
        error="bad \"quote\" and 'single' — ünïcode ✓",
        n=2,
        max_tokens=4096,
        temperature=0.7,
        lora_adapter="sql-lora",
        attributes={
            "gen_ai.request.top_p": 0.95,
            "float": 0.1 + 0.2,
            "big": 2**53 + 1,
            "nested": {"list": [1, 2.5, "x", None, True, False], "empty": {}},
            "text": "héllo ✓",
        },
    )
    minimal = make_record(5, trace=2)
    assert inserts.insert_records(store, [record, minimal]) == (2, 0)
    with store.connect() as conn:
        rows = {r["span_id"]: r for r in conn.execute(select(REQUEST_TABLE)).mappings()}
    got = as_record(rows[record.span_id])
    assert got == record
    for value in (got.start_time, got.end_time, rows[record.span_id]["received_at"]):
        assert value.utcoffset() == timedelta(0)
    assert got.start_time == datetime(2024, 5, 1, 12, 3, 4, 123456, tzinfo=UTC)
    assert rows[record.span_id][TTFT] == 0.1 + 0.2
    assert as_record(rows[minimal.span_id]) == minimal
    assert rows[minimal.span_id]["attributes"] == {}


def test_json_serializer_round_trips() -> None:
    record = make_record(1, attributes={"x": [0.1, None, "é"]}, temperature=1 / 3, ttft_derived=True)
    line = record_to_json(record)
    assert "\n" not in line
    assert record_from_json(line) == record
    assert record_from_json(line.encode()) == record


def test_delete_older_than(store: Engine) -> None:
    old = batch(4, trace=1, start=T0 - timedelta(days=3))
    new = batch(3, trace=2, start=T0)
    inserts.insert_records(store, old + new)
    assert retention.delete_older_than(store, T0 - timedelta(days=1)) == 4
    assert stored_keys(store) == keys(new)
    assert retention.delete_older_than(store, T0 - timedelta(days=1)) == 0


# --- the driver fast path and the spool lines ------------------------------------------------------------------------


def _stored_fast_and_core(store: Engine, records: list[RequestRecord]) -> tuple[list[Any], list[Any]]:
    """Store ``records`` through the driver's fast path (:func:`inserts.insert_records`, asserted to insert them all)
    and their twins (trace id 99) through SQLAlchemy Core's insert; each side's stored columns but the id, trace
    id and arrival, by span id."""
    from sqlalchemy import insert

    twins = [RequestRecord(**{**vars(r), "trace_id": f"{99:032x}"}) for r in records]
    assert inserts.insert_records(store, records) == (len(records), 0)
    with store.begin() as conn:
        conn.execute(insert(REQUEST_TABLE), [{**vars(r), "received_at": T0} for r in twins])
    columns = [c for c in REQUEST_TABLE.c if c.key not in ("id", "trace_id", "received_at")]
    with store.connect() as conn:
        rows = conn.execute(select(REQUEST_TABLE.c.trace_id, *columns).order_by(REQUEST_TABLE.c.span_id)).all()
    fast = [tuple(r[1:]) for r in rows if r[0] != f"{99:032x}"]
    core = [tuple(r[1:]) for r in rows if r[0] == f"{99:032x}"]
    return fast, core


def test_the_fast_path_stores_what_core_would(store: Engine) -> None:
    """Rows inserted through the driver's fast path (executemany of tuples on SQLite, COPY on PostgreSQL) hold
    exactly what SQLAlchemy Core's insert of the same records stores, down to SQLite's stored time text."""
    cest = timezone(timedelta(hours=2))
    records = [
        make_record(1, attributes={"f": 0.1 + 0.2, "n": None, "s": "é ✓", "l": [1, 2.5, {"k": True}]}),
        make_record(2, start=datetime(2024, 5, 1, 14, 0, 0, 0, tzinfo=cest), temperature=1 / 3, ttft_derived=True),
        make_record(3, start=datetime(2024, 5, 1, 12, 0, 0, 7), prompt_tokens=2**62, n=7, error="a\tb\nc\\d"),
    ]
    fast, core = _stored_fast_and_core(store, records)
    assert fast == core
    with store.connect() as conn:
        if store.dialect.name == "sqlite":  # the stored text itself, which the time indexes order
            raw = conn.exec_driver_sql(f"SELECT trace_id, start_time, end_time FROM {TABLE_NAME} ORDER BY span_id")
            by_trace: dict[str, list[tuple[str, str]]] = {}
            for trace_id, start, end in raw:
                by_trace.setdefault(trace_id, []).append((start, end))
            assert by_trace[f"{1:032x}"] == by_trace[f"{99:032x}"]
            assert by_trace[f"{1:032x}"][1][0] == "2024-05-01 12:00:00.000000"


@pytest.fixture
def pg_store() -> Iterator[Engine]:
    """A PostgreSQL store migrated to head (a fresh schema)."""
    with postgres_schema() as url:
        eng = db.make_engine(url)
        db.upgrade(eng)
        yield eng
        eng.dispose()


_TEXT_EDGES = ["\\N", "\\", "a\tb", "a\nb", "a\rb", "null", "a,b", '"q"', "None", "", "é ✓ 日本", "\\.", "\U0001f600"]
_storable = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
"""What PostgreSQL's text holds: no NUL, no lone surrogate (refused before a row is made)."""
_some_text = st.one_of(st.sampled_from(_TEXT_EDGES), st.text(_storable, max_size=12))
_texts = st.none() | _some_text
_floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-0.0, 5e-324, 1e16]))
_bigints = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))
_zones = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-9, minutes=-30)), None])
_times = st.builds(lambda t, tz: t.replace(tzinfo=tz), st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30)), _zones)
_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        _some_text,
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(_storable, max_size=4), inner, max_size=3),
    max_leaves=6,
)
_BY_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "str | None": _texts,
    "float | None": _floats,
    "int | None": _bigints,
    "bool": st.booleans(),
}
_records = st.builds(
    lambda i, **kw: make_record(i, **kw),
    st.just(0),
    **{
        f.name: _BY_TYPE[str(f.type)]
        for f in dataclasses.fields(RequestRecord)
        if str(f.type) in _BY_TYPE and f.name != "n"
    },
    start=_times,
    engine=_some_text,
    n=st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    attributes=st.dictionaries(st.text(_storable, max_size=6), _json, max_size=4),
)
"""Records with every column drawn by its type (text, floats, 64-bit integers, the flag), ``n`` 32-bit."""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_records, min_size=1, max_size=12))
def test_copy_lines_store_what_core_would(pg_store: Engine, records: list[RequestRecord]) -> None:
    """PostgreSQL's rows go in as lines of COPY's text format made by the worker processes (orjson writes a
    row's numbers and times, its text columns are joined as they are, a row with a value COPY would read
    otherwise is escaped field by field): whatever the values (text with backslashes, tabs, newlines or
    ``\\N``; NaN, infinities, -0.0, subnormals; 64-bit integers; times in any zone or naive; nested
    attributes), the stored row is exactly what SQLAlchemy Core's insert of the same record stores."""
    from sqlalchemy import delete

    for i, record in enumerate(records):
        record.span_id = f"{i + 1:016x}"
    with pg_store.begin() as conn:
        conn.execute(delete(REQUEST_TABLE))
    fast, core = _stored_fast_and_core(pg_store, records)
    assert [tuple(map(repr, r)) for r in fast] == [tuple(map(repr, r)) for r in core]  # NaN equal to NaN


def test_usual_rows_take_the_batched_copy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A usual batch (UTC times, finite numbers, plain text) never goes field by field (the slow path costs
    three times as much in the workers); a row that needs escaping does, alone in its batch."""
    from inferwatch.collector.store import rows

    slow: list[str] = []
    reference = rows.copy_line

    def counted(record: RequestRecord, attributes_json: str | None = None) -> str:
        slow.append(record.span_id)
        return reference(record, attributes_json)

    monkeypatch.setattr(rows, "copy_line", counted)
    usual = batch(50, attributes={"k": "v", "x": 1.5, "q": 'say "hi"'})
    lines, _ = rows.prepare(usual, "postgresql")
    assert slow == [] and len(lines) == 50
    assert all(isinstance(line, str) and line.count("\t") == len(rows.COPY_COLUMNS) - 1 for line in lines)
    odd = [*batch(3), make_record(3, model="a\tb"), make_record(4, temperature=float("nan"))]
    odd.append(make_record(5, start=datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))))
    rows.prepare(odd, "postgresql")
    assert sorted(slow) == [odd[3].span_id, odd[4].span_id, odd[5].span_id]


def test_spool_lines_read_back_into_the_same_record() -> None:
    """orjson writes the lines; what it refuses or would change (NaN, lone surrogates, integers beyond 64 bits)
    goes through the standard library, and every line reads back into the record it came from."""
    import json
    import math

    from inferwatch.collector.store.rows import dumps, prepare

    cases = [
        make_record(1, attributes={"x": [0.1, None, "é", {"deep": [1e-300, 2**63 - 1]}]}),
        make_record(2, attributes={"nan": float("nan"), "inf": [float("-inf")]}),
        make_record(3, attributes={"s": "lone \ud800 surrogate"}, model="m\ud83d"),
        make_record(4, attributes={"big": 2**70}, prompt_tokens=2**64),
        make_record(5, temperature=float("nan"), attributes={}),
    ]
    rows, lines = prepare(cases, "sqlite")
    for record, line, row in zip(cases, lines, rows, strict=True):
        back = record_from_json(line)
        assert record_to_json(record) == line
        assert "\n" not in line
        for name in RECORD_FIELDS - {"attributes", "temperature"}:
            assert getattr(back, name) == getattr(record, name), name
        assert json.dumps(back.attributes, sort_keys=True) == json.dumps(record.attributes, sort_keys=True)
        assert json.loads(row[-1]) == json.loads(dumps(record.attributes))
    assert math.isnan(record_from_json(lines[4]).temperature or 0.0)
    assert math.isnan(record_from_json(lines[1]).attributes["nan"])


NUL_OR_SURROGATE = "a NUL character or lone surrogate in an attribute"
NON_FINITE = "a non-finite number in an attribute"


@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        ({}, None),
        ({"a": "x", "b": 1, "c": 0.5, "d": True, "e": None}, None),
        ({"nul\x00key": 1}, NUL_OR_SURROGATE),
        ({"k": "nul \x00 value"}, NUL_OR_SURROGATE),
        ({"k": "lone \udc00 surrogate"}, NUL_OR_SURROGATE),
        ({"k": "é non-ASCII but storable"}, None),
        ({"k": float("nan")}, NON_FINITE),
        ({"k": float("inf")}, NON_FINITE),
        ({1: "a non-str key"}, None),
        ({"k": ["a", {"deep": "\x00"}]}, NUL_OR_SURROGATE),
        ({"k": {"nested": float("-inf")}}, NON_FINITE),
        ({"k": ["é", 2, {"x": None}]}, None),
    ],
)
def test_refusal_shortcut_says_what_the_walk_says(attributes: dict[Any, Any], reason: str | None) -> None:
    """The flat-attribute shortcut of PostgreSQL's refusal check gives the full walk's answer, SQLite refuses none
    of these, and each record's spool line (orjson's encoding of the record where it can) reads back the same."""
    import json

    from inferwatch.collector.store import rows

    record = make_record(1, attributes=attributes)
    assert rows.refusal(record, "postgresql") == reason
    assert rows.refusal(record, "sqlite") is None
    back = record_from_json(record_to_json(record))
    expected = {str(k): v for k, v in attributes.items()}  # JSON keys are strings
    assert json.dumps(back.attributes, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert {f: getattr(back, f) for f in RECORD_FIELDS - {"attributes"}} == {
        f: getattr(record, f) for f in RECORD_FIELDS - {"attributes"}
    }
