"""Side effects of spot failover: SQS notices, node cordon and drain, on-demand replacements.

- SQS: long-poll EventBridge's queue (parsed with workflows.spot.events), delete handled messages.
- Kubernetes: node by ``spec.providerID``, cordon, serving pods on a node, the policy/v1 Eviction
  API, Ready counts, and the fallback Deployment ``<name>-od`` whose replicas are the sum of
  per-instance claims (annotation), so a retried or repeated claim converges instead of adding twice.
- EC2 Auto Scaling: the on-demand pool's desired capacity = its base (a tag written when the first
  claim appears) + one node per claiming instance, recomputed from the cluster each time.
- Temporal: signal-with-start the per-instance ``SpotReclaim`` and start ``ReturnToSpot`` (async:
  through the activity's own client).
"""

from __future__ import annotations

import copy
import json
from typing import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError

from activities.clients.aws import AwsClient
from activities.clients.kube import API_TIMEOUT, KubeClient, fail, is_ready, label_selector, read_or_none, retry_on_conflict
from workflows.core import naming
from workflows.spot import contract
from workflows.spot.contract import (
    AppliedSpotMix,
    ApplySpotMixInput,
    ClaimFallbackInput,
    CountsInput,
    CountsResult,
    DeleteMessageInput,
    EvictInput,
    EvictResult,
    FallbackClaims,
    FindNodeInput,
    NodeRef,
    PodsOnNode,
    PoolInput,
    PoolState,
    ReceivedBatch,
    ReceivedMessage,
    ReceiveNoticesInput,
    ReleaseFallbackInput,
    ReplicaCounts,
    ReturnToSpotInput,
    ServingPod,
    SpotDomainsInput,
    SpotDomainsNow,
    SpotNode,
    StartedWorkflow,
    StartReclaimInput,
    UnschedulableInput,
)
from workflows.spot.events import MalformedEvent, instance_id_from_provider_id, parse_event
from workflows.spot.mix import MIX_CLAIMANT, MIX_TARGET_ANNOTATION, DomainNow
from workflows.spot.reclaim import SpotReclaim, SpotReclaimInput
from workflows.spot.return_to_spot import ReturnToSpot

FALLBACK_FOR = "tideplane.io/fallback-for"  # label: on the fallback Deployment and its pods
CLAIMS_ANNOTATION = "tideplane.io/spot-claims"  # JSON {instance-id: replicas}
POOL_BASE_TAG = "tideplane.io/spot-base-capacity"
MIX_FOR = "tideplane.io/spot-mix-for"  # label: on a spot mix Deployment and its pods (the versioned name)
MIX_POOL = "tideplane.io/spot-pool"  # label: on a spot mix Deployment's pods, its node pool


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


def mix_name(name: str, pool: str) -> str:
    return f"{name[:40].rstrip('-')}-{pool[:22]}".rstrip("-")


def mix_manifest(original: dict, pool: str, replicas: int) -> dict:
    """The versioned Deployment's pods pinned to one spot node pool (a failure domain of the mix).

    Same serving labels (its Service routes to them, the loop counts them Ready) plus
    ``tideplane.io/spot-mix-for``; no ``tideplane.io/fallback-for``, so they count as spot.
    """
    name, ns = original["metadata"]["name"], original["metadata"]["namespace"]
    template = copy.deepcopy(original["spec"]["template"])
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    labels[MIX_FOR] = name
    spec = template.setdefault("spec", {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), naming.NODE_CAPACITY_TYPE: "spot", naming.NODE_POOL: pool}
    labels[MIX_POOL] = pool
    selector = {k: v for k, v in labels.items() if k in (naming.LABEL_APP, naming.LABEL_VERSION, MIX_FOR, MIX_POOL)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": mix_name(name, pool), "namespace": ns, "labels": {naming.LABEL_MANAGED_BY: naming.MANAGED_BY, MIX_FOR: name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": template},
    }


def _versioned(pod_labels: dict[str, str]) -> str | None:
    app, version = pod_labels.get(naming.LABEL_APP), pod_labels.get(naming.LABEL_VERSION)
    return naming.versioned_name(app, version) if app and version else None


