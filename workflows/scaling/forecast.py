"""Demand over the cold-start horizon: what to have Ready when the replicas ordered now can serve.

A replica ordered now serves only after its cold start (node, image, weights, compile, warm-up:
minutes), so a loop that sizes for the load it measures is always one cold start late on a ramp.
``forecast_demand`` predicts the peak demand (requests/s) over the next ``horizon_s`` from the
demand's own past, evenly sampled (oldest first, the last sample is now):

- seasonality: the same stretch one week ago (once a week of history exists) or one day ago
  (once a day does), scaled by how today's level compares with that day's (the demand is tidal:
  the shape repeats, the height drifts);
- short-term trend only until a day of history exists (from the first sample on): the last
  ``trend_s`` fitted by least squares and extrapolated, never below zero, and no farther ahead
  than the span it was fitted on (five minutes of history say nothing about the next fifteen);
- sized with its own recent error: the same forecast made at past origins of the last
  ``backtest_s`` is compared with the peak that followed; ``upper`` is the expected peak times the
  ``error_quantile`` of those actual/forecast ratios (1 when no origin can be checked yet). Only
  origins with at least half the history there is now (a full ``trend_s`` suffices) count: a
  forecast from a minute of history is not the one being sized, and its miss (a level of 0.6 req/s
  before a burst of 10) would multiply a forecast from a quarter of an hour many times over.

Pure: plain values in and out. The scaling loop's ``forecast_demand`` activity feeds it a
Prometheus range query; the scaling benchmark feeds it the trace's past; warm-pool sizing
(``workflows.scaling.warm_pool``) reads its peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

DAY_S = 86400.0
WEEK_S = 7 * DAY_S
RATIO_BOUNDS = (0.25, 4.0)  # today's level against the seasonal reference's: beyond this, the reference says little

Basis = Literal["none", "trend", "daily", "weekly"]


class DemandForecast(BaseModel):
    """Peak demand expected over the horizon, and what to size for given the forecast's own error."""

    expected: float = Field(ge=0, description="peak demand over the horizon, requests/s")
    upper: float = Field(ge=0, description="expected x the recent error quantile (never below the level now)")
    level: float = Field(ge=0, description="demand now: mean of the last level_s")
    basis: Basis = Field(description="weekly, daily (seasonality), trend (under a day of history) or none (no data)")
    error_ratio: float = Field(ge=0, description="quantile of actual / forecast peaks at recent origins (1: none checked)")
    checked: int = Field(ge=0, description="recent origins the error quantile comes from")
    reason: str


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _mean(values: Sequence[float]) -> float | None:
    known = _finite(values)
    return sum(known) / len(known) if known else None


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty list."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _trend(history: Sequence[float], end: int, points: int) -> tuple[float, float, int] | None:
    """(value at the last sample, slope per sample, samples the fit spans) of the least-squares line
    over the last ``points`` (fewer where the history is shorter)."""
    xs_ys = [(i, history[i]) for i in range(max(0, end - points), end) if history[i] is not None and math.isfinite(history[i])]
    if not xs_ys:
        return None
    n = len(xs_ys)
    mx = sum(x for x, _ in xs_ys) / n
    my = sum(y for _, y in xs_ys) / n
    sxx = sum((x - mx) ** 2 for x, _ in xs_ys)
    slope = sum((x - mx) * (y - my) for x, y in xs_ys) / sxx if sxx else 0.0
    return my + slope * (end - 1 - mx), slope, end - xs_ys[0][0]


def _path(history: Sequence[float], end: int, horizon: int, level_n: int, trend_n: int, period_n: dict[str, int]) -> tuple[float, float, Basis] | None:
    """(peak over the next ``horizon`` samples, level now, basis) from ``history[:end]``."""
    level = _mean(history[max(0, end - level_n) : end])
    if level is None:
        return None
    for basis in ("weekly", "daily"):
        period = period_n[basis]
        if end - period - level_n < 0:
            continue
        then = _mean(history[end - period - level_n : end - period])
        ahead = _finite(history[end - period : end - period + horizon])
        if then is None or not ahead:
            continue
        ratio = min(RATIO_BOUNDS[1], max(RATIO_BOUNDS[0], level / then)) if then > 0 else 1.0
        return max(level, ratio * max(ahead)), level, basis  # type: ignore[return-value]
    fit = _trend(history, end, trend_n)
    if fit is None:
        return level, level, "trend"
    last, slope, span = fit
    # the trend holds for at most its own fitting span (short while the history is): farther out it is a guess, held flat
    reach = min(horizon, span)
    return max(level, last + slope * reach, 0.0), level, "trend"


def forecast_demand(
    history: Sequence[float | None],
    step_s: float,
    horizon_s: float,
    error_quantile: float = 0.9,
    level_s: float = 300.0,
    trend_s: float = 1800.0,
    backtest_s: float = 6 * 3600.0,
    backtests: int = 24,
) -> DemandForecast:
    """Peak demand over the next ``horizon_s`` from ``history`` (requests/s every ``step_s``, oldest
    first, the last sample now; None or NaN where nothing was measured)."""
    if step_s <= 0 or horizon_s < 0:
        raise ValueError(f"step_s must be > 0 and horizon_s >= 0, got {step_s}, {horizon_s}")
    horizon = max(1, math.ceil(horizon_s / step_s))
    level_n = max(1, round(level_s / step_s))
    trend_n = max(2, round(trend_s / step_s))
    periods = {"weekly": round(WEEK_S / step_s), "daily": round(DAY_S / step_s)}
    stride = max(1, round(backtest_s / step_s / max(1, backtests)))
    # only the last week, the backtests' origins and their horizons are ever read
    needed = periods["weekly"] + level_n + trend_n + 2 * horizon + backtests * stride
    values = [math.nan if v is None else float(v) for v in history[-needed:]]
    now = _path(values, len(values), horizon, level_n, trend_n, periods)
    if now is None:
        return DemandForecast(expected=0, upper=0, level=0, basis="none", error_ratio=1, checked=0, reason="no demand history yet")
    expected, level, basis = now
    # the same forecast at past origins whose horizon has passed, against the peak that followed
    ratios: list[float] = []
    for k in range(backtests):
        origin = len(values) - horizon - k * stride
        if origin < min(trend_n, len(values) / 2):  # too little history behind it to be the forecast being sized
            break
        past = _path(values, origin, horizon, level_n, trend_n, periods)
        actual = _finite(values[origin : origin + horizon])
        if past is None or not actual or past[0] <= 0:
            continue
        ratios.append(max(actual) / past[0])
    error = _quantile(ratios, error_quantile) if ratios else 1.0
    upper = max(level, expected * error)
    reason = (
        f"{basis} forecast: peak {expected:.3g} req/s over {horizon_s:.0f}s (now {level:.3g});"
        f" x{error:.2f} (q{error_quantile:g} of actual/forecast at {len(ratios)} recent origins) -> {upper:.3g}"
    )
    return DemandForecast(expected=expected, upper=upper, level=level, basis=basis, error_ratio=error, checked=len(ratios), reason=reason)
