"""Stats at scale: the log-bucket sketch and its bound, the rollup job (idempotent, by id watermark, one pass at a
time), every plan of compute_stats against a brute-force answer, sketched against exact on the same rows, and the
/stats filters. On SQLite and on PostgreSQL (a scratch schema). The expected percentiles come from an oracle of
their own (tests/support/percentiles.py: the nearest-rank definition in integers), never from the collector's
``nearest_rank``, which is itself checked against that oracle, hand-worked ranks and PostgreSQL's
``percentile_disc``."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select, update

from inferwatch.collector.api.app import create_app
from inferwatch.collector.schemas import Stats
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.stats import planner, rollup, sketch, tails, values, windowing
from inferwatch.collector.store import db, inserts
from inferwatch.collector.store.record import RequestRecord
from inferwatch.collector.store.tables import ROLLUP_STATE_TABLE, ROLLUP_TABLE, VALUES_TABLE
from inferwatch.core.schema import E2E, QUEUE, TPOT, TTFT
from tests.conftest import migrated_engine, postgres_schema
from tests.support import percentiles as oracle
from tests.support.old_schema import insert_at_revision

FIELDS = (TTFT, TPOT, E2E, QUEUE)
NOW = datetime(2024, 5, 8, 12, 0, 30, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with migrated_engine(request.param, tmp_path, "iw_st") as eng:
        yield eng


def make_rows(n: int, seed: int = 3, start: int = 0) -> list[RequestRecord]:
    """Requests ending over the 3 days before NOW: 2 engines x 2 models x 3 instances, some nulls and failures,
    a few slow requests that straddle window starts, queue times of exactly 0."""
    rng = random.Random(seed)
    out = []
    for i in range(start, start + n):
        e, m, k = rng.randrange(2), rng.randrange(2), rng.randrange(3)
        end = NOW - timedelta(seconds=rng.uniform(0, 3 * 86400))
        ttft = (0.05 + 0.2 * m) * rng.lognormvariate(0, 0.7)
        e2e = ttft + rng.expovariate(1.0) * (30 if i % 97 == 0 else 1)
        queue = None if e == 1 and k == 2 else (0.0 if rng.random() < 0.3 else rng.expovariate(50))
        out.append(
            RequestRecord(
                trace_id=f"{i + 1:032x}",
                span_id=f"{i + 1:016x}",
                engine=f"eng{e}",
                model=None if (m == 1 and k == 0) else f"model{m}",
                instance=f"inst{e}{m}{k}",
                start_time=end - timedelta(seconds=e2e),
                end_time=end,
                time_to_first_token=ttft,
                time_per_output_token=None if i % 11 == 0 else 0.01 * rng.lognormvariate(0, 0.3),
                request_duration=e2e,
                request_queue=queue,
                prompt_tokens=None if i % 13 == 0 else rng.randrange(1, 4000),
                generation_tokens=rng.randrange(1, 500),
                finish_reason="abort" if i % 50 == 0 else "stop",
                error="boom" if i % 71 == 0 else None,
            )
        )
    return out


def brute(rows: list[RequestRecord], since: datetime, until: datetime | None, group_by: str, **filters: str) -> Any:
    """The expected answer: the oracle's nearest-rank percentiles over the rows that ended in [since, until)."""
    groups: dict[Any, list[RequestRecord]] = {}
    for r in rows:
        if r.end_time < since or (until is not None and r.end_time >= until):
            continue
        if any(getattr(r, k) != v for k, v in filters.items()):
            continue
        groups.setdefault(None if group_by == "none" else getattr(r, group_by), []).append(r)
    out = {}
    for key, rs in groups.items():
        entry: dict[str, Any] = {
            "requests": len(rs),
            "failed": sum(r.finish_reason == "abort" or r.error is not None for r in rs),
        }
        for f in FIELDS:
            vs = sorted(getattr(r, f) for r in rs if getattr(r, f) is not None)
            entry[f] = (len(vs), *(vs[oracle.rank(len(vs), q) - 1] if vs else None for q in windowing.PERCENTILES))
        out[key] = entry
    return out


