"""The headroom model's fit: time per output token as a straight line in the running batch.

A decode step reads the weights once (a fixed cost) and then does a little work per sequence in the
batch, so the mean time per output token over a stretch of time is close to ``a + b x batch``
(:mod:`inferwatch.simulator.scheduler` models it exactly so; real engines are near-linear until the
GPU is compute-bound). :func:`fit_tpot` fits ``a`` and ``b`` by ordinary least squares on the engine's
own history, points ``(mean running batch, mean TPOT)`` over successive sub-windows, and refuses
(:attr:`LinearFit.reason`) when the history cannot support an extrapolation: too few points, batch
sizes too close together, a slope that is not positive or not told apart from the noise.

Pure: no I/O, no globals; the same points give the same fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPoint:
    """One sub-window of the engine's history: its mean running batch and its mean time per output token."""

    batch: float
    """mean of the running-requests gauge (``V.REQUESTS_RUNNING``) over the sub-window (requests)."""
    tpot_seconds: float
    """mean time per output token over the sub-window (the TPOT histogram's sum / count), seconds."""


@dataclass(frozen=True)
class FitSettings:
    """When a fit is trusted."""

    min_points: int = 4
    """fewer sub-windows than this give no fit."""
    min_batch_spread: float = 1.0
    """the largest and the smallest batch must be at least this many requests apart ..."""
    min_relative_spread: float = 0.2
    """... and at least this share of the mean batch: a line through one cluster of points is noise."""
    min_slope_t: float = 2.0
    """the slope must be at least this many standard errors above zero."""


@dataclass(frozen=True)
class LinearFit:
    """``tpot = intercept + slope x batch``, or why there is none (``reason``; the numbers are then ``None``)."""

    intercept: float | None
    slope: float | None
    points: int
    batch_min: float | None
    batch_max: float | None
    slope_stderr: float | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None and self.intercept is not None and self.slope is not None

    def at(self, batch: float) -> float:
        """The fitted TPOT at ``batch`` (only on a trusted fit)."""
        if self.intercept is None or self.slope is None:
            raise ValueError(f"no fit: {self.reason}")
        return self.intercept + self.slope * batch


def _refuse(points: int, lo: float | None, hi: float | None, reason: str) -> LinearFit:
    return LinearFit(None, None, points, lo, hi, reason=reason)


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Ordinary least squares ``y = a + b x``: ``(a, b, standard error of b)``; needs 3 or more distinct ``x``."""
    n = len(xs)
    mx = math.fsum(xs) / n
    my = math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx
    a = my - b * mx
    residual = math.fsum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    stderr = math.sqrt(residual / (n - 2) / sxx) if n > 2 else math.inf
    return a, b, stderr


def fit_tpot(points: Sequence[BatchPoint], settings: FitSettings = FitSettings()) -> LinearFit:
    """Fit ``tpot = a + b x batch`` on ``points``; a refusal names the reason."""
    usable = [p for p in points if math.isfinite(p.batch) and math.isfinite(p.tpot_seconds) and p.tpot_seconds > 0]
    usable = [p for p in usable if p.batch > 0]
    n = len(usable)
    if n < max(settings.min_points, 3):
        return _refuse(n, None, None, f"{n} TPOT-vs-batch points in the window; the fit needs {settings.min_points}")
    xs = [p.batch for p in usable]
    ys = [p.tpot_seconds for p in usable]
    lo, hi = min(xs), max(xs)
    mean = math.fsum(xs) / n
    if hi - lo < settings.min_batch_spread or hi - lo < settings.min_relative_spread * mean:
        return _refuse(
            n,
            lo,
            hi,
            f"the running batch only spanned {lo:.3g} to {hi:.3g} requests; the fit needs a spread of "
            f"{settings.min_batch_spread:g} requests and {settings.min_relative_spread:.0%} of the mean",
        )
    a, b, stderr = least_squares(xs, ys)
    if b <= 0:
        return _refuse(n, lo, hi, f"TPOT does not grow with the batch in the window (slope {b:.3g} s per request)")
    if b < settings.min_slope_t * stderr:
        return _refuse(n, lo, hi, f"the slope ({b:.3g} ± {stderr:.2g} s per request) is not told apart from the noise")
    return LinearFit(a, b, n, lo, hi, slope_stderr=stderr)
