"""Side effects of scaling: signals and history from Prometheus, scale state from Kubernetes, and
GPU node pools as EC2 Auto Scaling groups seen through Kubernetes.

``ScalingActivities`` and ``NodePoolActivities`` implement the contracts in
workflows/scaling/contract.py with the worker's clients. ``ScalingActivities`` (Kubernetes,
Prometheus), for ReactiveScaling and PredictivePrewarm:

- ``read_scaling_signals`` renders the signal query templates and runs each as an instant query.
  An unreachable or failing Prometheus is not an error here: it returns ``Signals(error=...)`` so
  the loop holds and reports instead of retrying blind; a bad template or PromQL is bad input
  (non-retryable).
- ``get_scale`` reads the scaled version's Deployment and its pods: replicas, Ready, Pending and
  Unschedulable (no GPU capacity, which the node layer acts on), the declared priority class, and
  the newest Ready replica's cold start by its parts (its ``ColdStart`` Events).
- ``read_replica_history`` reads hourly replica peaks over past weeks for predictive pre-warm.
- ``forecast_demand`` reads the arrival rate of the last week and a half, a sample a minute, and
  forecasts its peak over the loop's horizon with the pure ``workflows.scaling.forecast``.
Scaling itself is the rollout's ``scale_version`` (the Deployment's scale subresource).

``NodePoolActivities`` (Kubernetes, AWS Auto Scaling), for NodePoolScaling:

- ``observe_node_pool``: the pool's nodes (GPUs allocatable and held, model pods on each), the
  Unschedulable model pods this pool can serve (by their capacity-type requirement, which the
  priority class sets: batch pods wait for the spot pool, realtime for on-demand) and the GPUs
  they ask for, and the group's desired capacity.
- ``set_pool_capacity``: the group's desired capacity (idempotent: setting it twice is a no-op).
- ``remove_pool_node``: cordon an idle node and terminate its instance with the group's desired
  capacity decremented; a node that took a model pod meanwhile is uncordoned and kept. With a warm
  pool that reuses on scale-in, AWS stops the instance back into the pool instead while the pool is
  below its size (and terminates it when the pool is full).
- ``set_warm_pool``: the group's warm pool of stopped instances at an absolute size (MinSize =
  MaxGroupPreparedCapacity), so a scale-out starts a stopped instance (about a minute) instead of
  launching one; a pool already at that configuration is left alone. On-demand pools only: AWS
  has no warm pools for Spot Instances.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.aws import AwsClient
from activities.clients.kube import API_TIMEOUT, KubeClient, fail, is_ready, label_selector, read_or_none, selector
from activities.clients.prometheus import PrometheusClient, render
from activities.core.deployments import deployment_state, owned_elsewhere
from activities.core.traffic_policy import POLICY_API, apply_traffic_policy, remove_traffic_policy_fields
from workflows.core import naming
from workflows.core.gpu_shares import (
    GPU_COUNT_LABEL,
    SHARED_GPU_RESOURCE,
    SHARING_STRATEGIES,
    SHARING_STRATEGY_LABEL,
    container_share,
    fullest_fit,
)
from workflows.core.naming import DeploymentRef
from workflows.core.traffic_policy import QUEUE_LIMIT_FIELDS, legacy_policy_names
from workflows.scaling import contract
from workflows.scaling.contract import (
    COLD_START_PARTS,
    PROMETHEUS_MAX_POINTS,
    ClearQueueLimitInput,
    ColdStart,
    DemandForecastInput,
    PendingReplica,
    PoolObservation,
    PoolRef,
    QueueLimitInput,
    ReadSignalsInput,
    RemoveNodeInput,
    RemoveNodeResult,
    ReplicaHistory,
    ReplicaHistoryInput,
    ScaleStatus,
    ScaleTarget,
    SetCapacityInput,
    SetWarmPoolInput,
    WarmPoolState,
)
from workflows.scaling.decide import Signals
from workflows.scaling.forecast import WEEK_S, DemandForecast, forecast_demand
from workflows.scaling.placement import Gpu, Node
from workflows.scaling.prewarm import slot_key
from workflows.scaling.queue_limit import QueueLimit
from workflows.spot.mix import MIX_TARGET_ANNOTATION

WEEK_SECONDS = 7 * 24 * 3600
_COLD_START_MESSAGE = re.compile(rf"^({'|'.join(COLD_START_PARTS)}) ([0-9]+(?:\.[0-9]+)?)s\b")
RETRY_AFTER_ANNOTATION = "tideplane.io/retry-after-seconds"


def unschedulable(pod: client.V1Pod) -> bool:
    """A pending pod the scheduler could not place (no node with the GPUs it asks for)."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conditions)


