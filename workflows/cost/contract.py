"""What CostReport asks of Prometheus: the contract ``CostActivities`` (activities/cost/cost_activities.py) and its I/O.

No I/O here, so the workflow references it deterministically
(``workflow.execute_activity_method(CostActivities.collect_cost_inputs, ...)``). The activity name
is a stable API (recorded histories refer to it).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from temporalio import activity

from workflows.cost.pricing import GpuSeconds, NodeInfo, PodInfo, Prices, TokenCount
from workflows.cost.budget import Spend


class CostQueries(BaseModel):
    """PromQL templates (``${window}``; a literal $ is $$) and the labels each must return.

    gpu_occupancy (GPUs a pod holds at an instant; run as a range query at ``step_seconds`` and
    summed into GPU-seconds) -> namespace, pod, node: a GPU is split among the pods its DCGM series
    name, so a time-sliced GPU (dcgm-exporter ``--kubernetes-virtual-gpus``: a copy of the device's
    series per pod on it) is paid in full by the pods sharing it, and a whole GPU by its one pod;
    pods -> namespace, pod, deployment, version, model_name; nodes -> node, pool, capacity_type
    (kube-state-metrics' kube_node_labels, with
    ``--metric-labels-allowlist=nodes=[karpenter.sh/nodepool,karpenter.sh/capacity-type]``);
    tokens -> namespace, deployment, version, model_name.
    """

    gpu_occupancy: str = (
        'label_replace(sum by (namespace, pod, Hostname) (count by (namespace, pod, Hostname, UUID) (DCGM_FI_DEV_GPU_UTIL{pod!=""})'
        ' / on (UUID) group_left () count by (UUID) (DCGM_FI_DEV_GPU_UTIL{pod!=""})), "node", "$$1", "Hostname", "(.*)")'
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


class MonthSpendInput(BaseModel):
    month_start: datetime
    end: datetime
    prices: Prices = Field(default_factory=Prices)
    step_seconds: int = Field(60, gt=0)
    rate_window_seconds: int = Field(300, gt=0, description="the current rate: the cost of this last window, per hour")
    queries: CostQueries = Field(default_factory=CostQueries)


class CostActivities:
    """Prometheus' view of GPU occupancy, pods, nodes and tokens over a window (activities/cost/cost_activities.py)."""

    @activity.defn(name="collect_cost_inputs")
    def collect_cost_inputs(self, req: CollectCostInput) -> CostInputs:
        """Every query pinned to the window's end, so a retry reads the same numbers."""
        raise NotImplementedError

    @activity.defn(name="read_month_spend")
    def read_month_spend(self, req: MonthSpendInput) -> Spend:
        """The fleet's GPU spend since ``month_start`` and its current hourly rate, priced like the cost report."""
        raise NotImplementedError
