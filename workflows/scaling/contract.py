"""The contract between the scaling workflows and the activities that act for them.

Pydantic inputs/outputs and one contract class per group of activities (``ScalingActivities``
for the loop and pre-warm, ``NodePoolActivities`` for the node layer), with no I/O imports, so
workflows call them by method reference (``workflow.execute_activity_method``) and
activities/scaling/ implements exactly this. Scaling itself reuses the rollout's
``RolloutActivities.scale_version`` (the Deployment's scale subresource). The activity names are
an API: recorded histories refer to them.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from workflows.core.bounds import PromWindow
from workflows.core.naming import DeploymentRef
from workflows.scaling.decide import Signals
from workflows.scaling.forecast import WEEK_S, DemandForecast
from workflows.scaling.queue_limit import QueueLimit
from workflows.scaling.placement import Node

# Activity names (stable API: histories refer to them).
READ_SCALING_SIGNALS = "read_scaling_signals"  # Prometheus
GET_SCALE = "get_scale"  # Kubernetes: replicas, ready, pending pods
READ_REPLICA_HISTORY = "read_replica_history"  # Prometheus range query for pre-warm
FORECAST_DEMAND = "forecast_demand"  # Prometheus range query + workflows.scaling.forecast
SET_QUEUE_LIMIT = "set_queue_limit"  # the gateway's queue limit (an Envoy Gateway BackendTrafficPolicy)
CLEAR_QUEUE_LIMIT = "clear_queue_limit"  # ... taken out again (gateway_queue_limit turned off)
OBSERVE_NODE_POOL = "observe_node_pool"  # Kubernetes nodes and pods, the pool's Auto Scaling group
SET_POOL_CAPACITY = "set_pool_capacity"
REMOVE_POOL_NODE = "remove_pool_node"
SET_WARM_POOL = "set_warm_pool"  # the group's EC2 Auto Scaling warm pool

_SELECTOR = 'namespace="${namespace}",deployment="${deployment}"'

# Defaults over vLLM's and DCGM's own metric names; users override single entries by name.
DEFAULT_SIGNAL_QUERIES: dict[str, str] = {
    "queue_waiting": f"sum(vllm:num_requests_waiting{{{_SELECTOR}}})",
    "running": f"sum(vllm:num_requests_running{{{_SELECTOR}}})",
    # requests/s that got their first token: the arrival rate the SLO model sizes for
    "request_rate": f"sum(rate(vllm:time_to_first_token_seconds_count{{{_SELECTOR}}}[${{window}}]))",
    "kv_cache_usage": f"max(vllm:kv_cache_usage_perc{{{_SELECTOR}}})",
    "ttft_p99_seconds": (
        "histogram_quantile(0.99, sum by (le) "
        f"(rate(vllm:time_to_first_token_seconds_bucket{{{_SELECTOR}}}[${{window}}])))"
    ),
    # the batch class's SLO: p95 completion time (workflows/scaling/completion.py)
    "e2e_p95_seconds": (
        "histogram_quantile(0.95, sum by (le) "
        f"(rate(vllm:e2e_request_latency_seconds_bucket{{{_SELECTOR}}}[${{window}}])))"
    ),
    # requests/s the gateway refused because the queue was full (429): counted as demand. Envoy's
    # circuit-breaker overflow counter, labelled with the route's namespace and deployment (the
    # sandbox's gateway exports it so; on Envoy Gateway relabel envoy_cluster_name, or edit this).
    "rejected_rate": f"sum(rate(envoy_cluster_upstream_rq_pending_overflow{{{_SELECTOR}}}[${{window}}]))",
    # GPUs held by the deployment's pods: DCGM series joined on the pods vLLM reports for. A duty
    # cycle under vLLM (~100 % whenever a batch runs): read and shown, a trigger only on request.
    "gpu_util_percent": (
        f"avg(DCGM_FI_DEV_GPU_UTIL and on(namespace, pod) vllm:num_requests_running{{{_SELECTOR}}})"
    ),
}

# Serving replicas of the deployment, one sample per hour: the peak of each hour. What the fleet
# HAD, floors and over-provisioning included: not what pre-warm should predict from.
DEFAULT_REPLICA_HISTORY_QUERY = f"max_over_time(count(vllm:num_requests_running{{{_SELECTOR}}})[1h:1m])"
# Pre-warm's default: the demand, hourly peak of the arrival rate (requests/s that got a first
# token, over 5 minutes), which PredictivePrewarm turns into replicas with the loop's SLO sizing.
# Not DCGM utilisation: under vLLM it reads ~100 % whenever a batch runs, so it never shows spare
# capacity; not the replicas the fleet had: those include the floors pre-warm itself raised.
DEFAULT_DEMAND_HISTORY_QUERY = (
    f"max_over_time(sum(rate(vllm:time_to_first_token_seconds_count{{{_SELECTOR}}}[5m]))[1h:1m])"
)


class ReadSignalsInput(BaseModel):
    namespace: str
    deployment: str = Field(description="logical deployment name, e.g. 'chat'")
    queries: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_SIGNAL_QUERIES))
    window: PromWindow = "1m"


class ScaleTarget(BaseModel):
    namespace: str
    deployment: str = Field(description="logical deployment name")
    version: str | None = Field(None, description="None: the version that carries the most traffic")
    owner: str | None = Field(None, description="the loop's workflow ID: claims the scaled Deployment")


COLD_START_PARTS = ("node", "image", "weights", "compile", "warmup")


class ColdStart(BaseModel):
    """How the newest Ready replica started, part by part, from its ``ColdStart`` Events (reason
    ColdStart, message ``<part> <seconds>s: <detail>``, part one of COLD_START_PARTS): the sandbox's
    kubelet writes them; on a real cluster a node agent or the serving image's entrypoint does."""

    pod: str
    parts: dict[str, float] = Field(default_factory=dict, description="part -> seconds")


