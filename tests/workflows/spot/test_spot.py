"""Spot failover workflows on Temporal's time-skipping server, with stub cluster/cloud activities.

The stubs are a ``FakeFleet``, the SpotActivities contract over an in-memory fleet: one spot node
with a few serving replicas, replacement pods that become Ready a configurable (virtual) time
after they are claimed, evictions that take the node's replicas away. Time in the fake is the
server's virtual clock (the activity's scheduled time), so a 2-minute notice and a 5-minute load
take milliseconds. ``SpotWorkflowStarts`` is the real activity class: it signal-with-starts
SpotReclaim and starts ReturnToSpot through the worker's client.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.worker import Worker

from activities.spot.spot_workflow_starts import SpotWorkflowStarts
from workers.worker import activity_methods
from workflows.core.naming import DeploymentRef, return_to_spot_workflow_id, spot_reclaim_workflow_id
from workflows.spot.contract import (
    ClaimFallbackInput,
    CountsInput,
    CountsResult,
    DeleteMessageInput,
    EvictInput,
    EvictResult,
    FailoverNotice,
    FailoverPolicy,
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
    SpotActivities,
    SpotNode,
    StartedWorkflow,
    StartReclaimInput,
    UnschedulableInput,
)
from workflows.spot.events import NoticeKind, SpotNotice, build_event, parse_event
from workflows.spot.policy import on_demand_needed, on_demand_target
from workflows.spot.reclaim import SpotReclaim, SpotReclaimInput, SpotReclaimResult
from workflows.spot.return_to_spot import ReturnToSpot, ReturnToSpotResult
from workflows.spot.watcher import SpotInterruptionWatcher, WatcherInput, WatcherStatus

INSTANCE = "i-0123456789abcdef0"
NODE = "ip-10-0-1-7.ec2.internal"
NS = "llm-serving"
DEP = "chat-v1-3-0"
POOL = "gpu-spot"
WORKFLOWS = [SpotInterruptionWatcher, SpotReclaim, ReturnToSpot]
POLICY = FailoverPolicy(poll_seconds=5, drain_margin_seconds=30, return_to_spot=False, stabilisation_seconds=300)


class FakeFleet(SpotActivities):
    """The cluster and the cloud as the stub activities see and change them."""

    def __init__(self, replicas_on_node: int = 2, desired: int = 4, ready_delay: float = 60, node: str | None = NODE):
        self.node = node
        self.pods = [ServingPod(namespace=NS, name=f"{DEP}-{i}", deployment=DEP, ready=True) for i in range(replicas_on_node)]
        self.desired = desired
        self.own_ready = desired
        self.ready_delay = ready_delay
        self.claims: dict[str, int] = {}
        self.claimed_at: datetime | None = None
        self.cordoned: bool | None = None
        self.calls: list[tuple[str, datetime]] = []
        self.evicted: list[str] = []
        # SQS stand-in: message id -> body; receive returns every undeleted message
        self.queue: dict[str, str] = {}
        self.log: list[str] = []
        self.fail_start_once: set[str] = set()
        self.notices: list[FailoverNotice] = []
        self.notices_refused = False

    def now(self) -> datetime:
        return activity.info().current_attempt_scheduled_time

    def fallback_ready(self) -> int:
        wanted = sum(self.claims.values())
        if not wanted or self.claimed_at is None:
            return 0
        return wanted if (self.now() - self.claimed_at).total_seconds() >= self.ready_delay else 0

    @activity.defn(name="receive_spot_notices")
    async def receive_spot_notices(self, req: ReceiveNoticesInput) -> ReceivedBatch:
        batch = ReceivedBatch()
        for mid, body in list(self.queue.items()):
            m = ReceivedMessage(message_id=mid, receipt_handle=f"rh-{mid}")
            try:
                m.notice = parse_event(body)
            except ValueError as exc:
                m.error = str(exc)
            batch.messages.append(m)
        return batch

    @activity.defn(name="delete_spot_message")
    async def delete_spot_message(self, req: DeleteMessageInput) -> None:
        mid = req.receipt_handle.removeprefix("rh-")
        self.log.append(f"delete:{mid}")
        self.queue.pop(mid, None)

    @activity.defn(name="find_spot_node")
    async def find_spot_node(self, req: FindNodeInput) -> SpotNode:
        self.calls.append(("find", self.now()))
        return SpotNode(name=self.node if req.instance_id == INSTANCE else None, pool=POOL, capacity_type="spot")

    @activity.defn(name="set_node_unschedulable")
    async def set_node_unschedulable(self, req: UnschedulableInput) -> None:
        self.calls.append(("cordon" if req.unschedulable else "uncordon", self.now()))
        self.cordoned = req.unschedulable

    @activity.defn(name="serving_pods_on_node")
    async def serving_pods_on_node(self, req: NodeRef) -> PodsOnNode:
        return PodsOnNode(pods=[p for p in self.pods if f"{p.namespace}/{p.name}" not in self.evicted])

    @activity.defn(name="claim_spot_fallback")
    async def claim_spot_fallback(self, req: ClaimFallbackInput) -> FallbackClaims:
        self.calls.append((f"claim:{req.replicas}", self.now()))
        if req.replicas:
            if req.claimant not in self.claims:
                self.claimed_at = self.now()
            self.claims[req.claimant] = req.replicas
        else:
            self.claims.pop(req.claimant, None)
        return FallbackClaims(name=f"{DEP}-od", replicas=sum(self.claims.values()), claims=dict(self.claims))

    @activity.defn(name="release_spot_fallback")
    async def release_spot_fallback(self, req: ReleaseFallbackInput) -> FallbackClaims:
        self.calls.append(("release", self.now()))
        released, self.claims = dict(self.claims), {}
        return FallbackClaims(name=f"{DEP}-od", replicas=sum(released.values()), claims=released)

    @activity.defn(name="evict_pods")
    async def evict_pods(self, req: EvictInput) -> EvictResult:
        self.calls.append(("evict", self.now()))
        result = EvictResult()
        for p in req.pods:
            ref = f"{p.namespace}/{p.name}"
            if ref in self.evicted:
                result.gone.append(ref)
            else:
                self.evicted.append(ref)
                self.own_ready -= 1  # the spot capacity is gone: its replicas do not come back yet
                result.evicted.append(ref)
        return result

    @activity.defn(name="spot_replica_counts")
    async def spot_replica_counts(self, req: CountsInput) -> CountsResult:
        return CountsResult(counts=[
            ReplicaCounts(namespace=k.namespace, name=k.name, desired=self.desired, ready=self.own_ready,
                          fallback_desired=sum(self.claims.values()), fallback_ready=self.fallback_ready())
            for k in req.deployments
        ])

    @activity.defn(name="sync_on_demand_pool")
    async def sync_on_demand_pool(self, req: PoolInput) -> PoolState:
        self.calls.append((f"pool:{len(self.claims)}", self.now()))
        return PoolState(desired=2 + len(self.claims), base=2, claimants=sorted(self.claims))

    @activity.defn(name="notify_spot_failover")
    async def notify_spot_failover(self, notice: FailoverNotice) -> None:
        if self.notices_refused:
            raise ApplicationError("notification webhook refused the notice: HTTP 403", non_retryable=True)
        self.notices.append(notice)

    def count(self, name: str) -> int:
        return sum(1 for c, _ in self.calls if c == name)


class FakeStarts(SpotWorkflowStarts):
    """Starting SpotReclaim is faked (and can fail once per event); ReturnToSpot starts for real."""

    def __init__(self, fake: FakeFleet):
        self.fake = fake

    @activity.defn(name="start_spot_reclaim")
    async def start_spot_reclaim(self, req: StartReclaimInput) -> StartedWorkflow:
        if req.notice.event_id in self.fake.fail_start_once:
            self.fake.fail_start_once.discard(req.notice.event_id)
            self.fake.log.append(f"start-failed:{req.notice.event_id}")
            raise ApplicationError("temporal unavailable", non_retryable=True)
        self.fake.log.append(f"started:{req.notice.event_id}")
        return StartedWorkflow(workflow_id=spot_reclaim_workflow_id(req.notice.instance_id))


def _worker(env, fake: FakeFleet, real_start: bool = False) -> Worker:
    starts = SpotWorkflowStarts() if real_start else FakeStarts(fake)
    return Worker(
        env.client,
        task_queue=f"spot-{uuid.uuid4()}",
        workflows=WORKFLOWS,
        activities=[*activity_methods(fake, SpotActivities), fake.notify_spot_failover, starts.start_spot_reclaim, starts.start_return_to_spot],
    )


def _notice(kind: NoticeKind, at: datetime, event_id: str | None = None, **kw) -> SpotNotice:
    return parse_event(build_event(kind, INSTANCE, event_id=event_id or str(uuid.uuid4()), time=at, **kw))


async def _signal_start(env, worker: Worker, notice: SpotNotice, policy: FailoverPolicy = POLICY) -> WorkflowHandle:
    return await env.client.start_workflow(
        SpotReclaim.run,
        SpotReclaimInput(instance_id=notice.instance_id, policy=policy),
        id=f"{spot_reclaim_workflow_id(notice.instance_id)}-{uuid.uuid4()}",
        task_queue=worker.task_queue,
        start_signal="notice",
        start_signal_args=[notice],
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


async def _result(env, handle: WorkflowHandle):
    """Await a handle not made by start_workflow (those skip time on their own)."""
    async with env.time_skipping_unlocked():
        return await handle.result()


async def test_duplicate_notices_through_the_watcher_give_one_failover(time_skipping_env):
    env = time_skipping_env
    fake = FakeFleet(replicas_on_node=2, ready_delay=30)
    now = await env.get_current_time()
    body = json.dumps(build_event(NoticeKind.INTERRUPTION, INSTANCE, event_id="evt-1", time=now))
    # SQS redelivers the same event, and EventBridge may emit a second warning for the instance.
    fake.queue = {"m1": body, "m2": body, "m3": json.dumps(build_event(NoticeKind.INTERRUPTION, INSTANCE, event_id="evt-2", time=now))}
    async with _worker(env, fake, real_start=True) as worker:
        watcher = await env.client.start_workflow(
            SpotInterruptionWatcher.run,
            WatcherInput(policy=POLICY, idle_seconds=5),
            id=f"spot-watcher-{uuid.uuid4()}",
            task_queue=worker.task_queue,
        )
        reclaim = env.client.get_workflow_handle(spot_reclaim_workflow_id(INSTANCE), result_type=SpotReclaimResult)
        for _ in range(100):
            if not fake.queue:
                break
            await asyncio.sleep(0.05)
        assert not fake.queue, "every message deleted once its start succeeded"
        result: SpotReclaimResult = await _result(env, reclaim)
        await watcher.signal(SpotInterruptionWatcher.stop)
        status: WatcherStatus = await watcher.result()

    assert result.outcome == "drained" and result.node == NODE
    assert fake.count("claim:2") == 1, "one failover: replacement capacity claimed once"
    assert fake.count("evict") == 1 and len(fake.evicted) == 2
    assert status.started == 1 and status.duplicates == 2 and status.malformed == 0
    assert result.capacity_gap_seconds == 0, "replacements were Ready before the drain"


async def test_rebalance_then_interruption_starts_warm(time_skipping_env):
    env = time_skipping_env
    fake = FakeFleet(replicas_on_node=3, ready_delay=60)
    async with _worker(env, fake) as worker:
        t0 = await env.get_current_time()
        handle = await _signal_start(env, worker, _notice(NoticeKind.REBALANCE, t0))
        await env.sleep(120)  # the rebalance window: pre-warm, no drain
        status = await handle.query(SpotReclaim.status)
        assert status.phase == "replacing" and status.warm
        assert fake.cordoned is True and fake.count("claim:3") == 1
        assert fake.count("evict") == 0 and not fake.evicted, "a rebalance recommendation never drains"
        t1 = await env.get_current_time()
        interruption = _notice(NoticeKind.INTERRUPTION, t1)
        await handle.signal(SpotReclaim.notice, interruption)
        result = await handle.result()

    assert result.outcome == "drained" and result.warm
    assert fake.count("claim:3") == 1, "the interruption continued from the warm position"
    evicted_at = next(t for c, t in fake.calls if c == "evict")
    assert (evicted_at - t1).total_seconds() <= POLICY.poll_seconds + 1, "replacements were warm: drain at once"
    assert result.capacity_gap_seconds == 0
    assert result.replacement_ready_seconds is not None and result.replacement_ready_seconds <= 60 + POLICY.poll_seconds


@pytest.mark.parametrize("hold", [None, 600])
async def test_rebalance_without_interruption_is_released(time_skipping_env, hold):
    """By default the pre-warm is held for the stabilisation delay (it was an hour), or as configured."""
    env = time_skipping_env
    fake = FakeFleet(replicas_on_node=1)
    policy = POLICY.model_copy(update={"rebalance_hold_seconds": hold})
    async with _worker(env, fake) as worker:
        t0 = await env.get_current_time()
        handle = await _signal_start(env, worker, _notice(NoticeKind.REBALANCE, t0), policy)
        result = await handle.result()
    assert result.outcome == "rebalance-released"
    assert fake.claims == {} and fake.cordoned is False and not fake.evicted
    assert fake.notices == [], "nothing moved: no one is told of a failover"
    held = (next(t for c, t in fake.calls if c == "uncordon") - t0).total_seconds()
    expected = hold or POLICY.stabilisation_seconds
    assert expected <= held <= expected + 2 * POLICY.poll_seconds


async def test_repeated_notices_for_a_node_without_pods_start_one_reclaim(time_skipping_env):
    """Issue 20: 50 copies of a notice (over several polls) for a node with no tideplane pods: one reclaim run."""
    env = time_skipping_env
    fake = FakeFleet(replicas_on_node=0)
    now = await env.get_current_time()
    async with _worker(env, fake, real_start=True) as worker:
        watcher = await env.client.start_workflow(
            SpotInterruptionWatcher.run,
            WatcherInput(policy=POLICY, idle_seconds=1),
            id=f"spot-watcher-{uuid.uuid4()}",
            task_queue=worker.task_queue,
        )
        for poll in range(5):  # the first reclaim finishes ('no-managed-pods') between the polls
            fake.queue = {
                f"m{poll}-{i}": json.dumps(build_event(NoticeKind.INTERRUPTION, INSTANCE, event_id=f"evt-{poll}-{i}", time=now))
                for i in range(10)
            }
            for _ in range(200):
                if not fake.queue:
                    break
                await asyncio.sleep(0.05)
            assert not fake.queue
            await env.sleep(2)
        await watcher.signal(SpotInterruptionWatcher.stop)
        status: WatcherStatus = await watcher.result()
    assert fake.count("find") == 1, "one SpotReclaim run looked the node up"
    assert status.started == 1 and status.duplicates == 49


async def test_interruption_for_a_node_without_managed_pods(time_skipping_env):
    env = time_skipping_env
    fake = FakeFleet(replicas_on_node=0)
    async with _worker(env, fake) as worker:
        handle = await _signal_start(env, worker, _notice(NoticeKind.INTERRUPTION, await env.get_current_time()))
        result = await handle.result()
    assert result.outcome == "no-managed-pods" and result.replicas_moved == 0
    assert fake.cordoned is True, "still cordoned so nothing new lands on a dying node"
    assert fake.claims == {} and fake.count("evict") == 0


async def test_interruption_for_an_unknown_instance(time_skipping_env):
    env = time_skipping_env
    fake = FakeFleet(node=None)
    async with _worker(env, fake) as worker:
        handle = await _signal_start(env, worker, _notice(NoticeKind.INTERRUPTION, await env.get_current_time()))
        result = await handle.result()
    assert result.outcome == "no-node" and fake.cordoned is None


async def test_replacement_slower_than_the_notice_records_the_gap_and_returns_to_spot(time_skipping_env):
    env = time_skipping_env
    fake = FakeFleet(replicas_on_node=2, desired=4, ready_delay=300)
    policy = POLICY.model_copy(update={"return_to_spot": True})
    async with _worker(env, fake) as worker:
        t0 = await env.get_current_time()
        handle = await _signal_start(env, worker, _notice(NoticeKind.INTERRUPTION, t0), policy)
        result = await handle.result()

        assert result.outcome == "drained" and not result.warm
        evicted_at = next(t for c, t in fake.calls if c == "evict")
        drain_at = (evicted_at - t0).total_seconds()
        assert 120 - 30 - policy.poll_seconds <= drain_at <= 120 - 30 + 1, "drained at the deadline margin, not at the 300 s load"
        # gap: from the drain until the 300 s replacements were Ready, sampled every poll
        assert 300 - drain_at - 1 <= result.capacity_gap_seconds <= 300 - drain_at + 2 * policy.poll_seconds
        assert result.affected[0].min_ready == 2, "never below desired minus the node's replicas"
        # nothing lost: every pod went through eviction, and the replacements made the fleet whole
        assert sorted(fake.evicted) == [f"{NS}/{DEP}-0", f"{NS}/{DEP}-1"]
        assert fake.own_ready + fake.claims[INSTANCE] == fake.desired

        # spot capacity returns: ReturnToSpot waits out the stabilisation, then removes the fallback
        back = env.client.get_workflow_handle(return_to_spot_workflow_id(NS, DEP), result_type=ReturnToSpotResult)
        await env.sleep(60)
        assert fake.claims, "no move back while spot is still short"
        fake.own_ready = fake.desired
        back_result = await _result(env, back)
    assert back_result.released_replicas == 2 and back_result.flaps == 0 and fake.claims == {}
    released_at = next(t for c, t in fake.calls if c == "release")
    assert (released_at - evicted_at).total_seconds() >= 60 + policy.stabilisation_seconds


async def test_a_drained_failover_tells_each_affected_deployment_what_moved(time_skipping_env):
    """One notice per Deployment whose replicas were on the node (an Event on it, the webhook), after the drain."""
    env = time_skipping_env
    fake = FakeFleet(replicas_on_node=2, desired=4, ready_delay=300)
    fake.pods.append(ServingPod(namespace=NS, name="embed-v1-0-0-0", deployment="embed-v1-0-0", ready=True))
    async with _worker(env, fake) as worker:
        handle = await _signal_start(env, worker, _notice(NoticeKind.INTERRUPTION, await env.get_current_time()))
        result = await handle.result()
    assert result.outcome == "drained"
    moved = {(n.deployment, n.replicas_moved, n.seq) for n in fake.notices}
    assert moved == {("chat-v1-3-0", 2, 1), ("embed-v1-0-0", 1, 2)}
    for n in fake.notices:
        assert (n.namespace, n.instance_id, n.node, n.pool, n.capacity_type) == (NS, INSTANCE, NODE, POOL, "on-demand")
        assert n.capacity_gap_seconds == result.capacity_gap_seconds > 0, "the 300 s replacements left a gap"
        assert n.replacement_ready_seconds == result.replacement_ready_seconds
        assert n.workflow_id == handle.id and n.run_id


async def test_a_refused_notice_does_not_fail_the_failover(time_skipping_env):
    env = time_skipping_env
    fake = FakeFleet()
    fake.notices_refused = True
    async with _worker(env, fake) as worker:
        handle = await _signal_start(env, worker, _notice(NoticeKind.INTERRUPTION, await env.get_current_time()))
        result = await handle.result()
    assert result.outcome == "drained" and sorted(fake.evicted) == [f"{NS}/{DEP}-0", f"{NS}/{DEP}-1"]
    assert fake.notices == []


async def test_return_to_spot_waits_longer_after_a_flap(time_skipping_env):
    env = time_skipping_env
    fake = FakeFleet(desired=4)
    fake.claims = {INSTANCE: 2}
    fake.own_ready = 2
    async with _worker(env, fake) as worker:
        t0 = await env.get_current_time()
        handle = await env.client.start_workflow(
            ReturnToSpot.run,
            ReturnToSpotInput(deployment=DeploymentRef(namespace=NS, name=DEP), policy=POLICY),
            id=f"return-{uuid.uuid4()}",
            task_queue=worker.task_queue,
        )
        await env.sleep(30)
        fake.own_ready = 4  # spot back ...
        await env.sleep(200)
        fake.own_ready = 3  # ... and preempted again before the 300 s stabilisation
        await env.sleep(30)
        assert fake.count("release") == 0
        status = await handle.query(ReturnToSpot.status)
        assert (status.phase, status.flaps, status.stabilisation_seconds) == ("waiting for spot", 1, 600)
        assert (status.spot_ready, status.spot_desired, status.on_demand_desired) == (3, 4, 2)
        fake.own_ready = 4
        await env.sleep(100)
        status = await handle.query(ReturnToSpot.status)
        assert status.phase == "stabilising" and status.healthy_since is not None
        result = await handle.result()
        assert (await handle.query(ReturnToSpot.status)).phase == "released"
    # The decision is the policy's (the benchmark's too): replay the same Ready timeline through it.
    timeline = [(0, 2), (30, 4), (230, 3), (260, 4)]
    released_at = (next(t for c, t in fake.calls if c == "release") - t0).total_seconds()
    assert abs(released_at - _policy_release(timeline, desired=4, held=2, policy=POLICY)) <= POLICY.poll_seconds + 1
    assert result.flaps == 1 and result.stabilisation_seconds == 600 and result.released_replicas == 2


def _policy_release(timeline: list[tuple[float, int]], desired: int, held: int, policy: FailoverPolicy) -> float:
    """When ``on_demand_target`` first gives on-demand back, polling a spot Ready timeline every poll_seconds."""
    healthy_since, flaps, t = None, 0, 0.0
    while True:
        ready = [r for at, r in timeline if at <= t][-1]
        if ready >= desired and healthy_since is None:
            healthy_since = t
        elif ready < desired and healthy_since is not None:
            flaps, healthy_since = flaps + 1, None
        keep = on_demand_target(held, on_demand_needed(desired, ready), healthy_since, t,
                                policy.stabilisation_seconds, flaps, policy.max_stabilisation_seconds)
        if keep < held:
            return t
        t += policy.poll_seconds


async def test_watcher_deletes_only_after_a_successful_start(time_skipping_env):
    env = time_skipping_env
    fake = FakeFleet()
    now = await env.get_current_time()
    unknown = build_event(NoticeKind.INTERRUPTION, INSTANCE, event_id="u", time=now) | {"detail-type": "AWS API Call via CloudTrail"}
    fake.queue = {
        "good": json.dumps(build_event(NoticeKind.INTERRUPTION, INSTANCE, event_id="evt-good", time=now)),
        "bad": '{"detail-type": "EC2 Spot Instance Interruption Warning", "detail": "oops"',
        "unknown": json.dumps(unknown),
        "running": json.dumps(build_event(NoticeKind.STATE_CHANGE, INSTANCE, event_id="evt-run", time=now, state="running")),
    }
    fake.fail_start_once = {"evt-good"}
    async with _worker(env, fake) as worker:
        watcher = await env.client.start_workflow(
            SpotInterruptionWatcher.run,
            WatcherInput(policy=POLICY, idle_seconds=5),
            id=f"spot-watcher-{uuid.uuid4()}",
            task_queue=worker.task_queue,
        )
        for _ in range(200):
            if not fake.queue:
                break
            await asyncio.sleep(0.05)
        await watcher.signal(SpotInterruptionWatcher.stop)
        status: WatcherStatus = await watcher.result()

    assert not fake.queue
    good = [e for e in fake.log if e.endswith(":evt-good") or e == "delete:good"]
    assert good == ["start-failed:evt-good", "started:evt-good", "delete:good"], good
    assert status.start_failures == 1 and status.started == 1
    assert status.malformed == 1 and status.recent_malformed[0].message_id == "bad"
    assert "not JSON" in status.recent_malformed[0].error
    assert status.ignored == 2, "unknown detail-type and a 'running' state change are acknowledged"
    assert {"delete:bad", "delete:unknown", "delete:running"} <= set(fake.log)


@pytest.mark.parametrize("polls", [3])
async def test_watcher_continues_as_new_with_its_counters(time_skipping_env, polls):
    env = time_skipping_env
    fake = FakeFleet()
    fake.queue = {"bad": "nope"}
    async with _worker(env, fake) as worker:
        watcher = await env.client.start_workflow(
            SpotInterruptionWatcher.run,
            WatcherInput(policy=POLICY, idle_seconds=5, polls_per_run=polls),
            id=f"spot-watcher-{uuid.uuid4()}",
            task_queue=worker.task_queue,
        )
        await env.sleep(5 * (polls + 2))
        status = await watcher.query(SpotInterruptionWatcher.status)
        latest = await env.client.get_workflow_handle(watcher.id).describe()
        assert latest.run_id != watcher.first_execution_run_id, "continued as new"
        await watcher.signal(SpotInterruptionWatcher.stop)
        await watcher.result()  # finished while its worker runs: a workflow left open stalls the module's clock
    assert status.polls > polls and status.malformed == 1


async def test_a_failover_counts_by_pool_and_outcome_and_records_its_gap(time_skipping_env):
    """The workflow's own metric meter: one failover on the node's pool, its measured gap."""
    env = time_skipping_env
    fake = FakeFleet(replicas_on_node=2, desired=4, ready_delay=300)
    buffer = MetricBuffer(100_000)  # the SDK records its own metrics into it too
    metered = await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        data_converter=pydantic_data_converter,
        runtime=Runtime(telemetry=TelemetryConfig(metrics=buffer)),
    )
    starts = FakeStarts(fake)
    queue = f"spot-metrics-{uuid.uuid4()}"
    async with Worker(metered, task_queue=queue, workflows=WORKFLOWS,
                      activities=[*activity_methods(fake, SpotActivities), fake.notify_spot_failover, starts.start_spot_reclaim, starts.start_return_to_spot]):
        notice = _notice(NoticeKind.INTERRUPTION, await env.get_current_time())
        result = await env.client.execute_workflow(
            SpotReclaim.run, SpotReclaimInput(instance_id=INSTANCE, policy=POLICY, notice=notice),
            id=f"{spot_reclaim_workflow_id(INSTANCE)}-{uuid.uuid4()}", task_queue=queue,
        )
    updates = [u for u in buffer.retrieve_updates() if u.metric.name.startswith("tideplane_")]
    failovers = [(dict(u.attributes), u.value) for u in updates if u.metric.name == "tideplane_spot_failovers_total"]
    gaps = [(dict(u.attributes), u.value) for u in updates if u.metric.name == "tideplane_capacity_gap_seconds"]
    assert result.pool == POOL and result.capacity_gap_seconds > 0
    assert [(a["pool"], a["outcome"], v) for a, v in failovers] == [(POOL, "drained", 1)]
    assert [(a["pool"], v) for a, v in gaps] == [(POOL, result.capacity_gap_seconds)]
