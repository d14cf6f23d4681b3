"""The burn-rate alert windows and factors on hand-computed cases (``mutation/burn.toml``).

The oracle is the Google SRE workbook's multiwindow, multi-burn-rate table (chapter 5, table 5-8, and the
1d/2h ticket of its example): for a 30-day SLO, page at 14.4x over 1h (short window 5m) and 6x over 6h
(30m), ticket at 3x over 1d (2h) and 1x over 3d (6h). A factor is (share of the budget) x period / window.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from inferwatch.core.slo import BURN_PAIRS, SLO, alert_windows, burn_factor, period_hours


def slo(period: str) -> SLO:
    return SLO.model_validate(
        {"name": "availability", "objective": 99.9, "period": period, "indicator": {"errors": {}}}
    )


@pytest.mark.parametrize(
    ("period", "hours"),
    [("30m", 0.5), ("90m", 1.5), ("1h", 1), ("6h", 6), ("1d", 24), ("30d", 720), ("1w", 168), ("4w", 672)],
)
def test_period_hours(period: str, hours: float) -> None:
    assert period_hours(period) == pytest.approx(hours, rel=1e-12)


@pytest.mark.parametrize("bad", ["30", "d", "1y", "1.5h", "-1h", " 1h", "1h "])
def test_period_hours_refuses_what_is_not_a_duration(bad: str) -> None:
    with pytest.raises(ValueError, match="must be a number"):
        period_hours(bad)


def test_the_workbook_table_for_a_30_day_period() -> None:
    thirty = slo("30d")
    table = [(p.severity, p.long, p.short, burn_factor(p, thirty)) for p in BURN_PAIRS]
    assert table == [
        ("page", "1h", "5m", Decimal("14.4")),
        ("page", "6h", "30m", Decimal("6")),
        ("ticket", "1d", "2h", Decimal("3")),
        ("ticket", "3d", "6h", Decimal("1")),
    ]


def test_factors_scale_with_the_period() -> None:
    # a 4-week period is 672 h: 0.02 x 672 / 1, 0.05 x 672 / 6, 0.1 x 672 / 24, 0.1 x 672 / 72
    four_weeks = slo("4w")
    assert [float(burn_factor(p, four_weeks)) for p in BURN_PAIRS] == pytest.approx([13.44, 5.6, 2.8, 2.8 / 3])
    # 7 days written in days or in weeks: the same factors
    assert [burn_factor(p, slo("7d")) for p in BURN_PAIRS] == [burn_factor(p, slo("1w")) for p in BURN_PAIRS]


def test_alert_windows_are_each_window_once_in_table_order() -> None:
    # 6h is the second page's long window and the last ticket's short one: listed once, where it first comes
    assert alert_windows() == ("1h", "5m", "6h", "30m", "1d", "2h", "3d")
