"""Node layer side effects: GPU node pools as EC2 Auto Scaling groups, seen through Kubernetes.

``NodePoolActivities`` implements the contract in workflows/scaling/activities.py with the
worker's Kubernetes and AWS clients:

- ``observe_node_pool``: the pool's nodes (GPUs allocatable and held, model pods on each), the
  Unschedulable model pods this pool can serve (by their capacity-type requirement, which the
  priority class sets: batch pods wait for the spot pool, realtime for on-demand) and the GPUs
  they ask for, and the group's desired capacity.
- ``set_pool_capacity``: the group's desired capacity (idempotent: setting it twice is a no-op).
- ``remove_pool_node``: cordon an idle node and terminate its instance with the group's desired
  capacity decremented; a node that took a model pod meanwhile is uncordoned and kept.
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.aws import AwsClient
from activities.clients.kube import API_TIMEOUT, KubeClient, fail, read_or_none
from activities.scaling import unschedulable
from workflows import naming
from workflows.scaling import activities as contract
from workflows.scaling.activities import (
    PendingReplica,
    PoolObservation,
    PoolRef,
    RemoveNodeInput,
    RemoveNodeResult,
    SetCapacityInput,
)
from workflows.scaling.placement import Gpu, Node

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU, as GPU feature discovery labels nodes
DEFAULT_GPU_MEMORY_GIB = 80.0
_DONE = ("Succeeded", "Failed")


def _gpus(pod: client.V1Pod) -> int:
    total = 0
    for c in pod.spec.containers or []:
        limits = (c.resources.limits if c.resources else None) or {}
        total += int(limits.get(naming.GPU_RESOURCE, 0))
    return total


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
            allocatable = int((n.status.allocatable or {}).get(naming.GPU_RESOURCE, 0)) if n.status else 0
            held = sum(_gpus(p) for p in on_node.get(n.metadata.name, []))
            # Model pods hold whole GPUs; without the feature-discovery label every GPU counts as the default size.
            memory_gib = int((n.metadata.labels or {}).get(GPU_MEMORY_LABEL, 0)) / 1024 or DEFAULT_GPU_MEMORY_GIB
            memory.append(memory_gib)
            nodes.append(
                Node(
                    name=n.metadata.name,
                    pool=req.pool,
                    capacity_type=(n.metadata.labels or {}).get(naming.NODE_CAPACITY_TYPE, req.capacity_type),
                    gpus=[Gpu(index=i, free_gib=0 if i < held else memory_gib, allocated=i < held) for i in range(allocatable)],
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
        return PoolObservation(
            nodes=sorted(nodes, key=lambda n: n.name),
            pending_gpus=sum(_gpus(p) for p in pending),
            pending_pods=sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pending),
            pending=sorted(
                (
                    PendingReplica(
                        pod=f"{p.metadata.namespace}/{p.metadata.name}", model=p.metadata.labels[naming.LABEL_MODEL], gpus=_gpus(p)
                    )
                    for p in pending
                    if _gpus(p) > 0
                ),
                key=lambda r: r.pod,
            ),
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

