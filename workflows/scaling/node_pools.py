"""NodePoolScaling: one durable loop per GPU node pool (an EC2 Auto Scaling group).

Every interval it observes the pool's nodes and the model pods left Unschedulable for lack of
GPUs, asks the placement planner (``plan_pending``) whether those replicas fit on free GPUs of
existing nodes or need new ones (and whether free GPUs are fragmented across nodes), asks the
pure ``size_pool`` what to do, and grows the group, or drains and terminates the least-loaded
idle node above the warm standby. It grows only for pods that stayed pending past a grace period
and never while asked-for nodes are still booting. Continue-as-new keeps the history bounded.

With ``warm_pool`` it also keeps the group's EC2 Auto Scaling warm pool sized: stopped instances
(their disks paid for, not their GPUs) that join in about a minute instead of a fresh launch's
several, with the serving image and the engine caches already on their disks. Its size is the pure
``warm_pool_size`` (workflows/scaling/warm_pool.py): the nodes the demand forecast's peak over the
cold-start horizon needs beyond those running (every ``forecast_every_seconds``, the
``forecast_demand`` activity per deployment the pool serves, sized by that deployment's SLO policy),
within the settings' bounds, raised to the floors other loops claim with the ``warm_pool_floor``
signal: a batch ReactiveScaling loop whose spot mix names this pool (``spot_mix.on_demand_pool``)
claims ``warm_pool_needed``, the replicas its worst spot loss must replace inside the 2-minute
notice (a stopped instance serves in about a minute, a fresh launch does not). This loop stays the
one writer of the group's warm pool; a claim of 0 replicas drops the floor, and a claim sent with a
``ttl_seconds`` (the claimant renews it on its interval) lapses when not renewed in time, so a
terminated claimant's floor does not stay. Scale-in stops an instance back into the pool (ReuseOnScaleIn) rather
than terminating it, and AWS keeps as many as the pool's size. With the pool's ``node_costs``, a
scale-in first sizes the pool so that exactly the freed nodes ``freed_nodes`` sends back are kept:
those the forecast's peak within the warm pool's break-even time (``break_even_seconds``: how long a
stopped node's disks cost less than the boot a fresh launch wastes) needs beyond the nodes still
running and warm; the rest are terminated. Kept nodes stay in the pool while that peak needs them.

This is where the reactive loops' unschedulable replicas reach the node layer: ReactiveScaling
reports them, and this loop reads the same pods from the cluster and serves those whose
capacity-type requirement matches its pool, so batch replicas grow the spot pool and realtime ones
the on-demand pool, with no coupling between the two workflows' IDs. Start one per pool:

    temporal workflow start --type NodePoolScaling --task-queue tideplane --workflow-id nodepool/gpu-spot \
      --input '{"pool": {"pool": "gpu-spot", "capacity_type": "spot"}, "sizing": {"min_nodes": 1, "max_nodes": 8, "warm_standby": 1, "gpus_per_node": 4}}'

An on-demand pool with a warm pool sized for the chat deployment's forecast (AWS has no warm pools
for Spot Instances):

    temporal workflow start --type NodePoolScaling --task-queue tideplane --workflow-id nodepool/gpu-on-demand \
      --input '{"pool": {"pool": "gpu-on-demand"}, "sizing": {"min_nodes": 1, "max_nodes": 8, "warm_standby": 0, "gpus_per_node": 4}, "warm_pool": {"max_size": 2, "demand": [{"deployment": "llm-serving/chat"}]}}'

API (stable): workflow type NodePoolScaling, ID ``nodepool/<pool>``, query ``status``, signal
``warm_pool_floor`` (``WarmPoolFloor``).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel, Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import workflows.scaling.contract as acts
    import workflows.core.telemetry as telemetry
    from workflows.core.bounds import DAY_SECONDS, MAX_ITERATIONS
    from workflows.core.naming import split_deployment
    from workflows.scaling.contract import NodePoolActivities, ScalingActivities
    from workflows.cost.budget import MonthlyBudget
    from workflows.cost.budget_guard import BUDGET_PATCH, judge_growth
    from workflows.scaling.decide import ScalingPolicy, slo_replicas
    from workflows.core.pools import CLASS_FOR_CAPACITY
    from workflows.scaling.placement import ModelNeed, PoolDecision, PoolSizing, plan_pending, size_pool
    from workflows.scaling.forecast import WEEK_S
    from workflows.scaling.warm_pool import (
        WARM_POOL_FLOOR_SIGNAL,
        NodeCosts,
        WarmPoolFloor,
        break_even_seconds,
        lapsed_claims,
        nodes_for,
        warm_pool_size,
        with_floors,
        with_freed,
    )
    from workflows.core.failures import cause


WARM_POOL_PATCH = "node-pool-warm-pool"
FREED_NODES_PATCH = "node-pool-freed-nodes"  # a second forecast (over the break-even time) and the freed-node sizing
# Runs from before claims carried a TTL held every claim until it was dropped with 0.
FLOOR_TTL_PATCH = "warm-pool-floor-ttl"


class ForecastedDeployment(BaseModel):
    """A deployment whose demand this pool serves, sized as its ReactiveScaling loop sizes it."""

    deployment: str = Field(description="NAMESPACE/NAME")
    policy: ScalingPolicy = Field(default_factory=ScalingPolicy, description="its SLO sizing and gpus_per_replica")

    @field_validator("deployment")
    @classmethod
    def _namespaced(cls, ref: str) -> str:
        split_deployment(ref)  # ValueError naming the field when malformed
        return ref


class WarmPoolSettings(BaseModel):
    """The pool's warm pool: stopped instances ready to join, sized by the demand forecast within bounds."""

    min_size: int = Field(0, ge=0)
    max_size: int = Field(4, ge=0)
    reuse_on_scale_in: bool = Field(True, description="scale-in returns instances to the warm pool")
    demand: list[ForecastedDeployment] = Field(
        default_factory=list, description="deployments whose forecast peak sizes the pool; none: min_size"
    )
    horizon_seconds: float = Field(
        600, gt=0, le=DAY_SECONDS, description="how far ahead: a fresh node's cold start (launch, image, weights, compile)"
    )
    forecast_every_seconds: float = Field(300, ge=1, le=DAY_SECONDS)
    node_costs: NodeCosts | None = Field(
        None, description="one node's prices and starts: a freed node is kept warm when the forecast needs it within the"
        " break-even time, terminated otherwise; None: the pool keeps its forecast size and AWS terminates the rest",
    )


