"""The monthly GPU budget's verdict on a scale-up (workflows/cost/budget.py)."""

from datetime import datetime, timezone

import pytest

from workflows.cost.budget import MonthlyBudget, Spend, check_budget, month_bounds
from workflows.scaling.decide import ScalingPolicy

# 2026-12-31 00:00 UTC: 24 hours left in the month; on-demand H100 at $12.29/GPU-hour = $294.96 per replica-day
NOW = datetime(2026, 12, 31, tzinfo=timezone.utc)


def test_month_bounds_roll_over_the_year():
    assert month_bounds(datetime(2026, 12, 15, 8, tzinfo=timezone.utc)) == (
        datetime(2026, 12, 1, tzinfo=timezone.utc), datetime(2027, 1, 1, tzinfo=timezone.utc))


def test_growth_is_cut_to_what_the_rest_of_the_month_pays_for():
    budget = MonthlyBudget(monthly_usd=10_000)
    spend = Spend(spent_usd=9_000, rate_usd_per_hour=12.29)  # forecast 9,294.96: room for 2 more replicas, not 3
    verdict = check_budget(budget, spend, NOW, current=1, wanted=5, gpus_each=1, capacity_type="on-demand")
    assert (verdict.allowed, verdict.refused, verdict.over_budget) == (3, 2, True)
    assert "refuses 2 of 4 more replica(s) (1 -> 3)" in verdict.reason
    assert verdict.forecast_usd == pytest.approx(9_000 + 5 * 294.96)


def test_growth_within_budget_and_spot_prices():
    spend = Spend(spent_usd=9_000, rate_usd_per_hour=12.29)
    on_demand = check_budget(MonthlyBudget(monthly_usd=10_000), spend, NOW, 1, 4, 1, "on-demand")
    assert (on_demand.allowed, on_demand.over_budget) == (3, True)
    spot = check_budget(MonthlyBudget(monthly_usd=10_000), spend, NOW, 1, 4, 1, "spot")  # $118.08 per replica-day
    assert (spot.allowed, spot.refused, spot.over_budget) == (4, 0, False)


def test_already_over_budget_holds_but_never_scales_down():
    verdict = check_budget(MonthlyBudget(monthly_usd=100), Spend(spent_usd=500, rate_usd_per_hour=50), NOW, 3, 6, 2, "on-demand")
    assert (verdict.allowed, verdict.refused) == (3, 3)


def test_a_protected_realtime_class_grows_over_budget_and_says_so():
    budget = MonthlyBudget(monthly_usd=100, protected=True)
    verdict = check_budget(budget, Spend(spent_usd=500, rate_usd_per_hour=50), NOW, 3, 6, 1, "on-demand")
    assert (verdict.allowed, verdict.refused, verdict.over_budget) == (6, 0, True)
    assert verdict.reason.startswith("over budget, growth kept (protected realtime class)")
    with pytest.raises(ValueError, match="protected is for the realtime class only"):
        ScalingPolicy(priority_class="batch", min_replicas=0, monthly_budget=budget)


def test_a_node_pool_is_priced_by_its_own_price_and_counted_in_nodes():
    budget = MonthlyBudget(monthly_usd=10_000, prices={"by_pool": {"gpu-reserved": 2.0}})
    verdict = check_budget(budget, Spend(spent_usd=9_000, rate_usd_per_hour=0), NOW, 0, 4, 4, "on-demand",
                           pool="gpu-reserved", unit="node")  # $192 per node-day: 4 fit in $1,000 of room
    assert (verdict.allowed, verdict.refused) == (4, 0)
    cut = check_budget(budget, Spend(spent_usd=9_500, rate_usd_per_hour=0), NOW, 0, 4, 4, "on-demand", "gpu-reserved", "node")
    assert (cut.allowed, cut.refused) == (2, 2) and "refuses 2 of 4 more node(s) (0 -> 2)" in cut.reason
