"""The workflow side of the monthly budget, shared by ReactiveScaling and NodePoolScaling: read the
month's spend (one activity, the cost report's code) and judge a growth with the pure ``check_budget``."""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.cost.contract import CostActivities, MonthSpendInput
    from workflows.cost.budget import BudgetVerdict, MonthlyBudget, Spend, check_budget, month_bounds
    from workflows.core.failures import cause

BUDGET_PATCH = "monthly-budget"


async def judge_growth(
    budget: MonthlyBudget, now: datetime, current: int, wanted: int, gpus_each: int, capacity_type: str,
    pool: str = "", unit: str = "replica",
) -> BudgetVerdict | str:
    """The verdict on ``current -> wanted``, or why the spend could not be read (the growth then goes ahead)."""
    try:
        spend: Spend = await workflow.execute_activity_method(
            CostActivities.read_month_spend,
            MonthSpendInput(month_start=month_bounds(now)[0], end=now, prices=budget.prices),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=1)),
            summary="month's GPU spend",
        )
    except ActivityError as err:
        return f"budget not checked: {cause(err)}"
    return check_budget(budget, spend, now, current, wanted, gpus_each, capacity_type, pool, unit)