class ScaleStatus(BaseModel):
    version: str = Field(description="the version whose Deployment is scaled")
    replicas: int = Field(description="spec.replicas")
    ready_replicas: int
    pending: int = Field(0, description="pods not yet Running")
    unschedulable: int = Field(0, description="pending pods the scheduler could not place (no GPU capacity)")
    priority_class: str | None = Field(
        None, description="the class the Deployment declares (label tideplane.io/priority-class)"
    )
    cold_start: ColdStart | None = Field(None, description="the newest Ready replica's start, by its parts")
    canary: str | None = Field(
        None, description="another version the route sends traffic to (a rollout's canary in analysis): no scale-in meanwhile"
    )


# The forecast's history, one sample a minute over the last week and a half (weekly seasonality
# needs a week): the demand, requests/s that got a first token plus the queue's growth (the served
# rate alone is capped by the replicas there were, so a ramp the fleet was late for would be
# remembered as smaller than it was).
DEFAULT_DEMAND_RATE_QUERY = (
    f"clamp_min(sum(rate(vllm:time_to_first_token_seconds_count{{{_SELECTOR}}}[1m]))"
    f" + (sum(deriv(vllm:num_requests_waiting{{{_SELECTOR}}}[1m])) or vector(0)), 0)"
)
PROMETHEUS_MAX_POINTS = 11_000  # Prometheus refuses a range query of more points per series


class DemandForecastInput(BaseModel):
    namespace: str
    deployment: str
    at: float = Field(description="epoch seconds of 'now' (the workflow's clock)")
    horizon_seconds: float = Field(ge=0, le=WEEK_S, description="how far ahead: the cold start")
    error_quantile: float = Field(0.9, ge=0, le=1)
    step_seconds: float = Field(60, ge=1, le=3600, description="the history's resolution")
    query: str = DEFAULT_DEMAND_RATE_QUERY


class QueueLimitInput(BaseModel):
    deployment: DeploymentRef = Field(description="the logical deployment: its HTTPRoute is the policy's target")
    limit: QueueLimit


class ClearQueueLimitInput(BaseModel):
    deployment: DeploymentRef = Field(description="the logical deployment whose route's policy holds the queue limit")


class ReplicaHistoryInput(BaseModel):
    namespace: str
    deployment: str
    time_zone: str = "UTC"
    weeks: int = Field(4, ge=1, le=12)
    at: float = Field(description="epoch seconds of 'now' (the workflow's clock)")
    query: str = DEFAULT_DEMAND_HISTORY_QUERY


class ReplicaHistory(BaseModel):
    """Hourly peaks keyed by local ``"<weekday>:<hour>"`` (Monday = 0), plus 'now' in local time."""

    samples: dict[str, list[float]] = Field(default_factory=dict)
    weekday: int = Field(ge=0, le=6)
    minute_of_day: int = Field(ge=0, lt=1440)


