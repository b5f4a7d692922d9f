"""Side effects of spot failover: SQS notices, node cordon and drain, on-demand replacements.

- SQS: long-poll EventBridge's queue (parsed with workflows.spot.events), delete handled messages.
- Temporal: signal-with-start the per-instance ``SpotReclaim`` (async: uses the activity's client).
- Kubernetes (the official client via activities.kube.api_client): node by ``spec.providerID``,
  cordon, serving pods on a node, the policy/v1 Eviction API, Ready counts, and the fallback
  Deployment ``<name>-od`` whose replicas are the sum of per-instance claims (annotation), so a
  retried or repeated claim converges instead of adding twice.
- EC2 Auto Scaling: the on-demand pool's desired capacity = its base (a tag written when the first
  claim appears) + one node per claiming instance, recomputed from the cluster each time.
"""

from __future__ import annotations

import copy
import functools
import json

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError

from activities.kube import API_TIMEOUT, _fail, _is_ready, _read_or_none, api_client
from workers.config import settings
from workflows import naming
from workflows.spot.workflows import (
    CLAIM_SPOT_FALLBACK,
    DELETE_SPOT_MESSAGE,
    EVICT_PODS,
    FIND_SPOT_NODE,
    RECEIVE_SPOT_NOTICES,
    RELEASE_SPOT_FALLBACK,
    SERVING_PODS_ON_NODE,
    SET_NODE_UNSCHEDULABLE,
    SPOT_REPLICA_COUNTS,
    START_RETURN_TO_SPOT,
    START_SPOT_RECLAIM,
    SYNC_ON_DEMAND_POOL,
    ClaimFallbackInput,
    CountsInput,
    CountsResult,
    DeleteMessageInput,
    DeploymentKey,
    EvictInput,
    EvictResult,
    FallbackState,
    FindNodeInput,
    NodeInfo,
    NodeRef,
    PodsOnNode,
    PoolInput,
    PoolState,
    ReceivedBatch,
    ReceivedMessage,
    ReceiveNoticesInput,
    ReleaseFallbackInput,
    ReplicaCounts,
    ReturnToSpot,
    ReturnToSpotInput,
    ServingPod,
    SpotReclaim,
    SpotReclaimInput,
    StartedWorkflow,
    StartReclaimInput,
    UnschedulableInput,
    return_to_spot_workflow_id,
)
from workflows.spot.events import (
    MalformedEvent,
    instance_id_from_provider_id,
    parse_event,
    reclaim_workflow_id,
)

FALLBACK_FOR = "tideplane.io/fallback-for"  # label: on the fallback Deployment and its pods
CLAIMS_ANNOTATION = "tideplane.io/spot-claims"  # JSON {instance-id: replicas}
POOL_BASE_TAG = "tideplane.io/spot-base-capacity"
_CONFLICT_RETRIES = 5


# ---------------------------------------------------------------- SQS


@functools.cache
def _aws(service: str, endpoint_url: str | None, region: str):
    # read_timeout above SQS's 20 s long poll
    return boto3.client(service, endpoint_url=endpoint_url, region_name=region,
                        config=Config(connect_timeout=5, read_timeout=40, retries={"max_attempts": 3, "mode": "standard"}))


def aws_client(service: str):
    s = settings()
    return _aws(service, s.aws_endpoint_url, s.aws_region)


def _queue_url(queue_url: str | None) -> str:
    url = queue_url or settings().spot_queue_url
    if not url:
        raise ApplicationError("no spot queue: set TIDEPLANE_SPOT_QUEUE_URL or the watcher's queue_url", non_retryable=True)
    return url


def _sqs_error(exc: ClientError, what: str) -> ApplicationError:
    code = exc.response.get("Error", {}).get("Code", "")
    permanent = code in {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "ReceiptHandleIsInvalid", "InvalidParameterValue", "AccessDenied"}
    return ApplicationError(f"{what}: {code}: {exc}", non_retryable=permanent)


