"""Side effects of spot failover: SQS notices, node cordon and drain, on-demand replacements.

- SQS: long-poll EventBridge's queue (parsed with workflows.spot.events), delete handled messages.
- Kubernetes: node by ``spec.providerID``, cordon, serving pods on a node, the policy/v1 Eviction
  API, Ready counts, and the fallback Deployment ``<name>-od`` whose replicas are the sum of
  per-instance claims (annotation), so a retried or repeated claim converges instead of adding twice.
- EC2 Auto Scaling: the on-demand pool's desired capacity = its base (a tag written when the first
  claim appears) + one node per claiming instance, recomputed from the cluster each time.

Starting the spot workflows is spot_workflow_starts.py; the spot mix's side effects are
spot_mix_activities.py; the fallback and mix Deployments they write are fallback_deployments.py.
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.aws import AwsClient
from activities.clients.kube import API_TIMEOUT, KubeClient, fail, is_ready, label_selector, read_or_none
from activities.core.deployments import version_replicas
from activities.spot.fallback_deployments import (
    FALLBACK_FOR,
    POOL_BASE_TAG,
    _versioned,
    as_dict,
    claims_of,
    fallback_name,
    write_fallback,
)
from workflows.core import naming
from workflows.spot import contract
from workflows.spot.contract import (
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
    ServingPod,
    SpotNode,
    UnschedulableInput,
)
from workflows.spot.events import MalformedEvent, instance_id_from_provider_id, parse_event
from workflows.spot.mix import MIX_CLAIMANT


class SpotActivities(contract.SpotActivities):
    """The spot workflows' side effects on SQS, one cluster and EC2 Auto Scaling."""

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

    @activity.defn(name="claim_spot_fallback")
    def claim_spot_fallback(self, req: ClaimFallbackInput) -> FallbackClaims:
        """Set (not add) this instance's claim of on-demand replicas; 0 withdraws it."""

        def update(claims: dict[str, int]) -> dict[str, int]:
            claims = {k: v for k, v in claims.items() if k != req.claimant}
            return claims | ({req.claimant: req.replicas} if req.replicas else {})

        return write_fallback(self._kube, req.deployment, update, req.capacity_type)

    @activity.defn(name="release_spot_fallback")
    def release_spot_fallback(self, req: ReleaseFallbackInput) -> FallbackClaims:
        """Withdraw every reclaim's claim (the spot mix's on-demand base stays). Returns what was released."""
        released: dict[str, int] = {}

        def update(claims: dict[str, int]) -> dict[str, int]:
            released.clear()
            released.update({k: v for k, v in claims.items() if k != MIX_CLAIMANT})
            return {k: v for k, v in claims.items() if k == MIX_CLAIMANT}

        state = write_fallback(self._kube, req.deployment, update, "on-demand")
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
            held = version_replicas(self._kube, original)
            counts.append(ReplicaCounts(
                namespace=key.namespace,
                name=key.name,
                # under a spot mix: what spot must hold Ready for the total, the on-demand base aside
                desired=max(0, held.total - held.on_demand_base) if held.mixed else held.own,
                ready=sum(1 for p in ready if FALLBACK_FOR not in (p.metadata.labels or {})),
                fallback_desired=(fallback.spec.replicas or 0) if fallback else 0,
                fallback_ready=sum(1 for p in ready if (p.metadata.labels or {}).get(FALLBACK_FOR) == key.name),
            ))
        return CountsResult(counts=counts)

    # ------------------------------------------------------------ EC2 Auto Scaling

    @activity.defn(name="sync_on_demand_pool")
    def sync_on_demand_pool(self, req: PoolInput) -> PoolState:
        """Desired capacity = base + one node per instance that still claims fallback replicas (the spot mix's base aside)."""
        fallbacks = self._kube.apps.list_deployment_for_all_namespaces(label_selector=FALLBACK_FOR, _request_timeout=API_TIMEOUT)
        # the spot mix's base is a standing need (the pool's own scaling serves it), not a reclaimed instance
        claimants = sorted({c for d in fallbacks.items for c in claims_of(as_dict(self._kube, d)) if c != MIX_CLAIMANT})
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