class ScalingActivities(contract.ScalingActivities):
    """The loop's and pre-warm's activities, over the worker's Kubernetes and Prometheus clients."""

    def __init__(self, kube: KubeClient, prometheus: PrometheusClient) -> None:
        self.kube = kube
        self.prometheus = prometheus

    @activity.defn(name=contract.READ_SCALING_SIGNALS)
    def read_scaling_signals(self, req: ReadSignalsInput) -> Signals:
        variables = {"namespace": req.namespace, "deployment": req.deployment, "window": req.window}
        rendered = {name: render(name, template, variables) for name, template in req.queries.items()}
        values: dict[str, float | None] = {}
        for name, promql in rendered.items():
            try:
                values[name] = self.prometheus.value(name, promql)
            except ApplicationError as exc:
                if exc.non_retryable:
                    raise
                return Signals(error=exc.message)
        return Signals(**values)

    @activity.defn(name=contract.GET_SCALE)
    def get_scale(self, req: ScaleTarget) -> ScaleStatus:
        """The scaled version (given, or the one with the most traffic) and how its pods are doing."""
        state = deployment_state(self.kube, DeploymentRef(namespace=req.namespace, name=req.deployment))
        by_version = {v.version: v for v in state.versions}
        if req.version is not None:
            info = by_version.get(req.version)
        elif state.stable is not None:
            info = state.stable
        else:
            info = by_version[next(iter(by_version))] if len(by_version) == 1 else None
        if info is None:
            wanted = f"version {req.version}" if req.version else "a version carrying traffic"
            raise ApplicationError(
                f"{req.namespace}/{req.deployment}: no Deployment for {wanted} (have {sorted(by_version) or 'none'})",
                non_retryable=True,
            )
        dep = read_or_none(self.kube.apps.read_namespaced_deployment, naming.versioned_name(req.deployment, info.version), req.namespace)
        if dep is not None and req.owner is not None:
            self._claim(dep, req.owner)
        pods = self.kube.core.list_namespaced_pod(
            req.namespace, label_selector=label_selector(selector(req.deployment, info.version)), _request_timeout=API_TIMEOUT
        ).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        mix_target = ((dep.metadata.annotations if dep else None) or {}).get(MIX_TARGET_ANNOTATION)
        return ScaleStatus(
            version=info.version,
            replicas=int(mix_target) if mix_target is not None else info.replicas,  # a spot mix holds the total
            ready_replicas=sum(1 for p in live if is_ready(p)),
            pending=sum(1 for p in live if (p.status.phase if p.status else "Pending") == "Pending"),
            unschedulable=sum(1 for p in live if unschedulable(p)),
            priority_class=((dep.metadata.labels if dep else None) or {}).get(naming.LABEL_CLASS),
            cold_start=self._cold_start(req.namespace, [p for p in live if is_ready(p)]),
        )

    def _cold_start(self, namespace: str, ready: list[client.V1Pod]) -> ColdStart | None:
        """The newest Ready replica's ColdStart Events, part -> seconds (None: no replica, no events)."""
        if not ready:
            return None
        newest = max(ready, key=lambda p: (p.status.start_time or p.metadata.creation_timestamp, p.metadata.name))
        events = self.kube.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={newest.metadata.name},reason=ColdStart", _request_timeout=API_TIMEOUT
        ).items
        parts = {m[1]: float(m[2]) for e in events if (m := _COLD_START_MESSAGE.match(e.message or ""))}
        return ColdStart(pod=newest.metadata.name, parts=parts) if parts else None

    def _claim(self, dep: client.V1Deployment, owner: str) -> None:
        """One scaling loop per deployment, whatever its workflow ID: the scaled Deployment carries
        its loop's ID (replace with the resourceVersion read: compare-and-swap); another loop's is refused."""
        held = (dep.metadata.annotations or {}).get(naming.ANNOTATION_OWNER)
        what = f"Deployment {dep.metadata.namespace}/{dep.metadata.name}"
        if held == owner:
            return
        if held is not None:
            raise owned_elsewhere(what, held, owner)
        dep.metadata.annotations = {**(dep.metadata.annotations or {}), naming.ANNOTATION_OWNER: owner}
        try:
            self.kube.apps.replace_namespaced_deployment(dep.metadata.name, dep.metadata.namespace, dep, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            if exc.status == 409:  # changed since read (maybe another loop claimed it): the next cycle decides
                raise ApplicationError(f"{what} changed while claiming it for {owner}; retrying") from None
            fail(exc, what)

    @activity.defn(name=contract.READ_REPLICA_HISTORY)
    def read_replica_history(self, req: ReplicaHistoryInput) -> ReplicaHistory:
        """Hourly peaks of the past ``weeks`` weeks keyed by local weekday and hour."""
        try:
            tz = ZoneInfo(req.time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ApplicationError(f"unknown time zone {req.time_zone!r}", non_retryable=True) from None
        promql = render("replica_history", req.query, {"namespace": req.namespace, "deployment": req.deployment})
        end = math.floor(req.at / 3600) * 3600
        start = end - req.weeks * WEEK_SECONDS + 3600
        series = self.prometheus.range("replica history", promql, start, end, 3600)
        if len(series) > 1:
            activity.logger.warning("replica history returned %d series; using the first", len(series))
        samples: dict[str, list[float]] = {}
        for at, value in (series[0]["values"] if series else []):
            if math.isnan(float(value)):
                continue
            # the sample at a full hour is the peak of the hour that just ended
            hour = datetime.fromtimestamp(float(at) - 1, tz)
            samples.setdefault(slot_key(hour.weekday(), hour.hour), []).append(float(value))
        now = datetime.fromtimestamp(req.at, tz)
        return ReplicaHistory(samples=samples, weekday=now.weekday(), minute_of_day=now.hour * 60 + now.minute)

    @activity.defn(name=contract.SET_QUEUE_LIMIT)
    def set_queue_limit(self, req: QueueLimitInput) -> None:
        """Write the queue limit into the route's BackendTrafficPolicy, keeping its token quotas;
        a policy that already says the same is left alone."""
        apply_traffic_policy(self.kube, queue_limit_policy(req.deployment, req.limit), QUEUE_LIMIT_FIELDS)

    @activity.defn(name=contract.CLEAR_QUEUE_LIMIT)
    def clear_queue_limit(self, req: ClearQueueLimitInput) -> str:
        """Take the queue limit (its fields and its Retry-After annotation) out of the route's
        BackendTrafficPolicy, keeping the token quotas and anyone else's fields."""
        ref = req.deployment
        return remove_traffic_policy_fields(self.kube, ref.namespace, ref.name, QUEUE_LIMIT_FIELDS, (RETRY_AFTER_ANNOTATION,),
                                            legacy_name=legacy_policy_names(ref.name)[0])

    @activity.defn(name=contract.FORECAST_DEMAND)
    def forecast_demand(self, req: DemandForecastInput) -> DemandForecast:
        """The demand forecast over ``horizon_seconds`` from the last week and a half of the arrival rate."""
        promql = render("demand_rate", req.query, {"namespace": req.namespace, "deployment": req.deployment})
        end = math.floor(req.at / req.step_seconds) * req.step_seconds
        points = min(PROMETHEUS_MAX_POINTS - 1, math.ceil((WEEK_S + 2 * req.horizon_seconds + 8 * 3600) / req.step_seconds))
        start = end - points * req.step_seconds
        series = self.prometheus.range("demand rate", promql, start, end, req.step_seconds)
        if len(series) > 1:
            activity.logger.warning("demand rate returned %d series; using the first", len(series))
        # one slot per step from start to end; a step with no sample (no data, or the deployment did
        # not exist yet) stays None, so history begins at the first measured sample
        history: list[float | None] = [None] * (points + 1)
        for at, value in (series[0]["values"] if series else []):
            index = round((float(at) - start) / req.step_seconds)
            if 0 <= index <= points and not math.isnan(float(value)):
                history[index] = float(value)
        first = next((i for i, v in enumerate(history) if v is not None), len(history))
        return forecast_demand(history[first:], req.step_seconds, req.horizon_seconds, req.error_quantile)


def queue_limit_policy(ref: DeploymentRef, limit: QueueLimit) -> dict:
    """Envoy Gateway's BackendTrafficPolicy on the deployment's HTTPRoute: requests beyond
    ``maxPendingRequests`` waiting are refused at once (Envoy's circuit breaker answers 503), and
    the response override makes that a 429 the client knows to retry after ``Retry-After``."""
    return {
        "apiVersion": "/".join(POLICY_API),
        "kind": "BackendTrafficPolicy",
        "metadata": {
            "name": naming.traffic_policy_name(ref.name),
            "namespace": ref.namespace,
            "labels": {naming.LABEL_APP: ref.name, naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
            "annotations": {RETRY_AFTER_ANNOTATION: str(limit.retry_after_seconds)},
        },
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": ref.name}],
            "circuitBreaker": {"maxPendingRequests": limit.max_pending_requests},
            "responseOverride": [{
                "source": "Local",  # Envoy's own overflow answer, not a backend's 503
                "match": {"statusCodes": [{"type": "Value", "value": 503}]},
                "response": {
                    "statusCode": 429,
                    "contentType": "application/json",
                    "body": {"type": "Inline", "inline": '{"object": "error", "message": "queue full: retry later", "code": 429}'},
                },
            }],
        },
    }


# ---------------------------------------------------------------- node layer
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU, as GPU feature discovery labels nodes
DEFAULT_GPU_MEMORY_GIB = 80.0
_DONE = ("Succeeded", "Failed")


def _gpus(pod: client.V1Pod) -> int:
    """Whole GPUs the pod holds (``nvidia.com/gpu``)."""
    total = 0
    for c in pod.spec.containers or []:
        limits = (c.resources.limits if c.resources else None) or {}
        total += int(limits.get(naming.GPU_RESOURCE, 0))
    return total


def gpu_share(pod: client.V1Pod) -> float | None:
    """The fraction of one GPU's memory a pod on a GPU share (``nvidia.com/gpu.shared``) claims;
    None for a pod that asks for no share."""
    for c in pod.spec.containers or []:
        limits = (c.resources.limits if c.resources else None) or {}
        if SHARED_GPU_RESOURCE in limits:
            return container_share(limits[SHARED_GPU_RESOURCE], c.args or [])
    return None


def node_gpus(node: client.V1Node, pods: list[client.V1Pod], memory_gib: float) -> list[Gpu]:
    """A node's physical GPUs as placement sees them: whole GPUs held by pods first, then the shares
    its pods claim, placed as the VRAM-aware scheduler places them (a time-sliced node advertises
    shares, not GPUs: its GPU count is GPU feature discovery's ``nvidia.com/gpu.count``)."""
    labels = node.metadata.labels or {}
    allocatable = (node.status.allocatable if node.status else None) or {}
    shared = labels.get(SHARING_STRATEGY_LABEL) in SHARING_STRATEGIES
    count = int(labels.get(GPU_COUNT_LABEL, 0)) if shared else int(allocatable.get(naming.GPU_RESOURCE, 0))
    held = sum(_gpus(p) for p in pods)
    used = [1.0 if i < held else 0.0 for i in range(count)]
    for share in sorted((f for f in map(gpu_share, pods) if f), reverse=True):
        index = fullest_fit(used, share)
        if index is not None:
            used[index] += share
    return [Gpu(index=i, free_gib=0 if i < held else max(0.0, memory_gib * (1 - u)), allocated=i < held) for i, u in enumerate(used)]


def pending_replica(pod: client.V1Pod) -> PendingReplica | None:
    """What an Unschedulable model pod asks of the pool: whole GPUs, or one GPU's share."""
    name = f"{pod.metadata.namespace}/{pod.metadata.name}"
    model = (pod.metadata.labels or {})[naming.LABEL_MODEL]
    if _gpus(pod) > 0:
        return PendingReplica(pod=name, model=model, gpus=_gpus(pod))
    share = gpu_share(pod)
    return PendingReplica(pod=name, model=model, gpus=1, gpu_share=share) if share else None


def _capacity_types(pod: client.V1Pod) -> set[str] | None:
    """Capacity types the pod may run on (nodeSelector or required node affinity); None: any."""
    selector = (pod.spec.node_selector or {}).get(naming.NODE_CAPACITY_TYPE)
    if selector:
        return {selector}
    affinity = pod.spec.affinity.node_affinity if pod.spec.affinity else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    allowed: set[str] = set()
    for term in (required.node_selector_terms if required else None) or []:
        for expr in term.match_expressions or []:
            if expr.key == naming.NODE_CAPACITY_TYPE and expr.operator == "In":
                allowed |= set(expr.values or [])
    return allowed or None


def _model_pods(core: client.CoreV1Api, **kwargs) -> list[client.V1Pod]:
    """Live pods serving a model (labelled tideplane.io/model): other apps' pods neither grow a pool nor keep a node."""
    pods = core.list_pod_for_all_namespaces(label_selector=naming.LABEL_MODEL, _request_timeout=API_TIMEOUT, **kwargs).items
    return [p for p in pods if p.metadata.deletion_timestamp is None and (p.status.phase if p.status else None) not in _DONE]


class NodePoolActivities(contract.NodePoolActivities):
    """The node layer's activities, over the worker's Kubernetes and AWS (Auto Scaling) clients."""

    def __init__(self, kube: KubeClient, aws: AwsClient) -> None:
        self.kube = kube
        self.aws = aws

    @activity.defn(name=contract.OBSERVE_NODE_POOL)
    def observe_node_pool(self, req: PoolRef) -> PoolObservation:
        group = self.aws.auto_scaling_group(req.pool)
        core = self.kube.core
        pods = _model_pods(core)
        on_node: dict[str, list[client.V1Pod]] = {}
        for p in pods:
            if p.spec.node_name:
                on_node.setdefault(p.spec.node_name, []).append(p)
        nodes = []
        memory = []
        for n in core.list_node(label_selector=f"{naming.NODE_POOL}={req.pool}", _request_timeout=API_TIMEOUT).items:
            # Without the feature-discovery label every GPU counts as the default size.
            memory_gib = int((n.metadata.labels or {}).get(GPU_MEMORY_LABEL, 0)) / 1024 or DEFAULT_GPU_MEMORY_GIB
            memory.append(memory_gib)
            nodes.append(
                Node(
                    name=n.metadata.name,
                    pool=req.pool,
                    capacity_type=(n.metadata.labels or {}).get(naming.NODE_CAPACITY_TYPE, req.capacity_type),
                    gpus=node_gpus(n, on_node.get(n.metadata.name, []), memory_gib),
                    replicas=len(on_node.get(n.metadata.name, [])),
                    schedulable=not n.spec.unschedulable,
                )
            )
        pending = []
        for p in pods:
            if p.spec.node_name or not unschedulable(p):
                continue
            types = _capacity_types(p)
            if (types is None and req.takes_unconstrained) or (types is not None and req.capacity_type in types):
                pending.append(p)
        replicas = [r for r in map(pending_replica, pending) if r is not None]
        return PoolObservation(
            nodes=sorted(nodes, key=lambda n: n.name),
            pending_gpus=sum(r.gpus for r in replicas),
            pending_pods=sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pending),
            pending=sorted(replicas, key=lambda r: r.pod),
            gpu_memory_gib=max(memory, default=DEFAULT_GPU_MEMORY_GIB),
            desired_capacity=group["DesiredCapacity"],
            max_size=group["MaxSize"],
        )

    @activity.defn(name=contract.SET_POOL_CAPACITY)
    def set_pool_capacity(self, req: SetCapacityInput) -> None:
        group = self.aws.auto_scaling_group(req.pool)
        if req.desired > group["MaxSize"]:
            raise ApplicationError(f"pool {req.pool}: {req.desired} nodes exceeds the group's MaxSize {group['MaxSize']}", non_retryable=True)
        if group["DesiredCapacity"] != req.desired:
            self.aws.set_desired_capacity(req.pool, req.desired)

    def _cordon(self, node: str, cordoned: bool) -> None:
        try:
            self.kube.core.patch_node(node, {"spec": {"unschedulable": cordoned}}, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            fail(exc, f"cordon node {node}")

    @activity.defn(name=contract.REMOVE_POOL_NODE)
    def remove_pool_node(self, req: RemoveNodeInput) -> RemoveNodeResult:
        node = read_or_none(self.kube.core.read_node, req.node)
        if node is None:
            return RemoveNodeResult(removed=True, reason=f"node {req.node} already gone")
        if (node.metadata.labels or {}).get(naming.NODE_POOL) != req.pool:
            raise ApplicationError(f"node {req.node} is not in pool {req.pool}", non_retryable=True)
        self._cordon(req.node, True)
        busy = _model_pods(self.kube.core, field_selector=f"spec.nodeName={req.node}")
        if busy:
            self._cordon(req.node, False)
            return RemoveNodeResult(removed=False, reason=f"node {req.node} runs {len(busy)} model pod(s): kept")
        instance = (node.spec.provider_id or "").rsplit("/", 1)[-1]
        if not instance.startswith("i-"):
            raise ApplicationError(f"node {req.node} has no EC2 providerID ({node.spec.provider_id!r})", non_retryable=True)
        self.aws.terminate_group_instance(instance)  # False: already gone or terminating (a retried call)
        return RemoveNodeResult(removed=True, reason=f"node {req.node} ({instance}) drained and terminated")


    @activity.defn(name=contract.SET_WARM_POOL)
    def set_warm_pool(self, req: SetWarmPoolInput) -> WarmPoolState:
        group = self.aws.auto_scaling_group(req.pool)  # non-retryable when the group does not exist
        tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
        if tags.get(naming.NODE_CAPACITY_TYPE) == "spot":
            raise ApplicationError(f"pool {req.pool}: EC2 Auto Scaling has no warm pools for Spot Instances", non_retryable=True)
        if req.size > group["MaxSize"]:
            raise ApplicationError(
                f"pool {req.pool}: a warm pool of {req.size} exceeds the group's MaxSize {group['MaxSize']}", non_retryable=True
            )
        current = self.aws.warm_pool(req.pool)
        config = (current or {}).get("WarmPoolConfiguration", {})
        wanted = (req.size, req.size, "Stopped", req.reuse_on_scale_in)
        have = (
            config.get("MinSize"),
            config.get("MaxGroupPreparedCapacity"),
            config.get("PoolState"),
            (config.get("InstanceReusePolicy") or {}).get("ReuseOnScaleIn", False),
        )
        # MinSize = MaxGroupPreparedCapacity: the one configuration AWS documents as an absolute pool
        # size (API_PutWarmPool, https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_PutWarmPool.html);
        # that size also bounds what ReuseOnScaleIn returns on a scale-in, so NodePoolScaling sets it
        # before a scale-in to keep exactly the freed nodes it wants warm.
        if have != wanted:
            self.aws.put_warm_pool(req.pool, req.size, req.size, req.reuse_on_scale_in)
        return WarmPoolState(size=req.size, warm_instances=len((current or {}).get("Instances", [])), changed=have != wanted)
