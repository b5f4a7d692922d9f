"""NodePoolScaling: one durable loop per GPU node pool (an EC2 Auto Scaling group).

Every interval it observes the pool's nodes and the model pods left Unschedulable for lack of
GPUs, asks the placement planner (``plan_pending``) whether those replicas fit on free GPUs of
existing nodes or need new ones (and whether free GPUs are fragmented across nodes), asks the
pure ``size_pool`` what to do, and grows the group, or drains and terminates the least-loaded
idle node above the warm standby. It grows only for pods that stayed pending past a grace period
and never while asked-for nodes are still booting. Continue-as-new keeps the history bounded.

This is where the reactive loops' unschedulable replicas reach the node layer: ReactiveScaling
reports them, and this loop reads the same pods from the cluster and serves those whose
capacity-type requirement matches its pool, so batch replicas grow the spot pool and realtime ones
the on-demand pool, with no coupling between the two workflows' IDs. Start one per pool:

    temporal workflow start --type NodePoolScaling --task-queue tideplane --workflow-id nodepool/gpu-spot \
      --input '{"pool": {"pool": "gpu-spot", "capacity_type": "spot"}, "sizing": {"min_nodes": 1, "max_nodes": 8, "warm_standby": 1, "gpus_per_node": 4}}'

API (stable): workflow type NodePoolScaling, ID ``nodepool/<pool>``, query ``status``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel, Field, model_validator
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows.scaling.activities as acts
    import workflows.telemetry as telemetry
    from workflows.bounds import DAY_SECONDS, MAX_ITERATIONS
    from workflows.scaling.budget import MonthlyBudget
    from workflows.scaling.budget_guard import BUDGET_PATCH, judge_growth
    from workflows.scaling.activities import NodePoolActivities
    from workflows.scaling.placement import CLASS_FOR_CAPACITY, ModelNeed, PoolDecision, PoolSizing, plan_pending, size_pool
    from workflows.steps import cause


class PoolRecord(BaseModel):
    at_s: float
    nodes: int
    pending_gpus: int
    desired: int
    drain: str | None = None
    fits_existing: int = Field(0, description="pending replicas the planner fits on existing nodes")
    fragmented: bool = False
    reason: str


class NodePoolCarry(BaseModel):
    pending_since_s: float | None = None
    records: list[PoolRecord] = Field(default_factory=list)


class NodePoolInput(BaseModel):
    pool: acts.PoolRef
    sizing: PoolSizing = Field(default_factory=PoolSizing)
    interval_seconds: float = Field(15, ge=1, le=DAY_SECONDS)
    iterations_per_run: int = Field(240, ge=1, le=MAX_ITERATIONS)
    budget: MonthlyBudget | None = Field(
        None, description="growth whose nodes would take the month's GPU spend over this budget is refused"
    )
    carry: NodePoolCarry | None = None

    @model_validator(mode="after")
    def _protected_on_demand(self) -> NodePoolInput:
        if self.budget is not None and self.budget.protected and self.pool.capacity_type != "on-demand":
            raise ValueError("budget.protected is for the realtime class's on-demand pools only")
        return self


class NodePoolStatus(BaseModel):
    pool: str
    records: list[PoolRecord]
    pending_since_s: float | None


_SHORT = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=1))
RECORDS_KEPT = 20


@workflow.defn(name="NodePoolScaling")
class NodePoolScaling:
    @workflow.init
    def __init__(self, input: NodePoolInput) -> None:
        carry = input.carry or NodePoolCarry()
        self._pool = input.pool.pool
        self._pending_since = carry.pending_since_s
        self._records = list(carry.records)

    @workflow.run
    async def run(self, input: NodePoolInput) -> None:
        for _ in range(input.iterations_per_run):
            if workflow.info().is_continue_as_new_suggested():
                break
            await self._once(input)
            await asyncio.sleep(input.interval_seconds)
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            input.model_copy(update={"carry": NodePoolCarry(pending_since_s=self._pending_since, records=self._records)})
        )

    async def _once(self, input: NodePoolInput) -> None:
        now = workflow.now().timestamp()
        try:
            seen = await workflow.execute_activity_method(
                NodePoolActivities.observe_node_pool, input.pool,
                start_to_close_timeout=timedelta(seconds=30), retry_policy=_SHORT, summary="observe pool",
            )
        except ActivityError as err:
            workflow.set_current_details(f"⚠ cannot observe pool {self._pool}: {cause(err)}")
            return
        if seen.pending_gpus == 0:
            self._pending_since = None
        elif self._pending_since is None:
            self._pending_since = now
        pending_for = now - self._pending_since if self._pending_since is not None else 0.0
        booting = max(0, seen.desired_capacity - len(seen.nodes))
        plan = None
        if seen.pending:
            pool_class = CLASS_FOR_CAPACITY[input.pool.capacity_type]
            needs = [
                ModelNeed(
                    model=r.model,
                    gpu_memory_gib=r.gpus * seen.gpu_memory_gib,
                    gpus_per_replica=r.gpus,
                    pool_class=pool_class,
                )
                for r in seen.pending
            ]
            plan = plan_pending(seen.nodes, needs, input.sizing, input.pool.capacity_type, seen.gpu_memory_gib)
        decision: PoolDecision = size_pool(seen.nodes, seen.pending_gpus, pending_for, input.sizing, booting, plan)
        desired = min(decision.desired_nodes, seen.max_size)
        reason = decision.reason
        if input.budget is not None and desired > seen.desired_capacity and workflow.patched(BUDGET_PATCH):
            desired, reason = await self._within_budget(input, seen.desired_capacity, desired, reason)
        if decision.drain:
            removed = await workflow.execute_activity_method(
                NodePoolActivities.remove_pool_node, acts.RemoveNodeInput(pool=self._pool, node=decision.drain),
                start_to_close_timeout=timedelta(seconds=60), retry_policy=_SHORT,
                summary=f"drain {decision.drain}",
            )
            reason += f"; {removed.reason}"
        elif desired != seen.desired_capacity:
            await workflow.execute_activity_method(
                NodePoolActivities.set_pool_capacity, acts.SetCapacityInput(pool=self._pool, desired=desired),
                start_to_close_timeout=timedelta(seconds=30), retry_policy=_SHORT,
                summary=f"{self._pool} {seen.desired_capacity} -> {desired} nodes",
            )
        record = PoolRecord(
            at_s=now,
            nodes=len(seen.nodes),
            pending_gpus=seen.pending_gpus,
            desired=desired,
            drain=decision.drain,
            fits_existing=plan.fits_existing if plan else 0,
            fragmented=plan.fragmented if plan else False,
            reason=reason,
        )
        self._records = [*self._records, record][-RECORDS_KEPT:]
        pods = ", ".join(seen.pending_pods[:5]) or "none"
        details = (
            f"**pool {self._pool}**: {len(seen.nodes)} node(s), desired {desired}, {seen.pending_gpus} GPU(s) pending"
            f" ({pods})\n\n{reason}"
        )
        if plan and plan.fragmented:
            details += "\n\n⚠ fragmented: free GPUs are spread over nodes that cannot each hold a pending replica"
        workflow.set_current_details(details)

    async def _within_budget(self, input: NodePoolInput, current: int, desired: int, reason: str) -> tuple[int, str]:
        """Nodes the monthly budget pays for (workflows/scaling/budget.py); a protected pool keeps its growth."""
        verdict = await judge_growth(input.budget, workflow.now(), current, desired, input.sizing.gpus_per_node,
                                     input.pool.capacity_type, pool=self._pool, unit="node")
        if isinstance(verdict, str):
            return desired, f"{reason}; {verdict}"
        if verdict.over_budget:
            outcome = "protected" if input.budget.protected else "refused"
            telemetry.budget_refusal(workflow.metric_meter(), "", "", self._pool, outcome)
            return verdict.allowed, f"{reason}; {verdict.reason}"
        return desired, reason

    @workflow.query(name="status")
    def status(self) -> NodePoolStatus:
        return NodePoolStatus(pool=self._pool, records=self._records, pending_since_s=self._pending_since)
