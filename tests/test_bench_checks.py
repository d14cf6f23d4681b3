"""The verdicts of bench/exporter_fleet.py, bench/stats.py and bench/retention.py, each at its threshold exactly
and just past it: a benchmark must fail when its work did not happen or came out wrong, not only when it is slow."""

from __future__ import annotations

import math

import pytest

from bench import exporter_fleet, retention, stats
from inferwatch.core import vocabulary as V
from tests.support import percentiles as oracle


def test_fleet_coalescing_verdict_at_its_threshold() -> None:
    """10 engines: 11 requests in a run is 1.1 per engine, the target itself; 12 is a miss; an engine not
    asked at all is a miss however few the requests."""
    assert exporter_fleet.MAX_PER_INTERVAL == 1.1
    once = [1] * 10
    assert exporter_fleet.judge(8, [once, once])[1] == []
    assert exporter_fleet.judge(8, [once, [2] + [1] * 9])[1] == []  # 1.1 exactly
    (miss,) = exporter_fleet.judge(32, [once, [2, 2] + [1] * 8])[1]
    assert "1.20 engine requests per engine" in miss
    (miss,) = exporter_fleet.judge(8, [[0] + [1] * 9])[1]
    assert "not asked at all" in miss
    assert len(exporter_fleet.judge(8, [[0] + [8] * 9])[1]) == 2
    line, _ = exporter_fleet.judge(32, [once, [2] + [1] * 9])
    assert "worst run 1.10" in line and "at most 2, at least 1" in line and len(line) <= 80


def test_fleet_compares_pages_without_the_scrape_durations_only() -> None:
    duration, up = V.EXPORTER_SCRAPE_DURATION.name, V.EXPORTER_UP.name
    a = f'# TYPE {duration} gauge\n{duration}{{target="e0"}} 0.25\n{up}{{target="e0"}} 1.0\n'
    b = a.replace("0.25", "0.5")
    assert exporter_fleet.digest(a.encode()) == exporter_fleet.digest(b.encode())
    assert exporter_fleet.digest(a.encode()) != exporter_fleet.digest(a.replace("1.0", "0.0").encode())
    assert exporter_fleet.page_lines(a) == [f"# TYPE {duration} gauge", f'{up}{{target="e0"}} 1.0']


def case(ours: float, base: float, *, window: str = "1h", rows: int = 1_000_000, **kw: object) -> stats.Case:
    fields: dict[str, object] = {"plan": "values", "identical": True, "groups": 1, "requests": rows, **kw}
    return stats.Case("sqlite", rows, window, "none", ours, base, **fields)  # type: ignore[arg-type]


def test_stats_verdict_at_its_thresholds() -> None:
    assert stats.TARGET_RATIO == 0.5
    assert stats.misses([case(0.5, 1.0)]) == []  # 0.5x exactly
    assert stats.misses([case(math.nextafter(0.5, 1.0), 1.0)])  # just over
    assert stats.misses([case(0.9, 1.0, rows=stats.RATIO_FROM_ROWS - 1)]) == []  # below the size judged
    assert stats.misses([case(0.9, 1.0, rows=stats.RATIO_FROM_ROWS)])  # the size judged, exactly
    assert stats.misses([case(0.1, 1.0, identical=False)])
    assert stats.misses([case(0.1, 1.0, groups=0)])  # nothing answered
    assert stats.misses([case(0.1, 1.0, window="7d", requests=1_000_000)]) == []  # every row counted
    assert stats.misses([case(0.1, 1.0, window="7d", requests=999_999)])  # a row missed


def test_stats_hand_checks_of_the_oracle_pass() -> None:
    assert stats.hand_checks(["sqlite"]) == []


def test_the_oracle_takes_whole_percents_only() -> None:
    assert oracle.rank(3, 1.0) == 3
    for q in (0.0, 0.333, 1.5):
        with pytest.raises(ValueError, match="whole percents"):
            oracle.rank(10, q)


def passed(**kw: float) -> dict[str, float]:
    f = {"finished": True, "deleted": 200.0, "left": 0.0, "total": 150.0, "stored": 50.0, **kw}
    return f


def test_retention_verdict_requires_exactly_the_old_rows_deleted() -> None:
    assert retention.wrong(passed(), rows=200, recent=100) == []
    assert retention.wrong(passed(deleted=199.0), rows=200, recent=100)
    assert retention.wrong(passed(deleted=201.0), rows=200, recent=100)
    assert retention.wrong(passed(deleted=0.0), rows=200, recent=100)  # a pass that deleted nothing
    assert retention.wrong(passed(left=1.0), rows=200, recent=100)
    assert retention.wrong(passed(total=149.0), rows=200, recent=100)  # a recent or new row deleted
    assert retention.wrong(passed(finished=False), rows=200, recent=100)
