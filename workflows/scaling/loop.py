"""ReactiveScaling: one durable loop per deployment.

Every interval the loop reads the deployment's scale and its signals, asks the pure
``decide`` for the desired replicas and scales through the Deployment's scale subresource.
Floors come from Temporal Schedules (ScheduleFloor, workflows/scaling/floors.py) and predictive
pre-warm (PredictivePrewarm, workflows/scaling/prewarm.py) as ``set_floor`` signals keyed by
source, so a schedule raises or lowers the floor and never fights the loop. The loop
continues-as-new every ``iterations_per_run`` decisions (or when Temporal suggests it), carrying
its state, so its history stays bounded however long it runs.

The policy's priority class says which capacity the replicas run on (realtime: on-demand, floor
kept; batch: spot, may scale to zero). Replicas left Unschedulable are reported here and served
by the NodePoolScaling loop of the matching pool, which reads the same pods. A batch policy may
declare a CPU fallback that the loop scales up while GPU replicas stay unavailable past a
deadline (workflows.scaling.cpu_fallback).

Metrics go through the workflow metric meter (workflows/core/telemetry.py): decisions that change
something, or hold for a reason worth alerting on; replicas desired and Ready; and each scale-up,
from the decision to all its replicas Ready (its cold start, seen at the loop's interval) or
given up (the loop scaled down first).

API (stable): workflow type ReactiveScaling; ID ``scaling/<namespace>/<name>``; signals
``pause``, ``resume``, ``set_floor``; update ``update_policy``; query ``status``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    # full dotted names: `from workflows import naming` would give the sandbox its own copy of naming
    import workflows.core.naming as naming
    import workflows.core.search_attributes as search_attributes
    import workflows.core.telemetry as telemetry
    from workflows.core.naming import DeploymentRef
    from workflows.rollout.contract import RolloutActivities, ScaleVersionInput
    import workflows.scaling.contract as acts
    from workflows.scaling.contract import ScalingActivities
    from workflows.cost.budget_guard import BUDGET_PATCH, judge_growth
    from workflows.scaling.cpu_fallback import decide_fallback
    from workflows.scaling.deployment_scale import SHORT_RETRY, read_scale, read_signals, scale_to
    from workflows.scaling.loop_state import (
        DecisionRecord,
        LastScaleUp,
        OperatorNote,
        PendingScaleUp,
        PolicyPatch,
        ScalingCarry,
        ScalingInput,
        ScalingStatus,
        SpotMixRecord,
        WarmFloorClaim,
        claimed,
        cold_start_line,
    )
    from workflows.scaling.decide import (
        NOTABLE_HOLDS,
        ScalingDecision,
        ScalingPolicy,
        decide,
        slo_replicas,
    )
    from workflows.scaling.floors import SET_FLOOR_SIGNAL, FloorClaim, SetFloor, floor_label
    from workflows.core.pools import CAPACITY_FOR_CLASS
    from workflows.scaling.queue_limit import QueueLimit, queue_limit
    from workflows.scaling.warm_pool import CLAIM_RENEWALS_PER_TTL, WARM_POOL_FLOOR_SIGNAL, WarmPoolFloor, claim_ttl_seconds
    from workflows.spot.contract import ApplySpotMixInput, SpotDomainsInput, SpotMixActivities
    from workflows.spot.mix import SpotMixPolicy, markets, observe, plan_spot_mix, replicas_per_pool
    from workflows.spot.policy import warm_pool_needed
    from workflows.core.failures import cause, understood, validated
    from workflows.core.waiting import wait_until

DECISIONS_KEPT = 20
FORECAST_FLOOR = "forecast"  # the floor source the loop's own demand forecast holds
# Runs from before the gateway's queue limit (issue 19) never wrote one.
QUEUE_LIMIT_PATCH = "queue-limit"
# Runs from before a queue limit turned off was taken out of the route's policy left it there.
QUEUE_LIMIT_OFF_PATCH = "queue-limit-off"
# Runs from before the spot mix scaled the versioned Deployment whatever the policy said.
SPOT_MIX_PATCH = "spot-mix"
# Runs from before issue 32 stepped the stable down under a canary's analysis (its evidence taken on a moving fleet).
ANALYSIS_FREEZE_PATCH = "scale-in-frozen-under-canary"
# Runs from before a version placed into a mix kept its own replicas until the pools carried the
# total never applied an unchanged split again (its own replicas went to 0 at once).
SPOT_MIX_HANDOVER_PATCH = "spot-mix-handover"
# Runs from before the spot mix's warm pool need was claimed on its on-demand pool's NodePoolScaling.
SPOT_WARM_FLOOR_PATCH = "spot-mix-warm-floor"
# Runs from before that claim carried a TTL sent it once per change and never renewed it.
WARM_FLOOR_RENEW_PATCH = "spot-mix-warm-floor-renew"


@workflow.defn(name="ReactiveScaling", failure_exception_types=[ValidationError])
class ReactiveScaling:
    """ValidationError fails the run: a bad input (e.g. min_replicas > max_replicas) is reported with
    its field at once instead of retrying the workflow task forever."""

    @workflow.init
    def __init__(self, input: ScalingInput) -> None:
        carry = input.carry or ScalingCarry()
        self._input = input
        self._policy = input.policy
        self._state = carry.state
        self._floors = dict(carry.floors)
        self._paused = carry.paused
        self._pause_reason = carry.pause_reason
        self._decisions = list(carry.decisions)
        self._runs = carry.runs
        self._fallback = carry.fallback
        self._fallback_applied = carry.fallback_applied
        self._scale_up = carry.scale_up
        self._last_scale_up = carry.last_scale_up
        self._spot_history = dict(carry.spot_history)
        self._spot_mix_applied = carry.spot_mix_applied
        self._warm_floor = carry.warm_floor
        self._iteration = 0
        self._wake = False
        self._queue_limit: QueueLimit | None = None  # last written to the gateway (written again after continue-as-new)
        self._queue_limit_written = carry.queue_limit_written

    @workflow.run
    async def run(self, input: ScalingInput) -> None:
        namespace, name = naming.split_deployment(input.deployment)
        if workflow.info().typed_search_attributes.get(search_attributes.DEPLOYMENT) is None:
            workflow.upsert_search_attributes([search_attributes.DEPLOYMENT.value_set(input.deployment)])
        while True:
            if self._iteration >= input.iterations_per_run or workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(input.model_copy(update={"policy": self._policy, "carry": self._carry()}))
            if self._paused:
                self._details(f"paused: {self._pause_reason or 'by operator'}")
                if self._warm_floor is not None and workflow.patched(WARM_FLOOR_RENEW_PATCH):
                    # the spot replicas still run while paused: their warm pool claim is renewed
                    wait = max(self._until_renewal(), timedelta(seconds=input.interval_seconds))
                    if not await wait_until(lambda: not self._paused, wait, "paused: renew the warm pool claim"):
                        await self._renew_warm_floor()
                    continue  # still paused: wait again, after the continue-as-new check
                await workflow.wait_condition(lambda: not self._paused)
            await self._decide_once(namespace, name)
            await self._renew_warm_floor()
            self._iteration += 1
            self._wake = False
            await wait_until(lambda: self._wake, timedelta(seconds=input.interval_seconds), "next decision")

    async def _decide_once(self, namespace: str, name: str) -> None:
        now = workflow.now()
        scale = await read_scale(namespace, name, self._input.version)
        if isinstance(scale, str):
            self._details(scale)
            return
        signals = await read_signals(namespace, name, {**acts.DEFAULT_SIGNAL_QUERIES, **self._input.queries}, self._input.window)
        if self._policy.forecast_horizon_seconds > 0 and workflow.patched("forecast"):
            await self._forecast(now, namespace, name)
        floor = self._floor(now)
        if workflow.patched("decide-on-ready"):
            ready, policy = scale.ready_replicas, self._policy
        else:  # a run that decided before this change replays the decisions it recorded: spec-only, -1 per step
            ready, policy = None, self._policy.model_copy(update={"scale_down_step_percent": 0})
        if not workflow.patched("slo-sizing"):  # decisions recorded before SLO sizing: DCGM utilisation triggered
            policy = policy.model_copy(update={"gpu_util_trigger": True})
        if not workflow.patched("ratio-step-up"):  # decisions recorded before: a ratio trigger asked for the whole ratio
            policy = policy.model_copy(update={"ratio_step_up_percent": None})
        if policy.completion_slo is not None and not workflow.patched("batch-completion-slo"):
            policy = policy.model_copy(update={"completion_p95_slo_seconds": None})  # decided on TTFT before
        frozen = None
        if scale.canary is not None and workflow.patched(ANALYSIS_FREEZE_PATCH):
            frozen = f"{scale.canary} is a canary in analysis"
        decision: ScalingDecision = decide(
            now.timestamp(), scale.replicas, signals, policy, self._state, floor, ready=ready, floor_by=self._floor_by(),
            scale_in_frozen=frozen,
        )
        if policy.monthly_budget is not None and decision.desired > scale.replicas and workflow.patched(BUDGET_PATCH):
            decision = await self._within_budget(namespace, name, now, scale, decision)
        self._state = decision.state
        record = DecisionRecord(
            at=now,
            current=scale.replicas,
            desired=decision.desired,
            ready=scale.ready_replicas,
            unschedulable=scale.unschedulable,
            floor=floor,
            reason=decision.reason,
            capped_by=decision.capped_by,
            triggers=decision.triggers,
            signals=signals,
        )
        if scale.priority_class and scale.priority_class != self._policy.priority_class:
            record.reason += (
                f"; the Deployment declares class {scale.priority_class}, the policy {self._policy.priority_class}"
            )
        mixed = self._policy.spot_mix is not None and workflow.patched(SPOT_MIX_PATCH)
        if mixed:
            await self._apply_spot_mix(namespace, name, scale.version, decision.desired, self._policy.spot_mix, record)
        elif decision.desired != scale.replicas:
            failed = await scale_to(namespace, name, scale, decision.desired)
            record.applied = failed is None
            if failed:
                record.reason += f"; scaling failed: {failed}"
        if not mixed and self._warm_floor is not None:  # the spot mix was turned off: its floor lapses
            await self._claim_warm_floor(None, 0, record)
        if self._policy.cpu_fallback is not None:
            await self._cpu_fallback(now, decision.desired, scale, record)
        await self._set_queue_limit(namespace, name, scale.ready_replicas, record)
        self._decisions = [*self._decisions, record][-DECISIONS_KEPT:]
        self._record_metrics(namespace, name, scale, decision, record.applied, now)
        self._details()
        await self._record_decision(namespace, name, scale.replicas, decision)

    async def _forecast(self, now: datetime, namespace: str, name: str) -> None:
        """Every ``forecast_every_seconds``: the demand's peak over the cold-start horizon, sized by
        the SLO model, held as the ``forecast`` floor, so a ramp finds its replicas Ready. The floor
        lapses after two periods without a forecast (Prometheus down): the loop falls back to reacting."""
        p = self._policy
        held = self._floors.get(FORECAST_FLOOR)
        every = timedelta(seconds=p.forecast_every_seconds)
        # the floor holds until the next forecast: it must cover that wait, a decision interval and the cold start
        horizon = p.forecast_horizon_seconds + p.forecast_every_seconds + self._input.interval_seconds
        if held is not None and held.expires_at is not None and now < held.expires_at - every:
            return
        try:
            forecast = await workflow.execute_activity_method(
                ScalingActivities.forecast_demand,
                acts.DemandForecastInput(
                    namespace=namespace,
                    deployment=name,
                    at=now.timestamp(),
                    horizon_seconds=horizon,
                    error_quantile=p.forecast_error_quantile,
                ),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=SHORT_RETRY,
                summary=f"demand forecast, {horizon:.0f}s ahead",
            )
        except ActivityError as err:
            self._details(f"demand forecast failed: {cause(err)}")
            return
        reason = f"{forecast.basis}: {forecast.upper:.3g} req/s within {horizon:.0f}s"
        self._floors[FORECAST_FLOOR] = FloorClaim(
            replicas=slo_replicas(forecast.upper, p), expires_at=now + 2 * every, reason=reason
        )

    async def _within_budget(
        self, namespace: str, name: str, now: datetime, scale: acts.ScaleStatus, decision: ScalingDecision
    ) -> ScalingDecision:
        """Cut growth the monthly budget cannot pay for (workflows/cost/budget.py); a protected
        realtime class keeps it. Spend unreadable: the growth goes ahead, said in the reason."""
        budget = self._policy.monthly_budget
        verdict = await judge_growth(budget, now, scale.replicas, decision.desired, self._policy.gpus_per_replica,
                                     CAPACITY_FOR_CLASS[self._policy.priority_class])
        if isinstance(verdict, str):
            return decision.model_copy(update={"reason": f"{decision.reason}; {verdict}"})
        if not verdict.over_budget:
            return decision
        pool = scale.priority_class or self._policy.priority_class
        telemetry.budget_refusal(workflow.metric_meter(), namespace, name, pool, "protected" if budget.protected else "refused")
        update = {"reason": f"{decision.reason}; {verdict.reason}"}
        if verdict.refused:
            update.update(desired=verdict.allowed, capped_by="monthly_budget")
            if verdict.allowed <= scale.replicas:
                update["cause"] = "budget"
        return decision.model_copy(update=update)

    async def _apply_spot_mix(
        self, namespace: str, name: str, version: str, total: int, mix: SpotMixPolicy, record: DecisionRecord
    ) -> None:
        """Place the total as ``plan_mix`` says (workflows/spot/mix.py), written when the split changes.

        Every decision reads the pools and extends their availability history, so a pool lost now
        is left and a pool lost often is rated as such, as in the benchmark's replay. A pool that
        cannot be read keeps the last split (the reason says why).
        """
        try:
            now = await workflow.execute_activity_method(
                SpotMixActivities.read_spot_domains, SpotDomainsInput(domains=mix.domains),
                start_to_close_timeout=timedelta(seconds=30), retry_policy=SHORT_RETRY, summary="read spot pools",
            )
        except ActivityError as err:
            record.reason += f"; spot pools unreadable, split kept: {cause(err)}"
            return
        self._spot_history = observe(self._spot_history, now.domains, mix.window_samples)
        plan = plan_spot_mix(total, mix, now.domains, self._spot_history)
        split = SpotMixRecord(
            version=version, spot=replicas_per_pool(plan, mix), on_demand=plan.on_demand, availability=round(plan.availability, 6),
            cost_per_hour=round(plan.cost_per_hour, 4), unavailable=[d.pool for d in now.domains if not d.available],
            warm_pool=warm_pool_needed(plan, markets(mix, now.domains, self._spot_history)),
        )
        record.spot_mix = split
        await self._claim_warm_floor(mix.on_demand_pool, split.warm_pool, record)
        applied = self._spot_mix_applied
        same = applied is not None and (applied.version, applied.spot, applied.on_demand) == (split.version, split.spot, split.on_demand)
        handing_over = applied is not None and applied.own > 0  # the version's own replicas still carry part of it
        if same and total == record.current and not (handing_over and workflow.patched(SPOT_MIX_HANDOVER_PATCH)):
            return
        try:
            result = await workflow.execute_activity_method(
                SpotMixActivities.apply_spot_mix,
                ApplySpotMixInput(deployment=DeploymentRef(namespace=namespace, name=name), version=version, total=total,
                                  spot=split.spot, on_demand=split.on_demand),
                start_to_close_timeout=timedelta(seconds=30), retry_policy=SHORT_RETRY,
                summary=f"spot mix of {name}: {total} = spot {sum(split.spot.values())} + on-demand {split.on_demand}",
            )
            if result is not None and result.own and workflow.patched(SPOT_MIX_HANDOVER_PATCH):
                split.own = result.own
                record.reason += f"; {result.own} replica(s) stay on {version}'s own Deployment until the pools hold them Ready"
            self._spot_mix_applied = split
            record.applied = True
        except ActivityError as err:
            record.reason += f"; spot mix not applied: {cause(err)}"

    async def _claim_warm_floor(self, pool: str | None, replicas: int, record: DecisionRecord) -> None:
        """Claim the mix's warm pool need on ``pool``'s NodePoolScaling, the one writer of that
        group's warm pool, when it changes; a claim left on another pool (or none wanted) drops to 0.
        A failed signal (no such loop) is reported in the decision and tried again next time."""
        held = self._warm_floor
        wanted = WarmFloorClaim(pool=pool, replicas=replicas) if pool is not None and replicas > 0 else None
        if claimed(wanted) == claimed(held) or not workflow.patched(SPOT_WARM_FLOOR_PATCH):
            return
        sends = [wanted] if wanted is not None else []
        if held is not None and (wanted is None or held.pool != wanted.pool):
            sends.insert(0, WarmFloorClaim(pool=held.pool, replicas=0))
        for claim in sends:
            failed = await self._send_warm_floor(claim)
            if failed:
                record.reason += f"; warm pool floor {claim.replicas} not claimed on {claim.pool}: {failed}"
                return

    async def _renew_warm_floor(self) -> None:
        """Claim the held floor again when a quarter of its TTL has passed, so NodePoolScaling keeps
        it; a loop that stops renewing (terminated) loses it after the TTL."""
        held = self._warm_floor
        if held is None or self._until_renewal() > timedelta(0) or not workflow.patched(WARM_FLOOR_RENEW_PATCH):
            return
        failed = await self._send_warm_floor(held)
        if failed:
            self._details(f"warm pool floor {held.replicas} not renewed on nodepool/{held.pool}: {failed}")

    def _until_renewal(self) -> timedelta:
        """How long until the held claim is renewed (claims sent before they lapsed: now)."""
        held = self._warm_floor
        if held is None or held.claimed_at is None:
            return timedelta(0)
        every = timedelta(seconds=claim_ttl_seconds(self._input.interval_seconds) / CLAIM_RENEWALS_PER_TTL)
        return held.claimed_at + every - workflow.now()

    async def _send_warm_floor(self, claim: WarmFloorClaim) -> str | None:
        """Signal ``claim`` (0 replicas: drop it) to its pool's NodePoolScaling, with a TTL a few of
        this loop's intervals long; None when sent, else why not."""
        ttl = claim_ttl_seconds(self._input.interval_seconds) if claim.replicas > 0 and workflow.patched(WARM_FLOOR_RENEW_PATCH) else None
        try:
            await workflow.get_external_workflow_handle(naming.node_pool_workflow_id(claim.pool)).signal(
                WARM_POOL_FLOOR_SIGNAL,
                WarmPoolFloor(source=self._input.deployment, replicas=claim.replicas, gpus_per_replica=self._policy.gpus_per_replica,
                              ttl_seconds=ttl),
            )
        except FailureError as err:
            return cause(err)
        self._warm_floor = claim.model_copy(update={"claimed_at": workflow.now() if ttl else None}) if claim.replicas > 0 else None
        return None

    async def _set_queue_limit(self, namespace: str, name: str, ready: int, record: DecisionRecord) -> None:
        """Tell the gateway how many requests the Ready replicas serve within the SLO
        (workflows/scaling/queue_limit.py); written when it changes, beyond it clients get 429.
        Turned off (``update_policy``), the limit this loop wrote is taken out of the route's policy."""
        if not self._policy.gateway_queue_limit:
            if self._queue_limit_written and workflow.patched(QUEUE_LIMIT_OFF_PATCH):
                await self._clear_queue_limit(namespace, name, record)
            return
        limit = queue_limit(ready, self._policy)
        if limit == self._queue_limit or not workflow.patched(QUEUE_LIMIT_PATCH):
            return
        try:
            await workflow.execute_activity_method(
                ScalingActivities.set_queue_limit,
                acts.QueueLimitInput(deployment=DeploymentRef(namespace=namespace, name=name), limit=limit),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=SHORT_RETRY,
                summary=f"gateway queue limit of {name}: {limit.max_pending_requests} waiting requests",
            )
            self._queue_limit, self._queue_limit_written = limit, True
        except ActivityError as err:
            record.reason += f"; queue limit not set: {cause(err)}"

    async def _clear_queue_limit(self, namespace: str, name: str, record: DecisionRecord) -> None:
        """Take the queue limit's fields out of the route's policy (the quotas' stay); a failure is in
        the decision's reason and is tried again next decision."""
        try:
            outcome = await workflow.execute_activity_method(
                ScalingActivities.clear_queue_limit,
                acts.ClearQueueLimitInput(deployment=DeploymentRef(namespace=namespace, name=name)),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=SHORT_RETRY,
                summary=f"gateway queue limit of {name} off",
            )
        except ActivityError as err:
            record.reason += f"; queue limit not removed: {cause(err)}"
            return
        self._queue_limit, self._queue_limit_written = None, False
        record.reason += f"; gateway queue limit removed ({outcome})"

    async def _cpu_fallback(self, now: datetime, desired: int, scale: acts.ScaleStatus, record: DecisionRecord) -> None:
        """Batch only: scale the declared CPU deployment up while GPU replicas stay unavailable."""
        fallback = self._policy.cpu_fallback
        verdict = decide_fallback(
            now.timestamp(), desired, scale.ready_replicas, scale.unschedulable, fallback, self._fallback
        )
        self._fallback = verdict.state
        record.fallback_replicas, record.fallback_reason = verdict.replicas, verdict.reason
        if verdict.replicas == self._fallback_applied:
            return
        namespace, name = naming.split_deployment(fallback.deployment)
        try:
            await workflow.execute_activity_method(
                RolloutActivities.scale_version,
                ScaleVersionInput(
                    deployment=DeploymentRef(namespace=namespace, name=name),
                    version=fallback.version,
                    replicas=verdict.replicas,
                ),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=SHORT_RETRY,
                summary=f"CPU fallback {fallback.deployment} -> {verdict.replicas}",
            )
            self._fallback_applied = verdict.replicas
        except ActivityError as err:
            record.fallback_reason += f"; scaling the fallback failed: {cause(err)}"

    def _record_metrics(
        self, namespace: str, name: str, scale: acts.ScaleStatus, decision: ScalingDecision, applied: bool, now: datetime
    ) -> None:
        """Replicas desired/Ready, and the scale-up in flight: finished when its replicas are all
        Ready (cold start from its decision), given up when the loop scaled down first."""
        meter = workflow.metric_meter()
        pool = scale.priority_class or self._policy.priority_class
        capacity = CAPACITY_FOR_CLASS.get(pool, "unknown")
        telemetry.replicas(meter, namespace, name, pool, capacity, decision.desired, scale.ready_replicas)
        pending = self._scale_up
        if pending is not None:
            if scale.ready_replicas >= pending.target:
                seconds = (now - pending.decided_at).total_seconds()
                telemetry.scale_up_finished(meter, namespace, name, pending.pool, ready=True, seconds=seconds)
                self._last_scale_up = LastScaleUp(at=now, replicas=pending.target, seconds=seconds, cold_start=scale.cold_start)
                self._scale_up = pending = None
            elif applied and decision.desired < scale.replicas:
                telemetry.scale_up_finished(meter, namespace, name, pending.pool, ready=False, seconds=0)
                self._scale_up = pending = None
        if applied and decision.desired > scale.replicas:
            if pending is None:
                telemetry.scale_up_started(meter, namespace, name, pool)
                self._scale_up = PendingScaleUp(decided_at=now, target=decision.desired, pool=pool)
            else:  # more replicas asked before the first ones were Ready: the same scale-up, grown
                self._scale_up = pending.model_copy(update={"target": decision.desired})

    async def _record_decision(self, namespace: str, name: str, current: int, decision: ScalingDecision) -> None:
        """Count the decision in the control-plane metrics (best effort: metrics never block scaling)."""
        direction = "up" if decision.desired > current else "down" if decision.desired < current else "hold"
        if direction == "hold" and decision.cause not in NOTABLE_HOLDS:
            return
        if workflow.patched(telemetry.METER_PATCH):
            telemetry.scaling_decision(workflow.metric_meter(), namespace, name, direction, decision.cause)
            return
        try:  # a run that recorded through an activity before replays the activity it scheduled
            await workflow.execute_activity(
                telemetry.LEGACY_SCALING_DECISION,
                {"namespace": namespace, "deployment": name, "direction": direction, "reason": decision.cause},
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=2),
                summary=f"metric: {direction} ({decision.cause})",
            )
        except ActivityError:
            pass

    def _floor(self, now: datetime) -> int:
        self._floors = {k: c for k, c in self._floors.items() if c.expires_at is None or c.expires_at > now}
        return max((c.replicas for c in self._floors.values()), default=0)

    def _floor_by(self) -> str:
        """Who holds the highest floor (after ``_floor`` dropped the lapsed ones)."""
        held = [(c.replicas, floor_label(source, c)) for source, c in self._floors.items()]
        return max(held)[1] if held else "floor"

    def _carry(self) -> ScalingCarry:
        return ScalingCarry(
            state=self._state,
            floors=self._floors,
            paused=self._paused,
            pause_reason=self._pause_reason,
            decisions=self._decisions,
            runs=self._runs + 1,
            fallback=self._fallback,
            fallback_applied=self._fallback_applied,
            scale_up=self._scale_up,
            last_scale_up=self._last_scale_up,
            spot_history=self._spot_history,
            spot_mix_applied=self._spot_mix_applied,
            warm_floor=self._warm_floor,
            queue_limit_written=self._queue_limit_written,
        )

    def _details(self, note: str = "") -> None:
        p = self._policy
        floors = ", ".join(f"{k} {c.replicas}" for k, c in self._floors.items()) or "none"
        lines = [
            f"**{self._input.deployment}** · {p.priority_class} ({CAPACITY_FOR_CLASS[p.priority_class]} GPUs)"
            f" · policy min {p.min_replicas} / max {p.max_replicas} · floors: {floors}"
            + (f" · budget ${p.monthly_budget.monthly_usd:,.0f}/month{' (protected)' if p.monthly_budget.protected else ''}"
               if p.monthly_budget else "")
        ]
        if note:
            lines.append(f"⚠ {note}")
        if self._decisions:
            d = self._decisions[-1]
            lines.append(
                f"last decision {d.at:%Y-%m-%d %H:%M:%S}Z: **{d.current} → {d.desired}**"
                f" ({d.ready} ready{f', {d.unschedulable} Pending unschedulable' if d.unschedulable else ''}): {d.reason}"
            )
            if d.unschedulable:
                lines.append(
                    f"{d.unschedulable} replica(s) wait for {CAPACITY_FOR_CLASS[p.priority_class]} GPU capacity:"
                    f" the NodePoolScaling loop of that pool grows it for them"
                )
            if self._last_scale_up is not None:
                lines.append(cold_start_line(self._last_scale_up))
            if d.spot_mix:
                m = d.spot_mix
                lines.append(
                    "spot mix: " + ", ".join(f"{pool} {n}" for pool, n in m.spot.items()) + f" · on-demand {m.on_demand}"
                    + f" · P(at target) {m.availability:.4f} · ${m.cost_per_hour:,.2f}/h · warm pool wanted {m.warm_pool}"
                    + (f" (claimed on nodepool/{self._warm_floor.pool})" if self._warm_floor else "")
                    + (f" · unavailable: {', '.join(m.unavailable)}" if m.unavailable else "")
                )
            if d.fallback_reason:
                lines.append(f"CPU fallback {p.cpu_fallback.deployment if p.cpu_fallback else ''}: {d.fallback_reason}")
            if d.triggers:
                lines.append(
                    "| trigger | value | target | wants |\n|---|---|---|---|\n"
                    + "\n".join(f"| {t.name}{' 🔺' if t.fired else ''} | {t.value:g} | {t.target:g} | {t.replicas} |" for t in d.triggers)
                )
        workflow.set_current_details("\n\n".join(lines))

    @workflow.signal(name="pause")
    def pause(self, note: Any = None) -> None:
        # README's `signal --name pause` sends no reason; status must still say why it holds (issue 16).
        # Any payload pauses (the SDK drops one it cannot decode, issue 33); what was not understood is said.
        taken, problem = understood(OperatorNote, note, "pause")
        reason = taken.reason or "paused by operator"
        self._paused, self._pause_reason = True, f"{reason} ({problem})" if problem else reason

    @workflow.signal(name="resume")
    def resume(self, note: Any = None) -> None:
        self._paused, self._pause_reason = False, ""
        self._wake = True

    @workflow.signal(name=SET_FLOOR_SIGNAL)
    def set_floor(self, request: SetFloor) -> None:
        expires = workflow.now() + timedelta(seconds=request.ttl_seconds) if request.ttl_seconds else None
        self._floors[request.source] = FloorClaim(replicas=request.replicas, expires_at=expires, reason=request.reason)
        self._wake = True

    # The patch arrives as plain JSON and is validated here, so a bad field is refused naming it
    # (non-retryable), not as the converter's raw ValidationError marked retryable (issue 16).
    @workflow.update(name="update_policy")
    def update_policy(self, patch: dict[str, Any] | None = None) -> ScalingPolicy:
        self._policy = self._patched(patch)
        self._wake = True
        return self._policy

    @update_policy.validator
    def _validate_policy(self, patch: dict[str, Any] | None = None) -> None:
        self._patched(patch)

    def _patched(self, raw: dict[str, Any] | None) -> ScalingPolicy:
        patch = validated(PolicyPatch, raw, "update_policy")
        return validated(ScalingPolicy, {**self._policy.model_dump(), **patch.model_dump(exclude_none=True)}, "update_policy")

    @workflow.query(name="status")
    def status(self) -> ScalingStatus:
        return ScalingStatus(
            deployment=self._input.deployment,
            paused=self._paused,
            pause_reason=self._pause_reason,
            policy=self._policy,
            floor=max((c.replicas for c in self._floors.values()), default=0),
            floors=self._floors,
            decisions=self._decisions,
            runs=self._runs,
            iteration=self._iteration,
            last_scale_up=self._last_scale_up,
        )