class PoolRecord(BaseModel):
    at_s: float
    nodes: int
    pending_gpus: int
    desired: int
    drain: str | None = None
    fits_existing: int = Field(0, description="pending replicas the planner fits on existing nodes")
    fragmented: bool = False
    warm_pool: int | None = Field(None, description="stopped instances the warm pool was sized to")
    reason: str


class NodePoolCarry(BaseModel):
    pending_since_s: float | None = None
    records: list[PoolRecord] = Field(default_factory=list)
    warm_pool_size: int | None = Field(None, description="what the warm pool was last set to")
    peak_nodes: int = Field(0, description="nodes the last demand forecast's peak needs")
    forecast_at_s: float | None = None
    warm_pool_floors: dict[str, WarmPoolFloor] = Field(default_factory=dict, description="source -> its claimed floor")
    peak_break_even_nodes: int = Field(0, description="nodes the forecast's peak within the break-even time needs")
    freed_held: int = Field(0, description="warm pool size last set with the freed-node decisions")
    warm_pool_floor_deadlines: dict[str, float] = Field(
        default_factory=dict, description="source -> when its claim lapses unless renewed (epoch seconds, workflow time)"
    )


class NodePoolInput(BaseModel):
    pool: acts.PoolRef
    sizing: PoolSizing = Field(default_factory=PoolSizing)
    interval_seconds: float = Field(15, ge=1, le=DAY_SECONDS)
    iterations_per_run: int = Field(240, ge=1, le=MAX_ITERATIONS)
    warm_pool: WarmPoolSettings | None = Field(None, description="None: no warm pool is managed")
    budget: MonthlyBudget | None = Field(
        None, description="growth whose nodes would take the month's GPU spend over this budget is refused"
    )
    carry: NodePoolCarry | None = None

    @model_validator(mode="after")
    def _warm_pool_on_demand_only(self) -> NodePoolInput:
        if self.warm_pool is not None and self.pool.capacity_type == "spot":
            raise ValueError("warm_pool: EC2 Auto Scaling has no warm pools for Spot Instances (use it on an on-demand pool)")
        return self

    @model_validator(mode="after")
    def _protected_on_demand(self) -> NodePoolInput:
        if self.budget is not None and self.budget.protected and self.pool.capacity_type != "on-demand":
            raise ValueError("budget.protected is for the realtime class's on-demand pools only")
        return self