class SpotActivities(contract.SpotActivities, contract.SpotMixActivities):
    """The spot workflows' side effects on SQS, one cluster and EC2 Auto Scaling (and the spot mix's)."""

    def __init__(self, kube: KubeClient, aws: AwsClient, queue_url: str | None = None) -> None:
        """``queue_url``: the SQS queue EventBridge feeds, for watchers that name none."""
        self._kube = kube
        self._aws = aws
        self._queue_url = queue_url

    # ------------------------------------------------------------ SQS

    def _queue(self, queue_url: str | None) -> str:
        url = queue_url or self._queue_url
        if not url:
            raise ApplicationError("no spot queue: set TIDEPLANE_SPOT_QUEUE_URL or the watcher's queue_url", non_retryable=True)
        return url

    @activity.defn(name="receive_spot_notices")
    def receive_spot_notices(self, req: ReceiveNoticesInput) -> ReceivedBatch:
        """Long-poll the queue; each message comes back parsed (or with why it is malformed)."""
        messages = self._aws.receive_messages(
            self._queue(req.queue_url), req.max_messages, req.wait_seconds, req.visibility_timeout_seconds
        )
        batch = ReceivedBatch()
        for m in messages:
            received = ReceivedMessage(message_id=m["MessageId"], receipt_handle=m["ReceiptHandle"])
            try:
                received.notice = parse_event(m.get("Body", ""))
            except MalformedEvent as exc:
                received.error = str(exc)
            batch.messages.append(received)
        return batch

    @activity.defn(name="delete_spot_message")
    def delete_spot_message(self, req: DeleteMessageInput) -> None:
        self._aws.delete_message(self._queue(req.queue_url), req.receipt_handle)

    # ------------------------------------------------------------ Kubernetes

    @activity.defn(name="find_spot_node")
    def find_spot_node(self, req: FindNodeInput) -> SpotNode:
        """The node whose ``spec.providerID`` names the instance (no field selector exists for it)."""
        for node in self._kube.core.list_node(_request_timeout=API_TIMEOUT).items:
            try:
                instance = instance_id_from_provider_id(node.spec.provider_id or "")
            except ValueError:
                continue
            if instance == req.instance_id:
                labels = node.metadata.labels or {}
                return SpotNode(
                    name=node.metadata.name,
                    pool=labels.get(naming.NODE_POOL),
                    capacity_type=labels.get(naming.NODE_CAPACITY_TYPE),
                    zone=labels.get(naming.NODE_ZONE),
                    unschedulable=bool(node.spec.unschedulable),
                )
        return SpotNode()

    @activity.defn(name="set_node_unschedulable")
    def set_node_unschedulable(self, req: UnschedulableInput) -> None:
        """Cordon (or uncordon); a node that is already gone needs neither."""
        try:
            self._kube.core.patch_node(req.node, {"spec": {"unschedulable": req.unschedulable}}, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                fail(exc, f"cordon node {req.node}")

    @activity.defn(name="serving_pods_on_node")
    def serving_pods_on_node(self, req: NodeRef) -> PodsOnNode:
        """Serving pods on the node (tideplane's layout: app + version labels, their versioned
        Deployment exists; fallback pods excluded, their own Deployment replaces them)."""
        pods = self._kube.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={req.node}", _request_timeout=API_TIMEOUT
        ).items
        exists: dict[tuple[str, str], bool] = {}
        found = PodsOnNode()
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
                exists[key] = read_or_none(self._kube.apps.read_namespaced_deployment, deployment, key[0]) is not None
            if exists[key]:
                found.pods.append(ServingPod(namespace=key[0], name=pod.metadata.name, deployment=deployment, ready=is_ready(pod)))
        return found

    def _as_dict(self, obj) -> dict | None:
        return None if obj is None else self._kube.api.sanitize_for_serialization(obj)

    def _write_fallback(
        self, key: naming.DeploymentRef, update_claims: Callable[[dict[str, int]], dict[str, int]], capacity_type: str
    ) -> FallbackClaims:
        """Read-modify-write the fallback's claims with optimistic concurrency (resourceVersion)."""
        apps = self._kube.apps

        def write() -> FallbackClaims:
            original = self._as_dict(read_or_none(apps.read_namespaced_deployment, key.name, key.namespace))
            if original is None:
                raise ApplicationError(f"Deployment {key.namespace}/{key.name} not found", non_retryable=True)
            current = self._as_dict(read_or_none(apps.read_namespaced_deployment, fallback_name(key.name), key.namespace))
            claims = update_claims(_claims(current))
            state = FallbackClaims(name=fallback_name(key.name), replicas=sum(claims.values()), claims=claims)
            if current is None and not claims:
                return state
            body = fallback_manifest(original, claims, capacity_type)
            if current is None:
                apps.create_namespaced_deployment(key.namespace, body, _request_timeout=API_TIMEOUT)
            else:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                apps.replace_namespaced_deployment(body["metadata"]["name"], key.namespace, body, _request_timeout=API_TIMEOUT)
            return state

        return retry_on_conflict(f"fallback Deployment for {key.namespace}/{key.name}", write)

    @activity.defn(name="claim_spot_fallback")
    def claim_spot_fallback(self, req: ClaimFallbackInput) -> FallbackClaims:
        """Set (not add) this instance's claim of on-demand replicas; 0 withdraws it."""

        def update(claims: dict[str, int]) -> dict[str, int]:
            claims = {k: v for k, v in claims.items() if k != req.claimant}
            return claims | ({req.claimant: req.replicas} if req.replicas else {})

        return self._write_fallback(req.deployment, update, req.capacity_type)

    @activity.defn(name="release_spot_fallback")
    def release_spot_fallback(self, req: ReleaseFallbackInput) -> FallbackClaims:
        """Withdraw every reclaim's claim (the spot mix's on-demand base stays). Returns what was released."""
        released: dict[str, int] = {}

        def update(claims: dict[str, int]) -> dict[str, int]:
            released.clear()
            released.update({k: v for k, v in claims.items() if k != MIX_CLAIMANT})
            return {k: v for k, v in claims.items() if k == MIX_CLAIMANT}

        state = self._write_fallback(req.deployment, update, "on-demand")
        return FallbackClaims(name=state.name, replicas=sum(released.values()), claims=dict(released))

    @activity.defn(name="evict_pods")
    def evict_pods(self, req: EvictInput) -> EvictResult:
        """Evict through policy/v1 Eviction, so PodDisruptionBudgets and graceful termination hold."""
        result = EvictResult()
        for pod in req.pods:
            ref = f"{pod.namespace}/{pod.name}"
            body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace))
            try:
                self._kube.core.create_namespaced_pod_eviction(pod.name, pod.namespace, body, _request_timeout=API_TIMEOUT)
                result.evicted.append(ref)
            except ApiException as exc:
                if exc.status == 404:
                    result.gone.append(ref)
                elif exc.status == 429:
                    result.blocked.append(ref)
                else:
                    fail(exc, f"evict pod {ref}")
        activity.logger.info("evicted %d, gone %d, blocked %d", len(result.evicted), len(result.gone), len(result.blocked))
        return result

    @activity.defn(name="spot_replica_counts")
    def spot_replica_counts(self, req: CountsInput) -> CountsResult:
        """Desired and Ready replicas of each spot Deployment and of its on-demand fallback.

        Pods are counted by label (own pods lack ``tideplane.io/fallback-for``), not from the
        Deployment's status, so overlapping selectors never count a replica twice.
        """
        apps, core, counts = self._kube.apps, self._kube.core, []
        for key in req.deployments:
            original = read_or_none(apps.read_namespaced_deployment, key.name, key.namespace)
            if original is None:
                counts.append(ReplicaCounts(namespace=key.namespace, name=key.name, desired=0, ready=0))
                continue
            fallback = read_or_none(apps.read_namespaced_deployment, fallback_name(key.name), key.namespace)
            labels = original.spec.template.metadata.labels or {}
            selector = label_selector({k: labels[k] for k in (naming.LABEL_APP, naming.LABEL_VERSION) if k in labels})
            pods = core.list_namespaced_pod(key.namespace, label_selector=selector, _request_timeout=API_TIMEOUT).items
            ready = [p for p in pods if is_ready(p)]
            mix_target = (original.metadata.annotations or {}).get(MIX_TARGET_ANNOTATION)
            base = _claims(self._as_dict(fallback)).get(MIX_CLAIMANT, 0)
            counts.append(ReplicaCounts(
                namespace=key.namespace,
                name=key.name,
                # under a spot mix: what spot must hold Ready for the total, the on-demand base aside
                desired=max(0, int(mix_target) - base) if mix_target is not None else original.spec.replicas or 0,
                ready=sum(1 for p in ready if FALLBACK_FOR not in (p.metadata.labels or {})),
                fallback_desired=(fallback.spec.replicas or 0) if fallback else 0,
                fallback_ready=sum(1 for p in ready if (p.metadata.labels or {}).get(FALLBACK_FOR) == key.name),
            ))
        return CountsResult(counts=counts)

    # ------------------------------------------------------------ the spot mix

    @activity.defn(name="read_spot_domains")
    def read_spot_domains(self, req: SpotDomainsInput) -> SpotDomainsNow:
        """A pool whose group may not grow (MaxSize 0: capacity withdrawn) is unavailable; its room is MaxSize nodes."""
        out = SpotDomainsNow()
        for d in req.domains:
            group = self._aws.auto_scaling_group(d.pool)
            out.domains.append(DomainNow(pool=d.pool, available=group["MaxSize"] > 0, capacity=group["MaxSize"] * d.replicas_per_node))
        return out

    @activity.defn(name="apply_spot_mix")
    def apply_spot_mix(self, req: ApplySpotMixInput) -> AppliedSpotMix:
        """Idempotent: every write sets a count. The versioned Deployment keeps the pod template and
        records the total (its own replicas go to 0: every replica is in a pool's Deployment or on-demand)."""
        ref, apps = req.deployment, self._kube.apps
        name = ref.versioned(req.version)
        original = self._as_dict(read_or_none(apps.read_namespaced_deployment, name, ref.namespace))
        if original is None:
            raise ApplicationError(f"Deployment {ref.namespace}/{name} not found", non_retryable=True)
        written: dict[str, int] = {}
        for pool, replicas in sorted(req.spot.items()):
            body = mix_manifest(original, pool, replicas)
            current = read_or_none(apps.read_namespaced_deployment, body["metadata"]["name"], ref.namespace)
            try:
                if current is None:
                    if replicas:
                        apps.create_namespaced_deployment(ref.namespace, body, _request_timeout=API_TIMEOUT)
                else:
                    apps.patch_namespaced_deployment_scale(
                        body["metadata"]["name"], ref.namespace, {"spec": {"replicas": replicas}}, _request_timeout=API_TIMEOUT
                    )
            except ApiException as exc:
                fail(exc, f"spot mix Deployment {ref.namespace}/{body['metadata']['name']}")
            written[body["metadata"]["name"]] = replicas
        key = naming.DeploymentRef(namespace=ref.namespace, name=name)

        def base(claims: dict[str, int]) -> dict[str, int]:
            return {k: v for k, v in claims.items() if k != MIX_CLAIMANT} | ({MIX_CLAIMANT: req.on_demand} if req.on_demand else {})

        fallback = self._write_fallback(key, base, req.capacity_type)
        written[fallback.name] = fallback.replicas
        patch = {"metadata": {"annotations": {MIX_TARGET_ANNOTATION: str(req.total)}}, "spec": {"replicas": 0}}
        try:
            apps.patch_namespaced_deployment(name, ref.namespace, patch, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            fail(exc, f"Deployment {ref.namespace}/{name}")
        written[name] = 0
        activity.logger.info("spot mix of %s/%s: total %d, %s", ref.namespace, name, req.total, written)
        return AppliedSpotMix(deployments=written)

    # ------------------------------------------------------------ EC2 Auto Scaling

    @activity.defn(name="sync_on_demand_pool")
    def sync_on_demand_pool(self, req: PoolInput) -> PoolState:
        """Desired capacity = base + one node per instance that still claims fallback replicas (the spot mix's base aside)."""
        fallbacks = self._kube.apps.list_deployment_for_all_namespaces(label_selector=FALLBACK_FOR, _request_timeout=API_TIMEOUT)
        # the spot mix's base is a standing need (the pool's own scaling serves it), not a reclaimed instance
        claimants = sorted({c for d in fallbacks.items for c in _claims(self._as_dict(d)) if c != MIX_CLAIMANT})
        group = self._aws.auto_scaling_group(req.asg)
        tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
        base = int(tags.get(POOL_BASE_TAG, group["DesiredCapacity"]))
        if claimants and POOL_BASE_TAG not in tags:
            self._aws.set_group_tag(req.asg, POOL_BASE_TAG, str(base))
        desired = min(group["MaxSize"], base + len(claimants))
        if desired != group["DesiredCapacity"]:
            self._aws.set_desired_capacity(req.asg, desired)
        if not claimants and POOL_BASE_TAG in tags:
            self._aws.delete_group_tag(req.asg, POOL_BASE_TAG)
        activity.logger.info("on-demand pool %s: desired %d (base %d, claimants %s)", req.asg, desired, base, claimants)
        return PoolState(desired=desired, base=base, claimants=claimants)


class SpotWorkflowStarts(contract.SpotWorkflowStarts):
    """Starts the workflows a spot workflow hands on to, through the activity's Temporal client."""

    @activity.defn(name="start_spot_reclaim")
    async def start_spot_reclaim(self, req: StartReclaimInput) -> StartedWorkflow:
        """Signal-with-start: a running SpotReclaim for the instance gets the notice, else one starts."""
        workflow_id = naming.spot_reclaim_workflow_id(req.notice.instance_id)
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

    @activity.defn(name="start_return_to_spot")
    async def start_return_to_spot(self, req: ReturnToSpotInput) -> StartedWorkflow:
        """Start the Deployment's ReturnToSpot unless one runs (it releases every claim on the fallback)."""
        workflow_id = naming.return_to_spot_workflow_id(req.deployment.namespace, req.deployment.name)
        await activity.client().start_workflow(
            ReturnToSpot.run,
            req,
            id=workflow_id,
            task_queue=activity.info().task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"return {req.deployment.namespace}/{req.deployment.name} to spot",
        )
        return StartedWorkflow(workflow_id=workflow_id)
