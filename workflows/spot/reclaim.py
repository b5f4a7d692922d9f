"""``SpotReclaim`` (id ``spot-reclaim/<instance-id>``): fail one spot instance's replicas over to on-demand.

Node of the instance (``spec.providerID``) -> cordon -> count the serving replicas on it per
versioned Deployment -> in parallel, bring the same number up on on-demand and drain the node
through the Eviction API once they are Ready or the notice deadline is near. A rebalance
recommendation pre-warms without draining. Capacity gap = seconds during which some affected
Deployment had fewer Ready replicas (its own + its fallback's) than desired, measured by this
workflow from its samples; every reclaim counts in ``tideplane_spot_failovers_total`` (by the
node's pool and the outcome) and its gap in ``tideplane_capacity_gap_seconds``.

Replacement capacity (the decision): each versioned Deployment ``<name>`` gets a fallback
Deployment ``<name>-od`` (same pod template and serving labels, so its Service routes to it, plus
``nodeSelector karpenter.sh/capacity-type=on-demand``) whose replicas are the sum of per-instance
claims; when an on-demand pool ASG is configured, its desired capacity is its base plus one node
per claiming instance. The spot Deployment itself is not touched: the scaler keeps owning its
replicas, and its evicted pods come back on spot when spot capacity returns (``ReturnToSpot``).

Once drained, each affected Deployment gets a notice (a Kubernetes Event on it, the optional
webhook): what moved where, when the replacements were Ready and the capacity gap.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.spot.contract import (
        CALL_TIMEOUT,
        QUICK_RETRY,
        ClaimFallbackInput,
        CountsInput,
        EvictInput,
        FailoverNotice,
        FailoverPolicy,
        FindNodeInput,
        NodeRef,
        PodRef,
        PoolInput,
        ReplicaCounts,
        ReturnToSpotInput,
        SpotActivities,
        SpotNotifyActivities,
        SpotWorkflowStarts,
        UnschedulableInput,
    )
    from workflows.core import telemetry
    from workflows.core.naming import DeploymentRef
    from workflows.core.notices import deliver
    from workflows.spot.events import NoticeKind, SpotNotice
    from workflows.spot.policy import DomainRisk, on_demand_needed, preemption_predicted, rebalance_hold
    from workflows.core.waiting import wait_until


# Runs started before the policy sized the claims claimed every replica on the node, without a sample first.
SIZED_CLAIMS_PATCH = "policy-sized-claims"
# Runs started before failover notices told no one.
FAILOVER_NOTICES_PATCH = "failover-notices"


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
    pool: str | None = Field(None, description="the node's pool")
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
    pool: str | None = None
    outcome: str = Field(description="drained | no-node | no-managed-pods | rebalance-released")
    warm: bool
    replicas_moved: int
    evicted: int
    capacity_gap_seconds: float
    replacement_ready_seconds: float | None
    affected: list[AffectedDeployment]


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

        node = await workflow.execute_activity_method(
            SpotActivities.find_spot_node, FindNodeInput(instance_id=input.instance_id),
            start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
        )
        if node.name is None:
            return self._finish("no-node")
        st.node, st.pool = node.name, node.pool
        await workflow.execute_activity_method(
            SpotActivities.set_node_unschedulable, UnschedulableInput(node=node.name),
            start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY, summary=f"cordon {node.name}",
        )
        pods = await workflow.execute_activity_method(
            SpotActivities.serving_pods_on_node, NodeRef(node=node.name),
            start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
        )
        per_deployment: dict[tuple[str, str], int] = {}
        for pod in pods.pods:
            key = (pod.namespace, pod.deployment)
            per_deployment[key] = per_deployment.get(key, 0) + 1
        if not per_deployment:
            return self._finish("no-managed-pods")
        st.affected = [AffectedDeployment(namespace=ns, name=n, replicas_on_node=c) for (ns, n), c in sorted(per_deployment.items())]
        keys = [DeploymentRef(namespace=a.namespace, name=a.name) for a in st.affected]

        # Replacement capacity: claims on the fallback Deployments, nodes from the on-demand pool.
        st.phase = "replacing"
        st.warm = not self._interrupted
        self._show()
        claims = [a.replicas_on_node for a in st.affected]
        if workflow.patched(SIZED_CLAIMS_PATCH):
            # The policy's need: what each Deployment lacks once this instance's replicas are gone.
            risk = DomainRisk(notice=self._interrupted, rebalance=not self._interrupted)
            counts = await self._sample(keys)
            claims = [
                min(a.replicas_on_node, on_demand_needed(c.desired, c.ready, at_risk=a.replicas_on_node))
                if preemption_predicted(risk) else 0
                for c, a in zip(counts, st.affected)
            ]
        await asyncio.gather(*(
            workflow.execute_activity_method(
                SpotActivities.claim_spot_fallback,
                ClaimFallbackInput(deployment=k, claimant=input.instance_id, replicas=n, capacity_type=policy.capacity_type),
                start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
                summary=f"{k.namespace}/{k.name}: +{n} on {policy.capacity_type}",
            )
            for k, n in zip(keys, claims)
        ))
        await self._sync_pool(policy)

        # Wait for the replacements, the deadline, or (rebalance only) the end of the hold.
        hold_until = workflow.now() + timedelta(seconds=rebalance_hold(policy.rebalance_hold_seconds, policy.stabilisation_seconds))
        while True:
            counts = await self._sample(keys)
            replaced = all(c.fallback_ready >= n for c, n in zip(counts, claims))
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
            await wait_until(lambda: bool(self._pending), timedelta(seconds=max(wait, 0.001)), "replacements, deadline or a notice")
            self._take_notices()

        # Drain through the Eviction API; a PodDisruptionBudget may refuse until the deadline.
        st.phase = "draining"
        self._show()
        if st.warm:  # pods may have changed during a long rebalance hold
            pods = await workflow.execute_activity_method(
                SpotActivities.serving_pods_on_node, NodeRef(node=node.name),
                start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
            )
        remaining = [PodRef(namespace=p.namespace, name=p.name) for p in pods.pods]
        while remaining:
            evicted = await workflow.execute_activity_method(
                SpotActivities.evict_pods, EvictInput(pods=remaining),
                start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
                summary=f"evict {len(remaining)} pods from {node.name}",
            )
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
            if all(c.fallback_ready >= n for c, n in zip(counts, claims)) and st.replacement_ready_seconds is None:
                st.replacement_ready_seconds = (workflow.now() - started).total_seconds()
            if not any(c.short for c in counts) or workflow.now() >= restore_until:
                break
            self._show()
            await workflow.sleep(policy.poll_seconds)

        if policy.return_to_spot:
            # Not a child: it outlives this workflow, and one per Deployment serves every reclaim.
            await asyncio.gather(*(
                workflow.execute_activity_method(
                    SpotWorkflowStarts.start_return_to_spot, ReturnToSpotInput(deployment=k, policy=policy),
                    start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
                    summary=f"return {k.namespace}/{k.name} to spot",
                )
                for k in keys
            ))
        if workflow.patched(FAILOVER_NOTICES_PATCH):
            await self._notify(policy)
        return self._finish("drained")

    async def _notify(self, policy: FailoverPolicy) -> None:
        """One notice per affected Deployment, delivered side by side; a failed one is logged."""
        st = self._status
        assert st is not None and st.node is not None
        info = workflow.info()
        await asyncio.gather(*(
            deliver(
                SpotNotifyActivities.notify_spot_failover,
                FailoverNotice(
                    namespace=a.namespace, deployment=a.name, instance_id=st.instance_id, node=st.node, pool=st.pool,
                    capacity_type=policy.capacity_type, replicas_moved=a.replicas_on_node,
                    replacement_ready_seconds=st.replacement_ready_seconds, capacity_gap_seconds=st.capacity_gap_seconds,
                    workflow_id=info.workflow_id, run_id=info.run_id, temporal_namespace=info.namespace, seq=seq,
                ),
                f"notify: failover of {a.namespace}/{a.name}",
            )
            for seq, a in enumerate(st.affected, start=1)
        ))

    async def _sync_pool(self, policy: FailoverPolicy) -> None:
        """The on-demand pool's desired capacity follows the claims (when the policy names a pool)."""
        if policy.on_demand_pool_asg:
            await workflow.execute_activity_method(
                SpotActivities.sync_on_demand_pool, PoolInput(asg=policy.on_demand_pool_asg),
                start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
            )

    async def _sample(self, keys: list[DeploymentRef]) -> list[ReplicaCounts]:
        """Read Ready counts; the time since the last sample counts as gap if that sample was short."""
        st = self._status
        assert st is not None
        result = await workflow.execute_activity_method(
            SpotActivities.spot_replica_counts, CountsInput(deployments=keys),
            start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
        )
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

    async def _release(self, instance_id: str, keys: list[DeploymentRef], node: str, policy: FailoverPolicy) -> SpotReclaimResult:
        """A rebalance that was not followed by an interruption: give the pre-warm back, uncordon."""
        await asyncio.gather(*(
            workflow.execute_activity_method(
                SpotActivities.claim_spot_fallback,
                ClaimFallbackInput(deployment=k, claimant=instance_id, replicas=0, capacity_type=policy.capacity_type),
                start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
            )
            for k in keys
        ))
        await self._sync_pool(policy)
        await workflow.execute_activity_method(
            SpotActivities.set_node_unschedulable, UnschedulableInput(node=node, unschedulable=False),
            start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY, summary=f"uncordon {node}",
        )
        return self._finish("rebalance-released")

    def _finish(self, outcome: str) -> SpotReclaimResult:
        st = self._status
        assert st is not None
        st.phase = outcome
        self._show()
        telemetry.spot_failover(workflow.metric_meter(), st.pool or "unknown", outcome, st.capacity_gap_seconds)
        return SpotReclaimResult(
            instance_id=st.instance_id,
            node=st.node,
            pool=st.pool,
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
