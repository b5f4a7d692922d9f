"""The monthly GPU budget: how many more replicas the rest of the month can pay for (pure).

The forecast is the month's spend so far (the cost report's arithmetic, workflows/cost/pricing.py,
over Prometheus' GPU occupancy) plus the fleet's current rate until the month ends. Growth is
refused where its GPUs, at their price, would take the forecast over the budget; what is already
running is never scaled down for it. A realtime class marked ``protected`` may grow over budget:
the verdict says so, the growth is kept.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from pydantic import BaseModel, Field

from workflows.cost.pricing import Prices


class MonthlyBudget(BaseModel):
    monthly_usd: float = Field(gt=0, description="GPU dollars the fleet may spend in a calendar month (UTC)")
    prices: Prices = Field(default_factory=Prices, description="$ per GPU-hour, as the cost report prices it")
    protected: bool = Field(
        False, description="realtime only (a realtime deployment, an on-demand node pool): grows even over budget (said, not refused)"
    )


class Spend(BaseModel):
    """The fleet's spend, from the cost report code (activities/cost/cost_activities.py ``read_month_spend``)."""

    spent_usd: float = Field(ge=0, description="since the start of the month")
    rate_usd_per_hour: float = Field(ge=0, description="at the current GPU occupancy")


class BudgetVerdict(BaseModel):
    allowed: int = Field(description="replicas the deployment may have (>= current, <= wanted)")
    refused: int = Field(description="replicas of the wanted growth the budget refuses (0 when protected)")
    over_budget: bool = Field(description="the wanted growth would take the forecast over the budget")
    forecast_usd: float = Field(description="month-end spend at the current rate, with the wanted growth")
    reason: str


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """Start of ``now``'s calendar month (UTC) and of the next one."""
    now = now.astimezone(timezone.utc)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def check_budget(
    budget: MonthlyBudget, spend: Spend, now: datetime, current: int, wanted: int, gpus_each: int, capacity_type: str,
    pool: str = "", unit: str = "replica",
) -> BudgetVerdict:
    """How much of the growth ``current -> wanted`` (replicas of a deployment, or nodes of ``pool``,
    ``gpus_each`` GPUs apiece) the rest of the month pays for."""
    hours_left = max(0.0, (month_bounds(now)[1] - now.astimezone(timezone.utc)).total_seconds() / 3600)
    baseline = spend.spent_usd + spend.rate_usd_per_hour * hours_left
    per_unit = gpus_each * budget.prices.gpu_hour(pool, capacity_type) * hours_left
    growth = max(0, wanted - current)
    forecast = baseline + growth * per_unit
    affordable = growth if per_unit == 0 else max(0, min(growth, math.floor((budget.monthly_usd - baseline) / per_unit)))
    money = f"forecast ${forecast:,.0f} of ${budget.monthly_usd:,.0f} this month (${spend.spent_usd:,.2f} spent, ${spend.rate_usd_per_hour:,.2f}/h now)"
    if affordable == growth:
        return BudgetVerdict(allowed=max(current, wanted), refused=0, over_budget=False, forecast_usd=forecast,
                             reason=f"within budget: {money}")
    if budget.protected:
        return BudgetVerdict(allowed=wanted, refused=0, over_budget=True, forecast_usd=forecast,
                             reason=f"over budget, growth kept (protected realtime class): {money}")
    allowed = current + affordable
    return BudgetVerdict(allowed=allowed, refused=growth - affordable, over_budget=True, forecast_usd=forecast,
                         reason=f"monthly budget refuses {growth - affordable} of {growth} more {unit}(s) ({current} -> {allowed}): {money}")
