"""GPU node pools as EC2 Auto Scaling groups seen through Kubernetes: ``NodePoolActivities``
(Kubernetes, AWS Auto Scaling), for NodePoolScaling (the contract is workflows/scaling/contract.py):

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

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.aws import AwsClient
from activities.clients.kube import API_TIMEOUT, KubeClient, fail, read_or_none
from activities.scaling.scaling_activities import unschedulable
from workflows.core import naming
from workflows.core.gpu_shares import (
    GPU_COUNT_LABEL,
    SHARED_GPU_RESOURCE,
    SHARING_STRATEGIES,
    SHARING_STRATEGY_LABEL,
    container_share,
    fullest_fit,
)
from workflows.scaling import contract
from workflows.scaling.contract import (
    PendingReplica,
    PoolObservation,
    PoolRef,
    RemoveNodeInput,
    RemoveNodeResult,
    SetCapacityInput,
    SetWarmPoolInput,
    WarmPoolState,
)
from workflows.scaling.placement import Gpu, Node


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