@activity.defn(name=RECEIVE_SPOT_NOTICES)
def receive_spot_notices(req: ReceiveNoticesInput) -> ReceivedBatch:
    """Long-poll the queue; each message comes back parsed (or with why it is malformed)."""
    url = _queue_url(req.queue_url)
    try:
        response = aws_client("sqs").receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=req.max_messages,
            WaitTimeSeconds=req.wait_seconds,
            VisibilityTimeout=req.visibility_timeout_seconds,
        )
    except ClientError as exc:
        raise _sqs_error(exc, f"receive from {url}") from None
    batch = ReceivedBatch()
    for m in response.get("Messages", []):
        received = ReceivedMessage(message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"])
        try:
            received.notice = parse_event(m.get("Body", ""))
        except MalformedEvent as exc:
            received.error = str(exc)
        batch.messages.append(received)
    return batch


@activity.defn(name=DELETE_SPOT_MESSAGE)
def delete_spot_message(req: DeleteMessageInput) -> None:
    url = _queue_url(req.queue_url)
    try:
        aws_client("sqs").delete_message(QueueUrl=url, ReceiptHandle=req.receipt_handle)
    except ClientError as exc:
        raise _sqs_error(exc, f"delete from {url}") from None


# ---------------------------------------------------------------- Temporal


@activity.defn(name=START_SPOT_RECLAIM)
async def start_spot_reclaim(req: StartReclaimInput) -> StartedWorkflow:
    """Signal-with-start: a running SpotReclaim for the instance gets the notice, else one starts."""
    workflow_id = reclaim_workflow_id(req.notice.instance_id)
    await activity.client().start_workflow(
        SpotReclaim.run,
        SpotReclaimInput(instance_id=req.notice.instance_id, policy=req.policy),
        id=workflow_id,
        task_queue=activity.info().task_queue,
        start_signal="notice",
        start_signal_args=[req.notice],
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"spot {req.notice.kind.value} for {req.notice.instance_id}",
    )
    return StartedWorkflow(workflow_id=workflow_id)


@activity.defn(name=START_RETURN_TO_SPOT)
async def start_return_to_spot(req: ReturnToSpotInput) -> StartedWorkflow:
    """Start the Deployment's ReturnToSpot unless one runs (it releases every claim on the fallback)."""
    workflow_id = return_to_spot_workflow_id(req.deployment.namespace, req.deployment.name)
    await activity.client().start_workflow(
        ReturnToSpot.run,
        req,
        id=workflow_id,
        task_queue=activity.info().task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"return {req.deployment.namespace}/{req.deployment.name} to spot",
    )
    return StartedWorkflow(workflow_id=workflow_id)


# ---------------------------------------------------------------- Kubernetes


def _core() -> client.CoreV1Api:
    return client.CoreV1Api(api_client())


def _apps() -> client.AppsV1Api:
    return client.AppsV1Api(api_client())


@activity.defn(name=FIND_SPOT_NODE)
def find_spot_node(req: FindNodeInput) -> NodeInfo:
    """The node whose ``spec.providerID`` names the instance (no field selector exists for it)."""
    for node in _core().list_node(_request_timeout=API_TIMEOUT).items:
        try:
            instance = instance_id_from_provider_id(node.spec.provider_id or "")
        except ValueError:
            continue
        if instance == req.instance_id:
            labels = node.metadata.labels or {}
            return NodeInfo(
                name=node.metadata.name,
                capacity_type=labels.get(naming.NODE_CAPACITY_TYPE),
                zone=labels.get(naming.NODE_ZONE),
                unschedulable=bool(node.spec.unschedulable),
            )
    return NodeInfo()


@activity.defn(name=SET_NODE_UNSCHEDULABLE)
def set_node_unschedulable(req: UnschedulableInput) -> None:
    """Cordon (or uncordon); a node that is already gone needs neither."""
    try:
        _core().patch_node(req.node, {"spec": {"unschedulable": req.unschedulable}}, _request_timeout=API_TIMEOUT)
    except ApiException as exc:
        if exc.status != 404:
            _fail(exc, f"cordon node {req.node}")


def _versioned(pod_labels: dict[str, str]) -> str | None:
    app, version = pod_labels.get(naming.LABEL_APP), pod_labels.get(naming.LABEL_VERSION)
    return naming.versioned_name(app, version) if app and version else None


@activity.defn(name=SERVING_PODS_ON_NODE)
def serving_pods_on_node(req: NodeRef) -> PodsOnNode:
    """Serving pods on the node (tideplane's layout: app + version labels, their versioned
    Deployment exists; fallback pods excluded, their own Deployment replaces them)."""
    pods = _core().list_pod_for_all_namespaces(field_selector=f"spec.nodeName={req.node}", _request_timeout=API_TIMEOUT).items
    apps, exists, found = _apps(), {}, PodsOnNode()
    for pod in pods:
        labels = pod.metadata.labels or {}
        deployment = _versioned(labels)
        if (
            deployment is None
            or FALLBACK_FOR in labels
            or pod.metadata.deletion_timestamp is not None
            or (pod.status and pod.status.phase in ("Succeeded", "Failed"))
        ):
            continue
        key = (pod.metadata.namespace, deployment)
        if key not in exists:
            exists[key] = _read_or_none(apps.read_namespaced_deployment, deployment, key[0]) is not None
        if exists[key]:
            found.pods.append(ServingPod(namespace=key[0], name=pod.metadata.name, deployment=deployment, ready=_is_ready(pod)))
    return found


def fallback_name(name: str) -> str:
    return f"{name[:60].rstrip('-')}-od"


def _claims(deployment: dict | None) -> dict[str, int]:
    raw = ((deployment or {}).get("metadata", {}).get("annotations") or {}).get(CLAIMS_ANNOTATION)
    try:
        claims = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): int(v) for k, v in claims.items() if int(v) > 0} if isinstance(claims, dict) else {}


