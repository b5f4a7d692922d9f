"""Spot-reclaim failover: notice intake, failover per instance, and the move back to spot.

- ``SpotInterruptionWatcher`` (id ``spot-watcher``): long-polls the SQS queue that EventBridge
  feeds, and for every actionable notice signal-with-starts ``SpotReclaim`` for that instance
  (id ``spot-reclaim/<instance-id>``), so duplicates and a rebalance followed by an interruption
  reach one workflow. A message is deleted only after that start succeeded; malformed and
  irrelevant messages are recorded and deleted. Continues as new to keep its history bounded.
- ``SpotReclaim``: node of the instance (``spec.providerID``) -> cordon -> count the serving
  replicas on it per versioned Deployment -> in parallel, bring the same number up on on-demand
  and drain the node through the Eviction API once they are Ready or the notice deadline is
  near. A rebalance recommendation pre-warms without draining. Capacity gap = seconds during
  which some affected Deployment had fewer Ready replicas (its own + its fallback's) than desired.
- ``ReturnToSpot`` (id ``return-to-spot/<namespace>/<name>``): once the spot Deployment is back
  at its desired Ready count and has stayed there for the stabilisation delay (doubling with each
  flap), removes the on-demand replacements and gives the on-demand pool its nodes back.

Replacement capacity (the decision): each versioned Deployment ``<name>`` gets a fallback
Deployment ``<name>-od`` (same pod template and serving labels, so its Service routes to it, plus
``nodeSelector karpenter.sh/capacity-type=on-demand``) whose replicas are the sum of per-instance
claims; when an on-demand pool ASG is configured, its desired capacity is its base plus one node
per claiming instance. The spot Deployment itself is not touched: the scaler keeps owning its
replicas, and its evicted pods come back on spot when spot capacity returns.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.spot.events import NoticeKind, SpotNotice
    from workflows.spot.policy import return_to_spot, stabilisation_delay

WATCHER_WORKFLOW_ID = "spot-watcher"

# Activity names (stable API: histories refer to them); implemented in activities/spot.py.
RECEIVE_SPOT_NOTICES = "receive_spot_notices"
DELETE_SPOT_MESSAGE = "delete_spot_message"
START_SPOT_RECLAIM = "start_spot_reclaim"
START_RETURN_TO_SPOT = "start_return_to_spot"
FIND_SPOT_NODE = "find_spot_node"
SET_NODE_UNSCHEDULABLE = "set_node_unschedulable"
SERVING_PODS_ON_NODE = "serving_pods_on_node"
CLAIM_SPOT_FALLBACK = "claim_spot_fallback"
RELEASE_SPOT_FALLBACK = "release_spot_fallback"
SYNC_ON_DEMAND_POOL = "sync_on_demand_pool"
EVICT_PODS = "evict_pods"
SPOT_REPLICA_COUNTS = "spot_replica_counts"


def return_to_spot_workflow_id(namespace: str, name: str) -> str:
    return f"return-to-spot/{namespace}/{name}"


# ---------------------------------------------------------------- activity contract


class FailoverPolicy(BaseModel):
    """How a failover runs; passed from the watcher to every SpotReclaim it starts."""

    on_demand_pool_asg: str | None = Field(
        None, description="Auto Scaling group of the on-demand GPU pool (None: capacity exists or Karpenter adds it)"
    )
    capacity_type: str = Field("on-demand", description="karpenter.sh/capacity-type of replacement nodes")
    drain_margin_seconds: float = Field(30, ge=0, description="drain this long before the deadline even if replacements are not Ready")
    poll_seconds: float = Field(5, gt=0)
    rebalance_hold_seconds: float = Field(3600, gt=0, description="keep a rebalance pre-warm this long waiting for an interruption")
    restore_timeout_seconds: float = Field(1800, gt=0, description="after the drain, measure the gap at most this long")
    stabilisation_seconds: float = Field(300, ge=0, description="spot healthy this long before moving back")
    max_stabilisation_seconds: float = Field(3600, ge=0)
    return_to_spot: bool = True


class ReceiveNoticesInput(BaseModel):
    queue_url: str | None = Field(None, description="None: settings().spot_queue_url")
    wait_seconds: int = Field(20, ge=0, le=20, description="SQS long-poll wait")
    max_messages: int = Field(10, ge=1, le=10)
    visibility_timeout_seconds: int = Field(60, ge=0, description="until an undeleted message is delivered again")


class ReceivedMessage(BaseModel):
    message_id: str
    receipt_handle: str
    notice: SpotNotice | None = None
    error: str | None = Field(None, description="why the body is malformed")


class ReceivedBatch(BaseModel):
    messages: list[ReceivedMessage] = Field(default_factory=list)


class DeleteMessageInput(BaseModel):
    queue_url: str | None = None
    receipt_handle: str


class StartReclaimInput(BaseModel):
    notice: SpotNotice
    policy: FailoverPolicy = Field(default_factory=FailoverPolicy)


class StartedWorkflow(BaseModel):
    workflow_id: str


class FindNodeInput(BaseModel):
    instance_id: str


class NodeInfo(BaseModel):
    name: str | None = Field(None, description="None: no node has this instance's provider ID")
    capacity_type: str | None = None
    zone: str | None = None
    unschedulable: bool = False


class UnschedulableInput(BaseModel):
    node: str
    unschedulable: bool = True


class NodeRef(BaseModel):
    node: str


class ServingPod(BaseModel):
    namespace: str
    name: str
    deployment: str = Field(description="the versioned Deployment, e.g. chat-v1-3-0")
    ready: bool


class PodsOnNode(BaseModel):
    pods: list[ServingPod] = Field(default_factory=list)


class DeploymentKey(BaseModel):
    namespace: str
    name: str = Field(description="the versioned (spot) Deployment")


class ClaimFallbackInput(BaseModel):
    deployment: DeploymentKey
    claimant: str = Field(description="instance ID whose lost replicas this claim replaces")
    replicas: int = Field(ge=0, description="0 removes the claim")
    capacity_type: str = "on-demand"


class FallbackState(BaseModel):
    name: str
    replicas: int
    claims: dict[str, int] = Field(default_factory=dict)


class ReleaseFallbackInput(BaseModel):
    deployment: DeploymentKey


class PoolInput(BaseModel):
    asg: str


class PoolState(BaseModel):
    desired: int
    base: int
    claimants: list[str] = Field(default_factory=list)


class PodRef(BaseModel):
    namespace: str
    name: str


class EvictInput(BaseModel):
    pods: list[PodRef]


class EvictResult(BaseModel):
    evicted: list[str] = Field(default_factory=list)
    gone: list[str] = Field(default_factory=list)
    blocked: list[str] = Field(default_factory=list, description="namespace/name refused by a PodDisruptionBudget (429)")


class CountsInput(BaseModel):
    deployments: list[DeploymentKey]


class ReplicaCounts(BaseModel):
    namespace: str
    name: str
    desired: int
    ready: int
    fallback_desired: int = 0
    fallback_ready: int = 0

    @property
    def short(self) -> bool:
        return self.ready + self.fallback_ready < self.desired


class CountsResult(BaseModel):
    counts: list[ReplicaCounts]


# ---------------------------------------------------------------- workflow I/O


class MalformedRecord(BaseModel):
    message_id: str
    error: str
    at: datetime


class WatcherStatus(BaseModel):
    polls: int = 0
    received: int = 0
    started: int = 0
    ignored: int = 0
    malformed: int = 0
    start_failures: int = 0
    recent_malformed: list[MalformedRecord] = Field(default_factory=list)
    last_error: str | None = None


class WatcherInput(BaseModel):
    queue_url: str | None = Field(None, description="None: the worker's settings().spot_queue_url")
    policy: FailoverPolicy = Field(default_factory=FailoverPolicy)
    wait_seconds: int = Field(20, ge=0, le=20)
    idle_seconds: float = Field(1, ge=0, description="pause after an empty poll")
    polls_per_run: int = Field(500, ge=1, description="continue as new after this many polls")
    status: WatcherStatus = Field(default_factory=WatcherStatus, description="carried over by continue-as-new")


class SpotReclaimInput(BaseModel):
    instance_id: str
    policy: FailoverPolicy = Field(default_factory=FailoverPolicy)
    notice: SpotNotice | None = Field(None, description="first notice when started without the 'notice' signal")


class AffectedDeployment(BaseModel):
    namespace: str
    name: str
    replicas_on_node: int
    desired: int = 0
    min_ready: int | None = Field(None, description="lowest own+fallback Ready count seen")


class ReclaimStatus(BaseModel):
    instance_id: str
    phase: str = "waiting"
    node: str | None = None
    notices: list[str] = Field(default_factory=list, description="kinds in arrival order")
    deadline: datetime | None = None
    warm: bool = Field(False, description="replacements were already claimed by a rebalance recommendation")
    affected: list[AffectedDeployment] = Field(default_factory=list)
    evicted: int = 0
    capacity_gap_seconds: float = 0.0
    replacement_ready_seconds: float | None = Field(None, description="first notice -> all replacements Ready")


class SpotReclaimResult(BaseModel):
    instance_id: str
    node: str | None
    outcome: str = Field(description="drained | no-node | no-managed-pods | rebalance-released")
    warm: bool
    replicas_moved: int
    evicted: int
    capacity_gap_seconds: float
    replacement_ready_seconds: float | None
    affected: list[AffectedDeployment]


class ReturnToSpotInput(BaseModel):
    deployment: DeploymentKey
    policy: FailoverPolicy = Field(default_factory=FailoverPolicy)
    healthy_since: datetime | None = Field(None, description="carried over by continue-as-new")
    flaps: int = 0


class ReturnToSpotResult(BaseModel):
    released_replicas: int
    flaps: int
    stabilisation_seconds: float


_QUICK = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10), maximum_attempts=5)
_PATIENT = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))


async def _act(name: str, arg: BaseModel, result_type: type | None = None, *, summary: str | None = None,
               seconds: float = 30, retry: RetryPolicy = _QUICK):
    return await workflow.execute_activity(
        name,
        arg,
        result_type=result_type,
        start_to_close_timeout=timedelta(seconds=seconds),
        retry_policy=retry,
        summary=summary,
    )


async def _wait(condition, seconds: float) -> None:
    """Wait until ``condition`` holds or ``seconds`` pass, whichever first."""
    try:
        await workflow.wait_condition(condition, timeout=max(seconds, 0.001))
    except TimeoutError:
        pass


# ---------------------------------------------------------------- watcher


@workflow.defn(name="SpotInterruptionWatcher")
class SpotInterruptionWatcher:
    """Turns EventBridge spot notices from SQS into SpotReclaim workflows, one per instance."""

    def __init__(self) -> None:
        self._status = WatcherStatus()
        self._stopping = False

    @workflow.run
    async def run(self, input: WatcherInput) -> WatcherStatus:
        self._status = input.status.model_copy(deep=True)
        receive = ReceiveNoticesInput(queue_url=input.queue_url, wait_seconds=input.wait_seconds)
        for _ in range(input.polls_per_run):
            if self._stopping:
                break
            batch: ReceivedBatch = await _act(
                RECEIVE_SPOT_NOTICES, receive, ReceivedBatch,
                seconds=input.wait_seconds + 30, retry=_PATIENT,
            )
            self._status.polls += 1
            self._status.received += len(batch.messages)
            await asyncio.gather(*(self._handle(input, m) for m in batch.messages))
            self._show()
            if workflow.info().is_continue_as_new_suggested():
                break
            if not batch.messages and input.idle_seconds:
                await _wait(lambda: self._stopping, input.idle_seconds)
        if self._stopping:
            return self._status
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(input.model_copy(update={"status": self._status}))

    async def _handle(self, input: WatcherInput, message: ReceivedMessage) -> None:
        notice = message.notice
        if message.error is not None:
            self._status.malformed += 1
            self._status.recent_malformed = [
                *self._status.recent_malformed[-19:],
                MalformedRecord(message_id=message.message_id, error=message.error, at=workflow.now()),
            ]
        elif notice is None or not notice.actionable:
            self._status.ignored += 1
        else:
            try:
                await _act(
                    START_SPOT_RECLAIM,
                    StartReclaimInput(notice=notice, policy=input.policy),
                    StartedWorkflow,
                    summary=f"{notice.kind} {notice.instance_id}",
                )
            except ActivityError as exc:
                # Not deleted: SQS delivers it again after the visibility timeout.
                self._status.start_failures += 1
                self._status.last_error = f"start for {notice.instance_id}: {exc.cause or exc}"
                return
            self._status.started += 1
        try:
            await _act(DELETE_SPOT_MESSAGE, DeleteMessageInput(queue_url=input.queue_url, receipt_handle=message.receipt_handle))
        except ActivityError as exc:
            self._status.last_error = f"delete {message.message_id}: {exc.cause or exc}"

    def _show(self) -> None:
        s = self._status
        lines = [
            (f"**polls** {s.polls} · **received** {s.received} · **failovers started/joined** {s.started}"
             f" · **ignored** {s.ignored} · **malformed** {s.malformed} · **start failures** {s.start_failures}"),
        ]
        if s.recent_malformed:
            last = s.recent_malformed[-1]
            lines.append(f"last malformed: `{last.message_id}`: {last.error}")
        if s.last_error:
            lines.append(f"last error: {s.last_error}")
        workflow.set_current_details("\n\n".join(lines))

    @workflow.query(name="status")
    def status(self) -> WatcherStatus:
        return self._status

    @workflow.signal(name="stop")
    def stop(self) -> None:
        """Finish after the current poll instead of continuing."""
        self._stopping = True


# ---------------------------------------------------------------- failover per instance


@workflow.defn(name="SpotReclaim")
class SpotReclaim:
    """Fail one spot instance's replicas over to on-demand before (or as) it is reclaimed."""

    def __init__(self) -> None:
        self._pending: list[SpotNotice] = []
        self._seen: set[str] = set()
        self._status: ReclaimStatus | None = None
        self._interrupted = False
        self._last_sample: datetime | None = None
        self._was_short = False

    @workflow.signal(name="notice")
    def notice(self, notice: SpotNotice) -> None:
        """Another EventBridge notice about this instance (duplicates are dropped by event id)."""
        if notice.event_id not in self._seen:
            self._seen.add(notice.event_id)
            self._pending.append(notice)

    @workflow.query(name="status")
    def status(self) -> ReclaimStatus | None:
        return self._status

    @workflow.run
    async def run(self, input: SpotReclaimInput) -> SpotReclaimResult:
        policy = input.policy
        self._status = st = ReclaimStatus(instance_id=input.instance_id)
        if input.notice is not None:
            self.notice(input.notice)
        await workflow.wait_condition(lambda: bool(self._pending))
        started = workflow.now()
        self._take_notices()
        st.phase = "cordoning"
        self._show()

        node: NodeInfo = await _act(FIND_SPOT_NODE, FindNodeInput(instance_id=input.instance_id), NodeInfo)
        if node.name is None:
            return self._finish("no-node")
        st.node = node.name
        await _act(SET_NODE_UNSCHEDULABLE, UnschedulableInput(node=node.name), summary=f"cordon {node.name}")
        pods: PodsOnNode = await _act(SERVING_PODS_ON_NODE, NodeRef(node=node.name), PodsOnNode)
        per_deployment: dict[tuple[str, str], int] = {}
        for pod in pods.pods:
            key = (pod.namespace, pod.deployment)
            per_deployment[key] = per_deployment.get(key, 0) + 1
        if not per_deployment:
            return self._finish("no-managed-pods")
        st.affected = [AffectedDeployment(namespace=ns, name=n, replicas_on_node=c) for (ns, n), c in sorted(per_deployment.items())]
        keys = [DeploymentKey(namespace=a.namespace, name=a.name) for a in st.affected]

        # Replacement capacity: claims on the fallback Deployments, nodes from the on-demand pool.
        st.phase = "replacing"
        st.warm = not self._interrupted
        self._show()
        await asyncio.gather(*(
            _act(CLAIM_SPOT_FALLBACK,
                 ClaimFallbackInput(deployment=k, claimant=input.instance_id, replicas=a.replicas_on_node,
                                    capacity_type=policy.capacity_type),
                 FallbackState, summary=f"{k.namespace}/{k.name}: +{a.replicas_on_node} on {policy.capacity_type}")
            for k, a in zip(keys, st.affected)
        ))
        if policy.on_demand_pool_asg:
            await _act(SYNC_ON_DEMAND_POOL, PoolInput(asg=policy.on_demand_pool_asg), PoolState)

        # Wait for the replacements, the deadline, or (rebalance only) the end of the hold.
        hold_until = workflow.now() + timedelta(seconds=policy.rebalance_hold_seconds)
        while True:
            counts = await self._sample(keys)
            replaced = all(c.fallback_ready >= a.replicas_on_node for c, a in zip(counts, st.affected))
            if replaced and st.replacement_ready_seconds is None:
                st.replacement_ready_seconds = (workflow.now() - started).total_seconds()
            if self._interrupted:
                assert st.deadline is not None
                left = (st.deadline - workflow.now()).total_seconds()
                if replaced or left <= policy.drain_margin_seconds:
                    break
                wait = min(policy.poll_seconds, max(0.0, left - policy.drain_margin_seconds))
            else:
                if workflow.now() >= hold_until:
                    return await self._release(input.instance_id, keys, node.name, policy)
                wait = policy.poll_seconds
            self._show()
            await _wait(lambda: bool(self._pending), wait)
            self._take_notices()

        # Drain through the Eviction API; a PodDisruptionBudget may refuse until the deadline.
        st.phase = "draining"
        self._show()
        if st.warm:  # pods may have changed during a long rebalance hold
            pods = await _act(SERVING_PODS_ON_NODE, NodeRef(node=node.name), PodsOnNode)
        remaining = [PodRef(namespace=p.namespace, name=p.name) for p in pods.pods]
        while remaining:
            evicted: EvictResult = await _act(EVICT_PODS, EvictInput(pods=remaining), EvictResult,
                                              summary=f"evict {len(remaining)} pods from {node.name}")
            st.evicted += len(evicted.evicted)
            remaining = [p for p in remaining if f"{p.namespace}/{p.name}" in evicted.blocked]
            assert st.deadline is not None
            if not remaining or workflow.now() >= st.deadline:
                break
            await workflow.sleep(policy.poll_seconds)
            await self._sample(keys)

        # Keep measuring until every affected Deployment is back at its desired Ready count.
        st.phase = "restoring"
        self._show()
        restore_until = workflow.now() + timedelta(seconds=policy.restore_timeout_seconds)
        while True:
            counts = await self._sample(keys)
            if all(c.fallback_ready >= a.replicas_on_node for c, a in zip(counts, st.affected)) and st.replacement_ready_seconds is None:
                st.replacement_ready_seconds = (workflow.now() - started).total_seconds()
            if not any(c.short for c in counts) or workflow.now() >= restore_until:
                break
            self._show()
            await workflow.sleep(policy.poll_seconds)

        if policy.return_to_spot:
            # Not a child: it outlives this workflow, and one per Deployment serves every reclaim.
            await asyncio.gather(*(
                _act(START_RETURN_TO_SPOT, ReturnToSpotInput(deployment=k, policy=policy), StartedWorkflow,
                     summary=f"return {k.namespace}/{k.name} to spot")
                for k in keys
            ))
        return self._finish("drained")

    async def _sample(self, keys: list[DeploymentKey]) -> list[ReplicaCounts]:
        """Read Ready counts; the time since the last sample counts as gap if that sample was short."""
        st = self._status
        assert st is not None
        result: CountsResult = await _act(SPOT_REPLICA_COUNTS, CountsInput(deployments=keys), CountsResult)
        now = workflow.now()
        if self._last_sample is not None and self._was_short:
            st.capacity_gap_seconds += (now - self._last_sample).total_seconds()
        self._last_sample = now
        self._was_short = any(c.short for c in result.counts)
        for c, a in zip(result.counts, st.affected):
            a.desired = c.desired
            total = c.ready + c.fallback_ready
            a.min_ready = total if a.min_ready is None else min(a.min_ready, total)
        return result.counts

    def _take_notices(self) -> None:
        st = self._status
        assert st is not None
        for n in self._pending:
            st.notices.append(n.kind.value if n.kind != NoticeKind.STATE_CHANGE else f"state:{n.state}")
            if n.kind == NoticeKind.REBALANCE:
                continue
            self._interrupted = True
            deadline = n.deadline()
            if st.deadline is None or deadline < st.deadline:
                st.deadline = deadline
        self._pending.clear()

    async def _release(self, instance_id: str, keys: list[DeploymentKey], node: str, policy: FailoverPolicy) -> SpotReclaimResult:
        """A rebalance that was not followed by an interruption: give the pre-warm back, uncordon."""
        await asyncio.gather(*(
            _act(CLAIM_SPOT_FALLBACK, ClaimFallbackInput(deployment=k, claimant=instance_id, replicas=0,
                                                         capacity_type=policy.capacity_type), FallbackState)
            for k in keys
        ))
        if policy.on_demand_pool_asg:
            await _act(SYNC_ON_DEMAND_POOL, PoolInput(asg=policy.on_demand_pool_asg), PoolState)
        await _act(SET_NODE_UNSCHEDULABLE, UnschedulableInput(node=node, unschedulable=False), summary=f"uncordon {node}")
        return self._finish("rebalance-released")

    def _finish(self, outcome: str) -> SpotReclaimResult:
        st = self._status
        assert st is not None
        st.phase = outcome
        self._show()
        return SpotReclaimResult(
            instance_id=st.instance_id,
            node=st.node,
            outcome=outcome,
            warm=st.warm,
            replicas_moved=sum(a.replicas_on_node for a in st.affected),
            evicted=st.evicted,
            capacity_gap_seconds=st.capacity_gap_seconds,
            replacement_ready_seconds=st.replacement_ready_seconds,
            affected=st.affected,
        )

    def _show(self) -> None:
        st = self._status
        assert st is not None
        lines = [f"**{st.phase}** `{st.instance_id}` node `{st.node or '?'}` · notices: {', '.join(st.notices) or '-'}"]
        if st.deadline:
            lines.append(f"deadline {st.deadline:%H:%M:%S} UTC" + (" · started warm (rebalance)" if st.warm and self._interrupted else ""))
        for a in st.affected:
            lines.append(f"- {a.namespace}/{a.name}: {a.replicas_on_node} on node, desired {a.desired}, lowest Ready {a.min_ready}")
        lines.append(f"capacity gap **{st.capacity_gap_seconds:.0f} s** · evicted {st.evicted}")
        workflow.set_current_details("\n\n".join(lines))