def answer(stats: Stats, group_by: str) -> Any:
    out = {}
    for g in stats.data:
        entry: dict[str, Any] = {"requests": g.requests, "failed": g.failed}
        for f in FIELDS:
            fs = getattr(g, f)
            entry[f] = (fs.count, fs.p50, fs.p90, fs.p95, fs.p99)
        out[None if group_by == "none" else getattr(g, group_by)] = entry
    return out


# --- the sketch ------------------------------------------------------------------------------------------------------


def test_every_value_is_reported_within_the_relative_accuracy() -> None:
    rng = random.Random(1)
    values = [rng.lognormvariate(0, 4) for _ in range(20_000)] + [*sketch.BOUNDS[:50], 0.0, 5e-7, 1e-6, 2e-6, 1e5]
    for v in (v for v in values if v <= sketch.MAX_VALUE):
        b = sketch.bucket_of(v)
        lo, hi = sketch.bucket_range(b)
        assert (lo is None or lo < v) and (hi is None or v <= hi)
        est = sketch.estimate(b)
        if v <= sketch.MIN_VALUE:
            assert est == 0.0
        else:
            assert abs(est - v) <= sketch.RELATIVE_ACCURACY * v * (1 + 1e-12)


def test_sketches_merge_exactly_and_round_trip() -> None:
    rng = random.Random(2)
    parts = [[rng.expovariate(3) for _ in range(rng.randrange(0, 300))] for _ in range(40)]
    direct = sketch.Histogram()
    direct.add_values(v for p in parts for v in p)
    encoded = []
    for p in parts:
        counts: dict[int, int] = {}
        for v in p:
            counts[sketch.bucket_of(v)] = counts.get(sketch.bucket_of(v), 0) + 1
        encoded.append(sketch.encode(counts))
    merged = sketch.Histogram()
    for data in encoded:
        merged.add_encoded(data)
    assert merged.counts == direct.counts
    at_once = sketch.Histogram()  # all at once, on top of values already counted, with a 64-bit sketch among them
    at_once.add_values([0.5])
    at_once.add_many([*encoded, sketch.encode({3: 2**33})])
    expected = list(direct.counts)
    expected[sketch.bucket_of(0.5)] += 1
    expected[3] += 2**33
    assert at_once.counts == expected
    big = {5: 2**33, 7: 1}
    lo, arr = sketch.decode(sketch.encode(big))
    assert (lo, list(arr)) == (5, [2**33, 0, 1])


# --- the rollup job --------------------------------------------------------------------------------------------------


def totals(engine: Engine) -> tuple[int, int]:
    """Requests in the minute rollups and in the hour rollups (the day rollups must hold as many as the hours)."""
    r = ROLLUP_TABLE
    with engine.connect() as conn:
        minutes, hours, days = (
            conn.execute(select(func.sum(r.c.requests)).where(r.c.period_seconds == period)).scalar_one()
            for period in (60, 3600, 86400)
        )
    assert int(days or 0) == int(hours or 0)
    return int(minutes or 0), int(hours or 0)