def fallback_manifest(original: dict, claims: dict[str, int], capacity_type: str) -> dict:
    """The on-demand twin of a spot Deployment: same pods (so its Service routes to them), other nodes.

    The Deployment itself carries no app label, so it is never mistaken for a version of the
    logical deployment; its pods carry the serving labels plus ``tideplane.io/fallback-for``.
    """
    name, ns = original["metadata"]["name"], original["metadata"]["namespace"]
    template = copy.deepcopy(original["spec"]["template"])
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    labels[FALLBACK_FOR] = name
    spec = template.setdefault("spec", {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), naming.NODE_CAPACITY_TYPE: capacity_type}
    selector = {k: v for k, v in labels.items() if k in (naming.LABEL_APP, naming.LABEL_VERSION)} | {FALLBACK_FOR: name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": fallback_name(name),
            "namespace": ns,
            "labels": {naming.LABEL_MANAGED_BY: naming.MANAGED_BY, FALLBACK_FOR: name},
            "annotations": {CLAIMS_ANNOTATION: json.dumps(claims, sort_keys=True)},
        },
        "spec": {"replicas": sum(claims.values()), "selector": {"matchLabels": selector}, "template": template},
    }


def _as_dict(obj) -> dict | None:
    return None if obj is None else api_client().sanitize_for_serialization(obj)


def _write_fallback(key: DeploymentKey, update_claims, capacity_type: str) -> FallbackState:
    """Read-modify-write the fallback's claims with optimistic concurrency (resourceVersion)."""
    apps = _apps()
    for _ in range(_CONFLICT_RETRIES):
        original = _as_dict(_read_or_none(apps.read_namespaced_deployment, key.name, key.namespace))
        if original is None:
            raise ApplicationError(f"Deployment {key.namespace}/{key.name} not found", non_retryable=True)
        current = _as_dict(_read_or_none(apps.read_namespaced_deployment, fallback_name(key.name), key.namespace))
        claims = update_claims(_claims(current))
        state = FallbackState(name=fallback_name(key.name), replicas=sum(claims.values()), claims=claims)
        if current is None and not claims:
            return state
        body = fallback_manifest(original, claims, capacity_type)
        try:
            if current is None:
                apps.create_namespaced_deployment(key.namespace, body, _request_timeout=API_TIMEOUT)
            else:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                apps.replace_namespaced_deployment(body["metadata"]["name"], key.namespace, body, _request_timeout=API_TIMEOUT)
            return state
        except ApiException as exc:
            if exc.status not in (409,):
                _fail(exc, f"fallback Deployment for {key.namespace}/{key.name}")
    raise ApplicationError(f"fallback for {key.namespace}/{key.name} kept changing under us ({_CONFLICT_RETRIES} conflicts)")


@activity.defn(name=CLAIM_SPOT_FALLBACK)
def claim_spot_fallback(req: ClaimFallbackInput) -> FallbackState:
    """Set (not add) this instance's claim of on-demand replicas; 0 withdraws it."""

    def update(claims: dict[str, int]) -> dict[str, int]:
        claims = {k: v for k, v in claims.items() if k != req.claimant}
        return claims | ({req.claimant: req.replicas} if req.replicas else {})

    return _write_fallback(req.deployment, update, req.capacity_type)


@activity.defn(name=RELEASE_SPOT_FALLBACK)
def release_spot_fallback(req: ReleaseFallbackInput) -> FallbackState:
    """Withdraw every claim: the fallback scales to zero. Returns what was released."""
    released: dict[str, int] = {}

    def update(claims: dict[str, int]) -> dict[str, int]:
        released.clear()
        released.update(claims)
        return {}

    state = _write_fallback(req.deployment, update, "on-demand")
    return FallbackState(name=state.name, replicas=sum(released.values()), claims=dict(released))


