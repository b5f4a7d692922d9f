"""CostReport: what the fleet cost over a window, per deployment, pool, capacity type and version.

Run daily by a Temporal Schedule (``cost_report_schedule``) and on demand::

    temporal workflow start --type CostReport --task-queue tideplane --workflow-id cost-report/manual \\
      --input '{"window_hours": 24, "prices": {"by_capacity_type": {"on-demand": 12.29, "spot": 4.92}}}'

One activity reads Prometheus (``collect_cost_inputs``, activities/cost.py); the arithmetic is
pure (workflows/cost/pricing.py) so it is replayed, not re-queried. The table is the workflow's result
and its current details (Markdown) in the web UI.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from workflows.cost.pricing import CostTable, GpuSeconds, NodeInfo, PodInfo, Prices, TokenCount, compute_cost, render_markdown

COLLECT_COST_INPUTS = "collect_cost_inputs"  # activities/cost.py
SCHEDULE_ID = "cost-report-daily"


class CostQueries(BaseModel):
    """PromQL templates (``${window}``; a literal $ is $$) and the labels each must return.

    gpu_occupancy (GPUs a pod holds at an instant; run as a range query at ``step_seconds`` and
    summed into GPU-seconds) -> namespace, pod, node; pods -> namespace, pod, deployment, version, model_name;
    nodes -> node, pool, capacity_type (kube-state-metrics' kube_node_labels, with
    ``--metric-labels-allowlist=nodes=[karpenter.sh/nodepool,karpenter.sh/capacity-type]``);
    tokens -> namespace, deployment, version, model_name.
    """

    gpu_occupancy: str = (
        'label_replace(count by (namespace, pod, Hostname) (DCGM_FI_DEV_GPU_UTIL{pod!=""}), "node", "$$1", "Hostname", "(.*)")'
    )
    pods: str = (
        "group by (namespace, pod, deployment, version, model_name) (last_over_time(vllm:num_requests_running[${window}]))"
    )
    nodes: str = (
        'label_replace(label_replace(group by (node, label_karpenter_sh_nodepool, label_karpenter_sh_capacity_type) '
        '(last_over_time(kube_node_labels[${window}])), "pool", "$$1", "label_karpenter_sh_nodepool", "(.*)"), '
        '"capacity_type", "$$1", "label_karpenter_sh_capacity_type", "(.*)")'
    )
    generation_tokens: str = (
        "sum by (namespace, deployment, version, model_name) (increase(vllm:generation_tokens_total[${window}]))"
    )
    prompt_tokens: str = "sum by (namespace, deployment, version, model_name) (increase(vllm:prompt_tokens_total[${window}]))"


class CollectCostInput(BaseModel):
    end: datetime
    window_seconds: int = Field(gt=0)
    step_seconds: int = Field(gt=0, description="resolution of GPU occupancy; the window must be a multiple")
    queries: CostQueries = Field(default_factory=CostQueries)


class CostInputs(BaseModel):
    gpu: list[GpuSeconds]
    pods: list[PodInfo]
    nodes: list[NodeInfo]
    tokens: list[TokenCount]


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
    @workflow.run
    async def run(self, input: CostReportInput) -> CostReportResult:
        end = input.end or workflow.now()
        window_seconds = round(input.window_hours * 3600 / input.step_seconds) * input.step_seconds or input.step_seconds
        start = end - timedelta(seconds=window_seconds)
        workflow.set_current_details(f"Collecting {start:%Y-%m-%d %H:%M} - {end:%Y-%m-%d %H:%M} UTC from Prometheus")
        inputs: CostInputs = await workflow.execute_activity(
            COLLECT_COST_INPUTS,
            CollectCostInput(end=end, window_seconds=window_seconds, step_seconds=input.step_seconds, queries=input.queries),
            result_type=CostInputs,
            start_to_close_timeout=timedelta(minutes=5),
            retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(minutes=1)),
            summary=f"Prometheus: GPU-seconds and tokens over {window_seconds / 3600:g} h",
        )
        table = compute_cost(inputs.gpu, inputs.pods, inputs.nodes, inputs.tokens, input.prices)
        markdown = render_markdown(table, f"Cost {start:%Y-%m-%d %H:%M} - {end:%Y-%m-%d %H:%M} UTC")
        workflow.set_current_details(markdown)
        return CostReportResult(start=start, end=end, table=table, markdown=markdown)


def cost_report_schedule(input: CostReportInput, task_queue: str, hour_utc: int = 0):
    """The daily schedule, to apply with ``client.create_schedule(SCHEDULE_ID, ...)``.

    Fires at ``hour_utc``:00 UTC; with ``input.end`` unset each run reports the 24 h before it.
    A run missed while the server was down is caught up within 6 hours; runs never overlap.
    """
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleCalendarSpec,
        ScheduleOverlapPolicy,
        SchedulePolicy,
        ScheduleRange,
        ScheduleSpec,
    )

    return Schedule(
        action=ScheduleActionStartWorkflow(CostReport.run, input, id="cost-report/daily", task_queue=task_queue),
        spec=ScheduleSpec(calendars=[ScheduleCalendarSpec(hour=[ScheduleRange(hour_utc)], minute=[ScheduleRange(0)],
                                                          second=[ScheduleRange(0)])]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=timedelta(hours=6)),
    )