class NodePoolStatus(BaseModel):
    pool: str
    records: list[PoolRecord]
    pending_since_s: float | None
    warm_pool_size: int | None = None
    warm_pool_floors: list[WarmPoolFloor] = Field(default_factory=list, description="floors claimed on the warm pool")
    peak_break_even_nodes: int = Field(0, description="nodes the forecast's peak within the break-even time needs")
    warm_pool_floor_deadlines: dict[str, float] = Field(
        default_factory=dict, description="source -> when its claim lapses unless renewed (epoch seconds)"
    )


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
        self._warm_pool_size = carry.warm_pool_size
        self._peak_nodes = carry.peak_nodes
        self._forecast_at = carry.forecast_at_s
        self._floors = dict(carry.warm_pool_floors)
        self._floor_deadlines = dict(carry.warm_pool_floor_deadlines)
        self._floored_by: str | None = None  # why a claimed floor, not the forecast, sets the warm pool
        self._peak_break_even_nodes = carry.peak_break_even_nodes
        self._freed_held = carry.freed_held

    @workflow.run
    async def run(self, input: NodePoolInput) -> None:
        for _ in range(input.iterations_per_run):
            if workflow.info().is_continue_as_new_suggested():
                break
            await self._once(input)
            await asyncio.sleep(input.interval_seconds)
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            input.model_copy(update={"carry": NodePoolCarry(
                pending_since_s=self._pending_since, records=self._records, warm_pool_size=self._warm_pool_size,
                peak_nodes=self._peak_nodes, forecast_at_s=self._forecast_at, warm_pool_floors=self._floors,
                peak_break_even_nodes=self._peak_break_even_nodes, freed_held=self._freed_held,
                warm_pool_floor_deadlines=self._floor_deadlines,
            )})
        )

    async def _once(self, input: NodePoolInput) -> None:
        now = workflow.now().timestamp()
        lapsed = self._drop_lapsed_floors(now)
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
                    gpu_memory_gib=r.gpu_memory_gib(seen.gpu_memory_gib),
                    gpus_per_replica=r.gpus,
                    pool_class=pool_class,
                )
                for r in seen.pending
            ]
            plan = plan_pending(seen.nodes, needs, input.sizing, input.pool.capacity_type, seen.gpu_memory_gib)
        decision: PoolDecision = size_pool(seen.nodes, seen.pending_gpus, pending_for, input.sizing, booting, plan)
        desired = min(decision.desired_nodes, seen.max_size)
        reason = decision.reason + lapsed
        if input.budget is not None and desired > seen.desired_capacity and workflow.patched(BUDGET_PATCH):
            desired, reason = await self._within_budget(input, seen.desired_capacity, desired, reason)
        if input.warm_pool is not None and workflow.patched(WARM_POOL_PATCH):
            freed = 1 if decision.drain else max(0, seen.desired_capacity - desired)
            reason += await self._size_warm_pool(input.warm_pool, seen, input.sizing.gpus_per_node, now, freed)
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
            warm_pool=self._warm_pool_size,
            reason=reason,
        )
        self._records = [*self._records, record][-RECORDS_KEPT:]
        pods = ", ".join(seen.pending_pods[:5]) or "none"
        details = (
            f"**pool {self._pool}**: {len(seen.nodes)} node(s), desired {desired}, {seen.pending_gpus} GPU(s) pending"
            f" ({pods})\n\n{reason}"
        )
        if self._warm_pool_size is not None:
            details += f"\n\nwarm pool: {self._warm_pool_size} stopped instance(s)"
            if self._floored_by:
                details += f"\n\nwarm pool {self._warm_pool_size} = {self._floored_by}"
        if self._floors and input.warm_pool is None:
            claims = ", ".join(f"{f.source} {f.replicas} replica(s)" for f in self._floors.values())
            details += f"\n\n⚠ warm pool floors claimed ({claims}) but this pool manages no warm pool: start it with warm_pool"
        if plan and plan.fragmented:
            details += "\n\n⚠ fragmented: free GPUs are spread over nodes that cannot each hold a pending replica"
        workflow.set_current_details(details)

    async def _size_warm_pool(self, settings: WarmPoolSettings, seen: acts.PoolObservation, gpus_per_node: int, now: float,
                              freed: int) -> str:
        """Forecast when due, size the warm pool, set it when its size changes; what to add to the
        cycle's reason (a failure is reported there; the last size holds and is tried again). With
        ``node_costs``, the ``freed`` nodes this cycle's scale-in takes out of service are kept or
        terminated by the forecast within the break-even time (the size is set before the scale-in)."""
        note = ""
        reuse = settings.node_costs is not None and settings.reuse_on_scale_in and workflow.patched(FREED_NODES_PATCH)
        if settings.demand and (self._forecast_at is None or now - self._forecast_at >= settings.forecast_every_seconds):
            try:
                self._peak_nodes = await self._forecast_peak_nodes(settings, gpus_per_node, now, settings.horizon_seconds)
                if reuse:
                    break_even = min(WEEK_S, break_even_seconds(settings.node_costs))
                    self._peak_break_even_nodes = await self._forecast_peak_nodes(settings, gpus_per_node, now, break_even)
                self._forecast_at = now
            except ActivityError as err:
                note = f"; ⚠ demand forecast failed: {cause(err)}"
        max_size = min(settings.max_size, seen.max_size)
        forecast = warm_pool_size(self._peak_nodes, len(seen.nodes), 1, max_size, min(settings.min_size, max_size))
        plan = with_floors(forecast, list(self._floors.values()), gpus_per_node, max_size)
        if reuse:
            plan = with_freed(plan, self._freed_held, self._peak_break_even_nodes, len(seen.nodes), freed, 1, max_size)
        floored_by = plan.reason if plan is not forecast else None
        if plan.size == self._warm_pool_size:
            self._floored_by = floored_by
            self._freed_held = plan.size if reuse else 0
            return f"{note}; {plan.reason}" if reuse and freed else note
        try:
            await workflow.execute_activity_method(
                NodePoolActivities.set_warm_pool,
                acts.SetWarmPoolInput(pool=self._pool, size=plan.size, reuse_on_scale_in=settings.reuse_on_scale_in),
                start_to_close_timeout=timedelta(seconds=30), retry_policy=_SHORT,
                summary=f"{self._pool} warm pool -> {plan.size}",
            )
        except ActivityError as err:
            return f"{note}; ⚠ cannot size the warm pool: {cause(err)}"
        self._warm_pool_size = plan.size
        self._floored_by = floored_by
        self._freed_held = plan.size if reuse else 0
        return f"{note}; warm pool {plan.size} ({plan.reason})"

    async def _forecast_peak_nodes(self, settings: WarmPoolSettings, gpus_per_node: int, now: float, horizon_seconds: float) -> int:
        """Nodes the forecast peaks of the pool's deployments need over ``horizon_seconds``, whole replicas per node."""
        nodes = 0
        for wanted in settings.demand:
            namespace, name = split_deployment(wanted.deployment)
            forecast = await workflow.execute_activity_method(
                ScalingActivities.forecast_demand,
                acts.DemandForecastInput(
                    namespace=namespace, deployment=name, at=now, horizon_seconds=horizon_seconds,
                    error_quantile=wanted.policy.forecast_error_quantile,
                ),
                start_to_close_timeout=timedelta(seconds=60), retry_policy=_SHORT,
                summary=f"demand forecast {wanted.deployment}, {horizon_seconds:.0f}s ahead",
            )
            per_node = max(1, gpus_per_node // max(1, wanted.policy.gpus_per_replica))
            nodes += nodes_for(slo_replicas(forecast.upper, wanted.policy), per_node)
        return nodes

    async def _within_budget(self, input: NodePoolInput, current: int, desired: int, reason: str) -> tuple[int, str]:
        """Nodes the monthly budget pays for (workflows/cost/budget.py); a protected pool keeps its growth."""
        verdict = await judge_growth(input.budget, workflow.now(), current, desired, input.sizing.gpus_per_node,
                                     input.pool.capacity_type, pool=self._pool, unit="node")
        if isinstance(verdict, str):
            return desired, f"{reason}; {verdict}"
        if verdict.over_budget:
            outcome = "protected" if input.budget.protected else "refused"
            telemetry.budget_refusal(workflow.metric_meter(), "", "", self._pool, outcome)
            return verdict.allowed, f"{reason}; {verdict.reason}"
        return desired, reason

    def _drop_lapsed_floors(self, now: float) -> str:
        """Drop the claims not renewed within their TTL (their claimant stopped without dropping
        them); what to add to the cycle's reason."""
        lapsed = lapsed_claims(self._floor_deadlines, now)
        if not lapsed or not workflow.patched(FLOOR_TTL_PATCH):
            return ""
        for source in lapsed:
            self._floors.pop(source, None)
            self._floor_deadlines.pop(source, None)
        return f"; warm pool claim(s) of {', '.join(lapsed)} lapsed: not renewed in time"

    @workflow.signal(name=WARM_POOL_FLOOR_SIGNAL)
    def warm_pool_floor(self, floor: WarmPoolFloor) -> None:
        """A loop claims the stopped nodes it needs in the warm pool (0 replicas: its claim lapses),
        until ``ttl_seconds`` from now unless it claims again; the next cycle sizes the pool to at
        least the claims."""
        self._floor_deadlines.pop(floor.source, None)
        if floor.replicas > 0:
            self._floors[floor.source] = floor
            if floor.ttl_seconds is not None:
                self._floor_deadlines[floor.source] = workflow.now().timestamp() + floor.ttl_seconds
        else:
            self._floors.pop(floor.source, None)

    @workflow.query(name="status")
    def status(self) -> NodePoolStatus:
        return NodePoolStatus(
            pool=self._pool, records=self._records, pending_since_s=self._pending_since, warm_pool_size=self._warm_pool_size,
            warm_pool_floors=list(self._floors.values()), peak_break_even_nodes=self._peak_break_even_nodes,
            warm_pool_floor_deadlines=self._floor_deadlines,
        )