# ---------------------------------------------------------------- back to spot


@workflow.defn(name="ReturnToSpot")
class ReturnToSpot:
    """Remove a Deployment's on-demand replacements once its spot replicas are back and stable."""

    @workflow.run
    async def run(self, input: ReturnToSpotInput) -> ReturnToSpotResult:
        policy = input.policy
        healthy_since, flaps = input.healthy_since, input.flaps
        while True:
            counts: CountsResult = await _act(SPOT_REPLICA_COUNTS, CountsInput(deployments=[input.deployment]), CountsResult)
            c = counts.counts[0]
            now = workflow.now()
            delay = stabilisation_delay(policy.stabilisation_seconds, flaps, policy.max_stabilisation_seconds)
            if c.fallback_desired == 0:
                return ReturnToSpotResult(released_replicas=0, flaps=flaps, stabilisation_seconds=delay)
            healthy = c.ready >= c.desired
            if healthy and healthy_since is None:
                healthy_since = now
            elif not healthy and healthy_since is not None:
                flaps += 1
                healthy_since = None
            since = healthy_since.timestamp() if healthy_since else None
            if return_to_spot(since, now.timestamp(), delay):
                released: FallbackState = await _act(
                    RELEASE_SPOT_FALLBACK, ReleaseFallbackInput(deployment=input.deployment), FallbackState,
                    summary=f"{input.deployment.name}: on-demand replacements down",
                )
                if policy.on_demand_pool_asg:
                    await _act(SYNC_ON_DEMAND_POOL, PoolInput(asg=policy.on_demand_pool_asg), PoolState)
                workflow.set_current_details(f"back on spot: released {released.replicas} on-demand replicas")
                return ReturnToSpotResult(released_replicas=released.replicas, flaps=flaps, stabilisation_seconds=delay)
            state = f"healthy for {(now - healthy_since).total_seconds():.0f}/{delay:.0f} s" if healthy_since else "waiting for spot capacity"
            workflow.set_current_details(
                f"**{input.deployment.namespace}/{input.deployment.name}**: spot Ready {c.ready}/{c.desired},"
                f" on-demand {c.fallback_ready}/{c.fallback_desired} · {state} · flaps {flaps}"
            )
            if workflow.info().is_continue_as_new_suggested():
                workflow.continue_as_new(input.model_copy(update={"healthy_since": healthy_since, "flaps": flaps}))
            await workflow.sleep(policy.poll_seconds)


WORKFLOWS = [SpotInterruptionWatcher, SpotReclaim, ReturnToSpot]
