"""Node layer side effects: GPU node pools as EC2 Auto Scaling groups, seen through Kubernetes.

- ``observe_node_pool``: the pool's nodes (GPUs allocatable and held, model pods on each), the
  Unschedulable model pods this pool can serve (by their capacity-type requirement, which the
  priority class sets: batch pods wait for the spot pool, realtime for on-demand) and the GPUs
  they ask for, and the group's desired capacity.
- ``set_pool_capacity``: the group's desired capacity (idempotent: setting it twice is a no-op).
- ``remove_pool_node``: cordon an idle node and terminate its instance with the group's desired
  capacity decremented; a node that took a model pod meanwhile is uncordoned and kept.
"""

from __future__ import annotations

from botocore.exceptions import ClientError
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube import API_TIMEOUT, _fail, _read_or_none, api_client
from activities.spot import aws_client
from workflows import naming
from workflows.scaling.placement import Gpu, Node
from workflows.scaling.activities import (
    OBSERVE_NODE_POOL,
    REMOVE_POOL_NODE,
    SET_POOL_CAPACITY,
    PendingReplica,
    PoolObservation,
    PoolRef,
    RemoveNodeInput,
    RemoveNodeResult,
    SetCapacityInput,
)

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU, as GPU feature discovery labels nodes
DEFAULT_GPU_MEMORY_GIB = 80.0
_DONE = ("Succeeded", "Failed")


def _group(pool: str) -> dict:
    try:
        groups = aws_client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[pool])["AutoScalingGroups"]
    except ClientError as exc:
        raise ApplicationError(f"Auto Scaling group {pool}: {exc}") from None
    if not groups:
        raise ApplicationError(f"Auto Scaling group {pool!r} not found", non_retryable=True)
    return groups[0]


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


def _unschedulable(pod: client.V1Pod) -> bool:
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in (pod.status.conditions if pod.status else None) or []
    )


def _model_pods(core: client.CoreV1Api, **kwargs) -> list[client.V1Pod]:
    """Live pods serving a model (labelled tideplane.io/model): other apps' pods neither grow a pool nor keep a node."""
    pods = core.list_pod_for_all_namespaces(label_selector=naming.LABEL_MODEL, _request_timeout=API_TIMEOUT, **kwargs).items
    return [p for p in pods if p.metadata.deletion_timestamp is None and (p.status.phase if p.status else None) not in _DONE]


@activity.defn(name=OBSERVE_NODE_POOL)
def observe_node_pool(req: PoolRef) -> PoolObservation:
    group = _group(req.pool)
    core = client.CoreV1Api(api_client())
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
        if p.spec.node_name or not _unschedulable(p):
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


@activity.defn(name=SET_POOL_CAPACITY)
def set_pool_capacity(req: SetCapacityInput) -> None:
    group = _group(req.pool)
    if req.desired > group["MaxSize"]:
        raise ApplicationError(f"pool {req.pool}: {req.desired} nodes exceeds the group's MaxSize {group['MaxSize']}", non_retryable=True)
    if group["DesiredCapacity"] != req.desired:
        try:
            aws_client("autoscaling").set_desired_capacity(AutoScalingGroupName=req.pool, DesiredCapacity=req.desired, HonorCooldown=False)
        except ClientError as exc:
            raise ApplicationError(f"Auto Scaling group {req.pool}: {exc}") from None


def _cordon(core: client.CoreV1Api, node: str, unschedulable: bool) -> None:
    try:
        core.patch_node(node, {"spec": {"unschedulable": unschedulable}}, _request_timeout=API_TIMEOUT)
    except ApiException as exc:
        _fail(exc, f"cordon node {node}")


@activity.defn(name=REMOVE_POOL_NODE)
def remove_pool_node(req: RemoveNodeInput) -> RemoveNodeResult:
    core = client.CoreV1Api(api_client())
    node = _read_or_none(core.read_node, req.node)
    if node is None:
        return RemoveNodeResult(removed=True, reason=f"node {req.node} already gone")
    if (node.metadata.labels or {}).get(naming.NODE_POOL) != req.pool:
        raise ApplicationError(f"node {req.node} is not in pool {req.pool}", non_retryable=True)
    _cordon(core, req.node, True)
    busy = _model_pods(core, field_selector=f"spec.nodeName={req.node}")
    if busy:
        _cordon(core, req.node, False)
        return RemoveNodeResult(removed=False, reason=f"node {req.node} runs {len(busy)} model pod(s): kept")
    instance = (node.spec.provider_id or "").rsplit("/", 1)[-1]
    if not instance.startswith("i-"):
        raise ApplicationError(f"node {req.node} has no EC2 providerID ({node.spec.provider_id!r})", non_retryable=True)
    try:
        aws_client("autoscaling").terminate_instance_in_auto_scaling_group(InstanceId=instance, ShouldDecrementDesiredCapacity=True)
    except ClientError as exc:
        if "not found" not in str(exc).lower() and "terminat" not in str(exc).lower():
            raise ApplicationError(f"terminate {instance} of node {req.node}: {exc}") from None
    return RemoveNodeResult(removed=True, reason=f"node {req.node} ({instance}) drained and terminated")


ACTIVITIES = [observe_node_pool, set_pool_capacity, remove_pool_node]
