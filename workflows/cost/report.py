"""CostReport: what the fleet cost over a window, per deployment, pool, capacity type and version.

Run daily by a Temporal Schedule (``cost_report_schedule``) and on demand::

    temporal workflow start --type CostReport --task-queue tideplane --workflow-id cost-report/manual \\
      --input '{"window_hours": 24, "prices": {"by_capacity_type": {"on-demand": 12.29, "spot": 4.92}}}'

One activity reads Prometheus (``collect_cost_inputs``, activities/cost/cost_activities.py); the arithmetic is
pure (workflows/cost/pricing.py) so it is replayed, not re-queried. The table is the workflow's result
and its current details (Markdown) in the web UI.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from workflows.cost.contract import CollectCostInput, CostActivities, CostQueries
    from workflows.cost.pricing import CostTable, Prices, compute_cost, render_markdown
    from workflows.core.daily_schedule import daily_schedule
    from workflows.core.naming import COST_REPORT_WORKFLOW_ID


class CostReportInput(BaseModel):
    window_hours: float = Field(24, gt=0, le=24 * 31)
    end: datetime | None = Field(None, description="end of the window (default: when the workflow runs)")
    step_seconds: int = Field(60, gt=0)
    prices: Prices = Field(default_factory=Prices)
    queries: CostQueries = Field(default_factory=CostQueries)


class CostReportResult(BaseModel):
    start: datetime
    end: datetime
    table: CostTable
    markdown: str


@workflow.defn(name="CostReport")
class CostReport:
    """Reads the window's inputs from Prometheus once, then prices them with pure code (replayed, not re-queried)."""

    @workflow.run
    async def run(self, input: CostReportInput) -> CostReportResult:
        end = input.end or workflow.now()
        window_seconds = round(input.window_hours * 3600 / input.step_seconds) * input.step_seconds or input.step_seconds
        start = end - timedelta(seconds=window_seconds)
        workflow.set_current_details(f"Collecting {start:%Y-%m-%d %H:%M} - {end:%Y-%m-%d %H:%M} UTC from Prometheus")
        inputs = await workflow.execute_activity_method(
            CostActivities.collect_cost_inputs,
            CollectCostInput(end=end, window_seconds=window_seconds, step_seconds=input.step_seconds, queries=input.queries),
            start_to_close_timeout=timedelta(minutes=5),
            retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(minutes=1)),
            summary=f"Prometheus: GPU-seconds and tokens over {window_seconds / 3600:g} h",
        )
        table = compute_cost(inputs.gpu, inputs.pods, inputs.nodes, inputs.tokens, input.prices)
        markdown = render_markdown(table, f"Cost {start:%Y-%m-%d %H:%M} - {end:%Y-%m-%d %H:%M} UTC")
        workflow.set_current_details(markdown)
        return CostReportResult(start=start, end=end, table=table, markdown=markdown)


def cost_report_schedule(input: CostReportInput, task_queue: str, hour_utc: int = 0):
    """The daily schedule, to apply with ``client.create_schedule(naming.COST_REPORT_SCHEDULE_ID, ...)``.

    Fires at ``hour_utc``:00 UTC; with ``input.end`` unset each run reports the 24 h before it.
    A run missed while the server was down is caught up within 6 hours; runs never overlap.
    """
    return daily_schedule(CostReport.run, input, COST_REPORT_WORKFLOW_ID, task_queue, hour_utc)