@pytest.mark.parametrize("seed", range(12))
def test_gathered_nearest_ranks_are_the_brute_force_ones(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """values.Gather without a database: blocks of several series (one sorted run per series and field, joined
    within a group), raw rows in no order, slots of one run and of many, few runs (copied slice by slice) and
    many (taken at once), values repeated, missing, left out by a filter: every count and nearest rank is
    that of the values sorted one by one."""
    rng = random.Random(seed)
    fields = 3
    if seed % 4 == 0:  # every slot of more than 10 values partitioned at its ranks, not sorted
        monkeypatch.setattr(values, "sort_up_to", lambda: 10)
    series = [(f"e{i % 2}", f"m{i % 3}", f"i{i}", None) for i in range(rng.choice((1, 3, 7)))]
    group_by = rng.choice((None, 0, 1, 2))
    left_out = rng.choice((None, "e1"))

    def group_of(k: values.SeriesKey) -> Any:
        if k[0] == left_out:
            return values.LEFT_OUT
        return None if group_by is None else k[group_by]

    want: dict[Any, list[list[float]]] = {}
    tokens: dict[Any, int] = {}
    gather = values.Gather(fields, group_of)
    kinds = ("blocks", "raw", "both")[seed % 3]
    for _ in range(0 if kinds == "raw" else rng.choice((1, 2, 40 if seed % 2 else 400))):
        block = values.Block(fields)
        for _ in range(rng.randrange(1, 30)):
            k = rng.choice(series)
            vals = [
                None if rng.random() < 0.1 else float(rng.choice((1, 2, 2, 3)) * rng.random()) for _ in range(fields)
            ]
            pt = rng.choice((None, rng.randrange(1, 4000)))
            block.add(k, 0, pt, None, vals)
            if k[0] != left_out:
                key = None if group_by is None else k[group_by]
                tokens[key] = tokens.get(key, 0) + (pt or 0)
                slot = want.setdefault(key, [[] for _ in range(fields)])
                for lst, v in zip(slot, vals, strict=True):
                    if v is not None:
                        lst.append(v)
        gather.add_block(*block.encode())
    for _ in range(0 if kinds == "blocks" else rng.randrange(1, 50)):
        k = rng.choice(series)
        if k[0] == left_out:
            continue
        key = None if group_by is None else k[group_by]
        vals = [None if rng.random() < 0.1 else rng.random() for _ in range(fields)]
        gather.add_rows([key], [0], [7], [None], [[v] for v in vals])
        tokens[key] = tokens.get(key, 0) + 7
        slot = want.setdefault(key, [[] for _ in range(fields)])
        for lst, v in zip(slot, vals, strict=True):
            if v is not None:
                lst.append(v)
    got = dict(zip(gather.keys, gather.ranked(windowing.PERCENTILES), strict=True))
    assert got.keys() == want.keys()
    assert {k: t[2] for k, t in zip(gather.keys, gather.totals().tolist(), strict=True)} == tokens
    for key, per_field in want.items():
        for (n, ps), vs in zip(got[key], per_field, strict=True):
            vs.sort()
            assert n == len(vs)
            assert ps == ([vs[oracle.rank(len(vs), q) - 1] for q in windowing.PERCENTILES] if vs else None)


def test_the_rollups_fold_each_row_once_whatever_races(engine: Engine) -> None:
    rows = make_rows(3000)
    inserts.insert_records(engine, rows[:2000])
    # two passes racing, small chunks: the compare-and-set (and on PostgreSQL the lock) folds each row once
    threads = [threading.Thread(target=rollup.catch_up, args=(engine,), kwargs={"chunk": 97}) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert totals(engine) == (2000, 2000)
    inserts.insert_records(engine, rows[2000:])  # later rows, many of them for minutes already rolled up
    assert rollup.catch_up(engine) == 1000
    assert rollup.catch_up(engine) == 0
    assert totals(engine) == (3000, 3000)
    with engine.connect() as conn:
        assert rollup.watermark(conn) == 3000


def test_postgresql_folds_an_id_only_after_the_grace(engine: Engine) -> None:
    inserts.insert_records(engine, make_rows(50))
    t0 = datetime.now(UTC)
    assert rollup.fold_pass(engine, grace=30, now=t0).folded == 0  # sees id 50
    inserts.insert_records(engine, make_rows(10, start=50))
    assert rollup.fold_pass(engine, grace=30, now=t0 + timedelta(seconds=10)).folded == 0
    res = rollup.fold_pass(engine, grace=30, now=t0 + timedelta(seconds=31))
    assert (res.folded, res.watermark) == (50, 50)  # what it saw 31 s ago, not the 10 rows since
    assert rollup.fold_pass(engine, grace=30, now=t0 + timedelta(seconds=62)).watermark == 60


def test_rollup_job_runs_with_the_collector(tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None)
    app = create_app(settings)
    app.state.rollups.interval = 0.05
    with TestClient(app) as client:
        eng = client.app.state.collector.engine  # type: ignore[attr-defined]
        inserts.insert_records(eng, make_rows(200))
        deadline = datetime.now(UTC) + timedelta(seconds=20)
        while totals(eng)[0] < 200 and datetime.now(UTC) < deadline:
            threading.Event().wait(0.05)
        assert totals(eng) == (200, 200)
        pid = app.state.rollups._process.pid  # a process of its own: its passes hold no GIL against ingest
        assert Path(f"/proc/{pid}/comm").read_text().strip() == rollup.THREAD_NAME
    assert not app.state.rollups.running  # stopped with the collector
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]


def test_value_blocks_merge_across_passes_and_read_back_per_group(engine: Engine) -> None:
    """Rows folded 97 at a time land in minutes folded before (each block merged many times): the blocks hold
    every row once, and the gathered groups, filters and totals are the rows' own, on both back ends."""
    rows = make_rows(2500, seed=5)
    inserts.insert_records(engine, rows)
    rollup.catch_up(engine, chunk=97)
    v = VALUES_TABLE
    with engine.connect() as conn:
        stored = conn.execute(select(v.c.series, v.c.counts, v.c.vals).where(v.c.period_seconds == 60)).all()
    with engine.connect() as conn:  # every ten-minute block (all have ended) is the merge of its minutes
        rows10 = conn.execute(
            select(v.c.period_start, v.c.series, v.c.counts, v.c.vals).where(v.c.period_seconds == 600)
        )
        tens = {start: values.Block.decode(len(FIELDS), *rest) for start, *rest in rows10.all()}
        minutes = conn.execute(
            select(v.c.period_start, v.c.series, v.c.counts, v.c.vals).where(v.c.period_seconds == 60)
        )
        merged: dict[datetime, values.Block] = {}
        for start, *rest in minutes.all():
            merged.setdefault(rollup.ten_of(start), values.Block(len(FIELDS))).merge(
                values.Block.decode(len(FIELDS), *rest)
            )
    assert len(tens) > 400 and tens.keys() == merged.keys()
    assert all(tens[p].encode() == merged[p].encode() for p in tens)
    for group_by, filters in (("none", {}), ("instance", {}), ("model", {"engine": "eng1"}), ("engine", {})):
        gi = {"none": None, "engine": 0, "model": 1, "instance": 2}[group_by]

        def group_of(k: values.SeriesKey, gi: int | None = gi, filters: dict[str, str] = filters) -> Any:
            if any(k[("engine", "model", "instance").index(n)] != x for n, x in filters.items()):
                return values.LEFT_OUT
            return None if gi is None else k[gi]

        gather = values.Gather(len(FIELDS), group_of)
        for series, counts, vals in stored:
            gather.add_block(series, counts, vals)
        expected = brute(rows, NOW - timedelta(days=30), None, group_by, **filters)
        got = {}
        totals = gather.totals().tolist()
        for key, tot, per_field in zip(gather.keys, totals, gather.ranked(windowing.PERCENTILES), strict=True):
            entry: dict[str, Any] = {"requests": tot[0], "failed": tot[1]}
            for f, (n, ps) in zip(FIELDS, per_field, strict=True):
                entry[f] = (n, *(ps if ps is not None else [None] * len(windowing.PERCENTILES)))
            got[key] = entry
        assert got == expected, (group_by, filters)
        want_tokens: dict[Any, int] = {}
        for r in rows:
            if all(getattr(r, n) == x for n, x in filters.items()):
                key = None if gi is None else getattr(r, group_by)
                want_tokens[key] = want_tokens.get(key, 0) + (r.prompt_tokens or 0)
        assert {k: tot[2] for k, tot in zip(gather.keys, totals, strict=True)} == want_tokens
    got_stats = planner.compute_stats(engine=engine, window=timedelta(days=4), group_by="model", now=NOW, plan="values")
    assert got_stats.plan == "values" and answer(got_stats, "model") == brute(
        rows, NOW - timedelta(days=4), None, "model"
    )


def test_upgrading_to_value_blocks_folds_every_row_again(tmp_path: Path) -> None:
    """SQLite at revision 0003 with its rows rolled up (no value blocks yet): migration 0004 empties the rollups
    and resets the watermark, the job folds every row again into both, and a small window is exact from them."""
    eng = db.make_engine(db.default_url(tmp_path))
    db.upgrade(eng, "0003")
    rows = make_rows(1200, seed=8)
    insert_at_revision(eng, rows)
    r, s = ROLLUP_TABLE, ROLLUP_STATE_TABLE
    with eng.begin() as conn:  # what 0003's job left: a watermark past every row, a rollup row
        conn.execute(s.insert().values(name=rollup.STATE_NAME, folded_id=1200, updated_at=NOW))
    db.upgrade(eng)
    with eng.connect() as conn:
        assert rollup.watermark(conn) == 0 and conn.execute(select(func.count()).select_from(r)).scalar_one() == 0
    assert rollup.catch_up(eng) == 1200
    since = NOW - timedelta(minutes=90)
    got = planner.compute_stats(engine=eng, window=timedelta(minutes=90), group_by="instance", now=NOW)
    assert got.plan == "values" and answer(got, "instance") == brute(rows, since, None, "instance")
    eng.dispose()


def test_upgrading_to_day_rollups_folds_every_row_again(tmp_path: Path) -> None:
    """A store rolled up at revision 0005 (minutes and hours): migration 0006 empties the rollups, the blocks and
    the watermark, the job folds every row again, into days too, and a week's window is exact from them."""
    eng = db.make_engine(db.default_url(tmp_path))
    db.upgrade(eng, "0005")
    rows = make_rows(1500, seed=10)
    insert_at_revision(eng, rows)
    with eng.begin() as conn:  # what 0005's job left: a watermark past every row (and rollups without days)
        conn.execute(ROLLUP_STATE_TABLE.insert().values(name=rollup.STATE_NAME, folded_id=1500, updated_at=NOW))
    db.upgrade(eng)
    with eng.connect() as conn:
        assert rollup.watermark(conn) == 0
        assert conn.execute(select(func.count()).select_from(ROLLUP_TABLE)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(VALUES_TABLE)).scalar_one() == 0
    assert rollup.catch_up(eng) == 1500
    with eng.connect() as conn:
        days = select(func.count()).select_from(ROLLUP_TABLE).where(ROLLUP_TABLE.c.period_seconds == 86400)
        assert conn.execute(days).scalar_one() > 0
    for plan in ("index", "scan"):
        got = planner.compute_stats(engine=eng, window=timedelta(days=7), group_by="model", now=NOW, plan=plan)
        assert answer(got, "model") == brute(rows, NOW - timedelta(days=7), None, "model"), plan
    eng.dispose()


def test_postgresql_upgrading_to_value_blocks_folds_every_row_again() -> None:
    """PostgreSQL at revision 0004 (rolled up, no value blocks: they were SQLite's only): migration 0005 empties
    the rollups and resets the watermark, the job folds every row again into both, and a small window is exact
    from the blocks."""
    with postgres_schema("iw_st") as url:
        eng = db.make_engine(url)
        db.upgrade(eng, "0004")
        rows = make_rows(1200, seed=9)
        insert_at_revision(eng, rows)
        with eng.begin() as conn:  # what 0004's job left: a watermark past every row, no blocks
            conn.execute(ROLLUP_STATE_TABLE.insert().values(name=rollup.STATE_NAME, folded_id=1200, updated_at=NOW))
        db.upgrade(eng)
        with eng.connect() as conn:
            assert rollup.watermark(conn) == 0
        assert rollup.catch_up(eng) == 1200
        with eng.connect() as conn:
            assert conn.execute(select(func.count()).select_from(VALUES_TABLE)).scalar_one() > 0
        since = NOW - timedelta(minutes=90)
        got = planner.compute_stats(engine=eng, window=timedelta(minutes=90), group_by="model", now=NOW)
        assert got.plan == "values" and answer(got, "model") == brute(rows, since, None, "model")
        eng.dispose()


# --- the plans -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group_by", ["none", "engine", "model", "instance"])
def test_every_plan_is_exact_on_every_window(engine: Engine, group_by: str) -> None:
    rows = make_rows(4000)
    inserts.insert_records(engine, rows[:3500])
    rollup.catch_up(engine)
    inserts.insert_records(engine, rows[3500:])  # not rolled up yet: read raw above the watermark
    windows = [
        (NOW - timedelta(hours=1), None),
        (NOW - timedelta(hours=25, seconds=17), None),
        (NOW - timedelta(days=10), None),
        (NOW - timedelta(hours=30, seconds=7), NOW - timedelta(hours=3, seconds=45)),
        (NOW - timedelta(minutes=50, seconds=1), NOW - timedelta(minutes=20, seconds=2)),
        (NOW - timedelta(hours=5, seconds=70), NOW - timedelta(hours=5, seconds=25)),  # across a minute's start
    ]
    minutes: dict[datetime, list[RequestRecord]] = {}
    for r in sorted(rows, key=lambda r: r.end_time):
        minutes.setdefault(r.end_time.replace(second=0, microsecond=0), []).append(r)
    a, b = next(rs[:2] for _, rs in sorted(minutes.items()) if len(rs) > 1 and rs[1].end_time > rs[0].end_time)
    windows.append((a.end_time, a.end_time + (b.end_time - a.end_time) / 2))  # within a minute: a, not b
    for since, until in windows:
        expected = brute(rows, since, until, group_by)
        for plan in ("values", "raw", "scan", "index", "walk", None):
            got = planner.compute_stats(
                engine=engine, window=timedelta(hours=1), since=since, until=until, group_by=group_by,  # type: ignore[arg-type]
                now=NOW, plan=plan,
            )  # fmt: skip
            assert answer(got, group_by) == expected, (since, until, plan)
            # no fallback: the rollups and the value blocks agree with the table (4,000 rows: a small window),
            # on both back ends
            assert got.plan == ("values" if plan is None else plan), (since, until, plan)
            assert all(getattr(g, f).exact for g in got.data for f in FIELDS)


def test_filters_narrow_every_plan(engine: Engine) -> None:
    rows = make_rows(2000)
    inserts.insert_records(engine, rows)
    rollup.catch_up(engine)
    since = NOW - timedelta(days=2)
    for filters in ({"engine": "eng1"}, {"model": "model0", "instance": "inst000"}, {"instance": "nope"}):
        expected = brute(rows, since, None, "instance", **filters)
        for plan in ("values", "raw", "scan", "index", "sketch", None):
            got = planner.compute_stats(
                engine=engine, window=timedelta(days=2), group_by="instance", now=NOW,
                filters=windowing.StatsFilter(**filters), plan=plan,  # type: ignore[arg-type]
            )  # fmt: skip
            assert {k: v["requests"] for k, v in answer(got, "instance").items()} == {
                k: v["requests"] for k, v in expected.items()
            }
            if plan != "sketch":
                assert answer(got, "instance") == expected


@pytest.fixture
def pg_engine() -> Iterator[Engine]:
    with postgres_schema("iw_st") as url:
        eng = db.make_engine(url)
        db.ensure_schema(eng)
        yield eng
        eng.dispose()


def test_the_index_plan_shares_its_statements_with_a_second_connection_in_the_same_snapshot(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a second connection joins the exported snapshot and takes statements; rows committed after the
    snapshot are seen by neither (the answer is the snapshot's); one that cannot join leaves all to the first."""
    engine = pg_engine
    rows = make_rows(2000)
    inserts.insert_records(engine, rows)
    rollup.catch_up(engine)
    since = NOW - timedelta(days=2)
    expected = brute(rows, since, None, "model")
    joined: list[bool] = []
    real = tails.snapshot_connection

    @contextlib.contextmanager
    def spying(eng: Engine, snapshot: str) -> Iterator[Any]:
        # a row that ends in the window, committed after the snapshot was exported: invisible to both sides
        late = make_rows(1, seed=99, start=10_000)[0]
        end = NOW - timedelta(hours=1)
        inserts.insert_records(eng, [dataclasses.replace(late, start_time=end - timedelta(seconds=1), end_time=end)])
        with real(eng, snapshot) as c:
            joined.append(c is not None)
            yield c

    monkeypatch.setattr(tails, "snapshot_connection", spying)
    got = planner.compute_stats(engine=engine, window=timedelta(days=2), group_by="model", now=NOW, plan="index")
    assert joined == [True] and answer(got, "model") == expected
    with real(engine, "00000003-0000001B-1") as c:  # not an exported snapshot: no second connection
        assert c is None


def test_sketched_percentiles_are_within_the_bound_of_the_exact_ones(engine: Engine) -> None:
    """The same rows, answered exactly and sketched: counts equal, every percentile within the stated bound."""
    rows = make_rows(6000, seed=11)
    inserts.insert_records(engine, rows)
    rollup.catch_up(engine)
    for group_by in ("none", "model", "instance"):
        for window in (timedelta(hours=6), timedelta(days=4)):
            exact = planner.compute_stats(engine=engine, window=window, group_by=group_by, now=NOW, mode="exact")
            sketched = planner.compute_stats(engine=engine, window=window, group_by=group_by, now=NOW, mode="sketch")
            assert sketched.plan == "sketch" and exact.plan in ("values", "raw", "scan", "index")
            for e, s in zip(exact.data, sketched.data, strict=True):
                assert (e.requests, e.failed, e.prompt_tokens) == (s.requests, s.failed, s.prompt_tokens)
                for f in FIELDS:
                    ef, sf = getattr(e, f), getattr(s, f)
                    assert ef.exact and ef.relative_error == 0.0
                    assert not sf.exact and sf.relative_error == sketch.RELATIVE_ACCURACY
                    assert ef.count == sf.count
                    for q in ("p50", "p90", "p95", "p99"):
                        a, b = getattr(ef, q), getattr(sf, q)
                        if a is None or a <= sketch.MIN_VALUE:
                            assert b == (None if a is None else 0.0)
                        else:
                            assert abs(b - a) <= sf.relative_error * a * (1 + 1e-12), (f, q, a, b)


def test_rollups_that_disagree_with_the_table_are_noticed(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row below the watermark that the rollups never saw (an insert that committed after the grace):
    the exact answer is still exact, by the index walks."""
    rows = make_rows(1500)
    inserts.insert_records(engine, rows[:1000])
    s = ROLLUP_STATE_TABLE
    with engine.begin() as conn:  # the watermark moved past rows the rollups do not hold
        rollup.catch_up(engine)
        conn.execute(update(s).values(folded_id=5000))
    inserts.insert_records(engine, rows[1000:])
    expected = brute(rows, NOW - timedelta(days=4), None, "none")
    monkeypatch.setattr(planner, "RAW_LIMIT", 0)
    got = planner.compute_stats(engine=engine, window=timedelta(days=4), now=NOW, plan=None)
    assert got.plan == "walk"
    assert answer(got, "none") == expected


# --- /stats filters over HTTP ----------------------------------------------------------------------------------------


def test_stats_filters_over_http(tmp_path: Path) -> None:
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None)
    with TestClient(create_app(settings)) as client:
        eng = client.app.state.collector.engine  # type: ignore[attr-defined]
        now = datetime.now(UTC)
        rows = [
            RequestRecord(
                trace_id=f"{i + 1:032x}",
                span_id=f"{i + 1:016x}",
                engine=("vllm", "tgi")[i % 2],
                model=f"m{i % 3}",
                instance=f"i{i % 4}",
                start_time=now - timedelta(minutes=i, seconds=2),
                end_time=now - timedelta(minutes=i),
                time_to_first_token=0.01 * (i + 1),
                request_duration=2.0,
            )
            for i in range(120)
        ]
        inserts.insert_records(eng, rows)
        get = client.get
        assert get("/api/v1/stats", params={"window": "3h", "engine": "tgi"}).json()["data"][0]["requests"] == 60
        body = get("/api/v1/stats", params={"window": "3h", "model": "m1", "instance": "i1", "group_by": "engine"})
        assert [(g["engine"], g["requests"]) for g in body.json()["data"]] == [("tgi", 10)]
        since = (now - timedelta(minutes=30, seconds=30)).isoformat()
        until = (now - timedelta(minutes=9, seconds=30)).isoformat()
        r = get("/api/v1/stats", params={"since": since, "until": until}).json()
        assert r["data"][0]["requests"] == 21 and r["until"] is not None  # minutes 10..30
        assert r["data"][0][TTFT]["p50"] == pytest.approx(0.21) and r["data"][0][TTFT]["exact"] is True
        sk = get("/api/v1/stats", params={"window": "3h", "percentiles": "sketch"}).json()
        assert sk["plan"] == "sketch" and sk["data"][0][TTFT]["relative_error"] == sketch.RELATIVE_ACCURACY
        assert get("/api/v1/stats", params={"since": until, "until": since}).status_code == 400
        assert get("/api/v1/stats", params={"until": "yesterday"}).status_code == 400
        assert get("/api/v1/stats", params={"model": "m\x00"}).status_code == 400
        assert get("/api/v1/stats", params={"percentiles": "roughly"}).status_code == 422
        params = {p["name"] for p in client.get("/openapi.json").json()["paths"]["/api/v1/stats"]["get"]["parameters"]}
        assert {"engine", "model", "instance", "since", "until", "percentiles"} <= params