@activity.defn(name=EVICT_PODS)
def evict_pods(req: EvictInput) -> EvictResult:
    """Evict through policy/v1 Eviction, so PodDisruptionBudgets and graceful termination hold."""
    core, result = _core(), EvictResult()
    for pod in req.pods:
        ref = f"{pod.namespace}/{pod.name}"
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace))
        try:
            core.create_namespaced_pod_eviction(pod.name, pod.namespace, body, _request_timeout=API_TIMEOUT)
            result.evicted.append(ref)
        except ApiException as exc:
            if exc.status == 404:
                result.gone.append(ref)
            elif exc.status == 429:
                result.blocked.append(ref)
            else:
                _fail(exc, f"evict pod {ref}")
    activity.logger.info("evicted %d, gone %d, blocked %d", len(result.evicted), len(result.gone), len(result.blocked))
    return result


@activity.defn(name=SPOT_REPLICA_COUNTS)
def spot_replica_counts(req: CountsInput) -> CountsResult:
    """Desired and Ready replicas of each spot Deployment and of its on-demand fallback.

    Pods are counted by label (own pods lack ``tideplane.io/fallback-for``), not from the
    Deployment's status, so overlapping selectors never count a replica twice.
    """
    apps, core, counts = _apps(), _core(), []
    for key in req.deployments:
        original = _read_or_none(apps.read_namespaced_deployment, key.name, key.namespace)
        if original is None:
            counts.append(ReplicaCounts(namespace=key.namespace, name=key.name, desired=0, ready=0))
            continue
        fallback = _read_or_none(apps.read_namespaced_deployment, fallback_name(key.name), key.namespace)
        labels = original.spec.template.metadata.labels or {}
        selector = ",".join(f"{k}={labels[k]}" for k in (naming.LABEL_APP, naming.LABEL_VERSION) if k in labels)
        pods = core.list_namespaced_pod(key.namespace, label_selector=selector, _request_timeout=API_TIMEOUT).items
        ready = [p for p in pods if _is_ready(p)]
        counts.append(ReplicaCounts(
            namespace=key.namespace,
            name=key.name,
            desired=original.spec.replicas or 0,
            ready=sum(1 for p in ready if FALLBACK_FOR not in (p.metadata.labels or {})),
            fallback_desired=(fallback.spec.replicas or 0) if fallback else 0,
            fallback_ready=sum(1 for p in ready if (p.metadata.labels or {}).get(FALLBACK_FOR) == key.name),
        ))
    return CountsResult(counts=counts)


# ---------------------------------------------------------------- EC2 Auto Scaling


@activity.defn(name=SYNC_ON_DEMAND_POOL)
def sync_on_demand_pool(req: PoolInput) -> PoolState:
    """Desired capacity = base + one node per instance that still claims fallback replicas."""
    claimants = sorted({
        claimant
        for d in _apps().list_deployment_for_all_namespaces(label_selector=FALLBACK_FOR, _request_timeout=API_TIMEOUT).items
        for claimant in _claims(_as_dict(d))
    })
    asg = aws_client("autoscaling")
    try:
        groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[req.asg])["AutoScalingGroups"]
        if not groups:
            raise ApplicationError(f"Auto Scaling group {req.asg!r} not found", non_retryable=True)
        group = groups[0]
        tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
        base = int(tags.get(POOL_BASE_TAG, group["DesiredCapacity"]))
        tag = {"ResourceId": req.asg, "ResourceType": "auto-scaling-group", "Key": POOL_BASE_TAG}
        if claimants and POOL_BASE_TAG not in tags:
            asg.create_or_update_tags(Tags=[tag | {"Value": str(base), "PropagateAtLaunch": False}])
        desired = min(group["MaxSize"], base + len(claimants))
        if desired != group["DesiredCapacity"]:
            asg.set_desired_capacity(AutoScalingGroupName=req.asg, DesiredCapacity=desired, HonorCooldown=False)
        if not claimants and POOL_BASE_TAG in tags:
            asg.delete_tags(Tags=[tag])
    except ClientError as exc:
        raise ApplicationError(f"Auto Scaling group {req.asg}: {exc}") from None
    activity.logger.info("on-demand pool %s: desired %d (base %d, claimants %s)", req.asg, desired, base, claimants)
    return PoolState(desired=desired, base=base, claimants=claimants)


ACTIVITIES = [
    receive_spot_notices,
    delete_spot_message,
    start_spot_reclaim,
    start_return_to_spot,
    find_spot_node,
    set_node_unschedulable,
    serving_pods_on_node,
    claim_spot_fallback,
    release_spot_fallback,
    evict_pods,
    spot_replica_counts,
    sync_on_demand_pool,
]