class ScalingActivities:
    """What ReactiveScaling and PredictivePrewarm ask of Prometheus and Kubernetes (activities/scaling/scaling_activities.py)."""

    @activity.defn(name=READ_SCALING_SIGNALS)
    def read_scaling_signals(self, req: ReadSignalsInput) -> Signals:
        """The loop's signals from Prometheus; an unreachable Prometheus reads as ``Signals(error=...)``."""
        raise NotImplementedError

    @activity.defn(name=GET_SCALE)
    def get_scale(self, req: ScaleTarget) -> ScaleStatus:
        """The scaled version's replicas: spec, Ready, Pending, Unschedulable, declared class."""
        raise NotImplementedError

    @activity.defn(name=READ_REPLICA_HISTORY)
    def read_replica_history(self, req: ReplicaHistoryInput) -> ReplicaHistory:
        """Hourly peaks of past weeks for predictive pre-warm (a Prometheus range query)."""
        raise NotImplementedError

    @activity.defn(name=FORECAST_DEMAND)
    def forecast_demand(self, req: DemandForecastInput) -> DemandForecast:
        """Peak demand over the horizon from the arrival rate's recent history (a Prometheus range
        query fed to ``workflows.scaling.forecast.forecast_demand``); an unreachable Prometheus is retried."""
        raise NotImplementedError

    @activity.defn(name=SET_QUEUE_LIMIT)
    def set_queue_limit(self, req: QueueLimitInput) -> None:
        """The gateway's queue limit for the deployment's route (create or update; unchanged: no write)."""
        raise NotImplementedError

    @activity.defn(name=CLEAR_QUEUE_LIMIT)
    def clear_queue_limit(self, req: ClearQueueLimitInput) -> str:
        """The queue limit's fields taken out of the route's policy, the other writers' kept; the object
        deleted once nothing but its target is left. Returns "deleted", "updated" or "unchanged"."""
        raise NotImplementedError


# ---------------------------------------------------------------- node layer (activities/scaling/node_pool_activities.py)

class PoolRef(BaseModel):
    pool: str = Field(description="node pool = Auto Scaling group name = karpenter.sh/nodepool label")
    capacity_type: str = Field("on-demand", pattern="^(on-demand|spot)$")
    takes_unconstrained: bool = Field(
        False, description="also count pending pods that do not ask for a capacity type (one pool per cluster should)"
    )


class PendingReplica(BaseModel):
    pod: str = Field(description="NAMESPACE/NAME")
    model: str
    gpus: int = Field(ge=1)
    gpu_share: float | None = Field(
        None, gt=0, le=1, description="a replica on a share of one GPU (nvidia.com/gpu.shared): the fraction of its memory it claims"
    )

    def gpu_memory_gib(self, gpu_memory_gib: float) -> float:
        """The memory it needs, on GPUs of ``gpu_memory_gib``."""
        return (self.gpu_share if self.gpu_share is not None else self.gpus) * gpu_memory_gib


class PoolObservation(BaseModel):
    nodes: list[Node] = Field(default_factory=list)
    pending_gpus: int = Field(0, description="GPUs requested by Unschedulable model pods this pool can serve")
    pending_pods: list[str] = Field(default_factory=list)
    pending: list[PendingReplica] = Field(
        default_factory=list, description="those pods that ask for GPUs, for the planner"
    )
    gpu_memory_gib: float = Field(
        80, gt=0, description="memory of one of the pool's GPUs (node label nvidia.com/gpu.memory)"
    )
    desired_capacity: int = Field(description="the Auto Scaling group's desired capacity")
    max_size: int


class SetCapacityInput(BaseModel):
    pool: str
    desired: int = Field(ge=0)


class RemoveNodeInput(BaseModel):
    pool: str
    node: str


class RemoveNodeResult(BaseModel):
    removed: bool
    reason: str


class SetWarmPoolInput(BaseModel):
    pool: str
    size: int = Field(ge=0, description="stopped instances kept ready to join (MinSize = MaxGroupPreparedCapacity: an absolute size)")
    reuse_on_scale_in: bool = Field(True, description="scale-in stops instances back into the pool instead of terminating them")


class WarmPoolState(BaseModel):
    size: int
    warm_instances: int = Field(0, description="instances the group reports in its warm pool now")
    changed: bool = Field(description="False: the pool already had this configuration")


class NodePoolActivities:
    """What NodePoolScaling asks of Kubernetes and the pool's Auto Scaling group (activities/scaling/node_pool_activities.py)."""

    @activity.defn(name=OBSERVE_NODE_POOL)
    def observe_node_pool(self, req: PoolRef) -> PoolObservation:
        raise NotImplementedError

    @activity.defn(name=SET_POOL_CAPACITY)
    def set_pool_capacity(self, req: SetCapacityInput) -> None:
        raise NotImplementedError

    @activity.defn(name=REMOVE_POOL_NODE)
    def remove_pool_node(self, req: RemoveNodeInput) -> RemoveNodeResult:
        raise NotImplementedError

    @activity.defn(name=SET_WARM_POOL)
    def set_warm_pool(self, req: SetWarmPoolInput) -> WarmPoolState:
        """Size the group's warm pool of stopped instances (idempotent: the same size twice is a no-op)."""
        raise NotImplementedError
