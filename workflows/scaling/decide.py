"""The reactive scaling decision: signals in, desired replicas out, with the reason.

Pure code on plain values (pydantic models, floats, ints), so the ReactiveScaling workflow, the
unit tests and the offline scaling benchmark run the very same rules:

- up at once when any trigger is above its target, by enough replicas to absorb the load in one
  step (queue: ``ready + ceil(waiting / per-replica capacity)``), capped by ``max_step_up``;
- the load is measured on the replicas that serve (Ready), so the triggers size the fleet from
  ``ready``; replicas still starting (node boot, weight load: minutes) count toward that want,
  so a decision during a cold start only adds what they do not already cover, and a new
  decision every interval does not multiply the fleet again (like Kubernetes' HPA);
- several triggers combine by taking the maximum (like KEDA);
- down only after the load has stayed below target for the stabilisation window AND the
  cooldown since the last change has passed, one step at a time: ``scale_down_step_percent`` of
  the fleet (at least one replica, never below what the load needs), so a fleet of 200 halves
  in about an hour while a fleet of 8 still steps one replica at a time;
- never below the floor (schedules, pre-warm) or ``min_replicas``; ``max_replicas`` and the GPU
  budget always hold, and hitting the budget is reported;
- blind (metric source down or no data at all): hold, never scale down on missing data.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field, model_validator

from workflows.scaling.cpu_fallback import CpuFallback
from workflows.scaling.placement import PoolClass


class ScalingPolicy(BaseModel):
    """Targets and pacing of one deployment's loop; changed live by the ``update_policy`` update."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(8, ge=0)
    queue_per_replica: float = Field(
        5, ge=0, description="waiting requests per replica tolerated before the queue trigger fires"
    )
    queue_capacity_per_replica: float = Field(
        20, gt=0, description="waiting requests one added replica absorbs: +ceil(waiting / this)"
    )
    ttft_p99_slo_seconds: float = Field(2.0, gt=0)
    gpu_util_target_percent: float = Field(80, gt=0, le=100)
    gpu_util_sustain_seconds: float = Field(120, ge=0, description="utilisation must stay above target this long")
    kv_cache_target: float = Field(0.9, gt=0, le=1, description="KV-cache usage fraction")
    stabilisation_seconds: float = Field(300, ge=0, description="load below target this long before a step down")
    cooldown_seconds: float = Field(600, ge=0, description="since the last change before a step down")
    max_step_up: int = Field(16, ge=1, description="most replicas added by one decision")
    scale_down_step_percent: float = Field(
        10, ge=0, le=100, description="one step down removes max(1, floor(current * this / 100)) replicas"
    )
    max_gpus: int | None = Field(None, ge=0, description="budget guard: GPUs the deployment may hold")
    gpus_per_replica: int = Field(1, ge=0)
    priority_class: PoolClass = Field(
        "realtime",
        description="realtime: on-demand GPUs, floor kept (min_replicas >= 1); batch: spot, may scale to zero",
    )
    cpu_fallback: CpuFallback | None = Field(
        None, description="batch only: CPU deployment scaled up while GPU replicas are unavailable"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ScalingPolicy:
        if self.priority_class == "realtime" and self.min_replicas < 1:
            raise ValueError(
                "a realtime deployment keeps its floor: min_replicas must be >= 1 (only batch scales to zero)"
            )
        if self.cpu_fallback is not None and self.priority_class != "batch":
            raise ValueError("cpu_fallback is for the batch class only (priority_class is realtime)")
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})")
        if self.max_gpus is not None and self.min_replicas * self.gpus_per_replica > self.max_gpus:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) x gpus_per_replica ({self.gpus_per_replica})"
                f" exceeds max_gpus ({self.max_gpus})"
            )
        return self

    @property
    def budget_replicas(self) -> int | None:
        """Most replicas the GPU budget pays for (None: no budget)."""
        if self.max_gpus is None or self.gpus_per_replica == 0:
            return None
        return self.max_gpus // self.gpus_per_replica


class Signals(BaseModel):
    """What the metric source says about a deployment now; None where it has no value."""

    queue_waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = Field(None, description="fraction 0..1 (max over replicas)")
    ttft_p99_seconds: float | None = None
    gpu_util_percent: float | None = Field(None, description="mean over the deployment's GPUs, 0..100")
    error: str | None = Field(None, description="why the metric source could not be read")

    @property
    def blind(self) -> bool:
        return self.error is not None or all(
            v is None for v in (self.queue_waiting, self.kv_cache_usage, self.ttft_p99_seconds, self.gpu_util_percent)
        )


class ScalerState(BaseModel):
    """What the rules remember between decisions (carried across continue-as-new)."""

    last_change_s: float | None = None
    below_since_s: float | None = Field(None, description="start of the current run of below-target decisions")
    util_above_since_s: float | None = None


class Trigger(BaseModel):
    name: str
    value: float
    target: float
    fired: bool
    replicas: int = Field(description="replicas this trigger asks for")


TRIGGER_CAUSES = {"queue": "queue_depth", "ttft_p99": "ttft", "kv_cache": "kv_cache", "gpu_util": "gpu_util"}
# Holds worth counting in the decisions metric; the others (at target, waiting out the window or
# the cooldown) are the loop idling.
NOTABLE_HOLDS = frozenset({"metric_fallback", "budget", "max_replicas"})


class ScalingDecision(BaseModel):
    desired: int
    reason: str
    cause: str = Field(
        description="low-cardinality why, the decisions metric's reason label: a trigger (queue_depth, ttft, kv_cache,"
        " gpu_util), starting, below_target, stabilising, cooldown, at_target, metric_fallback, floor, max_replicas or budget"
    )
    triggers: list[Trigger] = Field(default_factory=list)
    capped_by: str | None = Field(None, description="max_replicas | max_step_up | budget, when a cap cut the step")
    state: ScalerState


def _ratio_replicas(ready: int, value: float, target: float) -> int:
    """HPA-style ``ceil(ready * value / target)``, at least one more than serve now when above target."""
    return max(ready + 1, math.ceil(max(ready, 1) * value / target))


def _triggers(now_s: float, ready: int, s: Signals, p: ScalingPolicy, util_since: float | None) -> list[Trigger]:
    """Each trigger's want, from the replicas whose load the signals measure (the Ready ones)."""
    out: list[Trigger] = []
    if s.queue_waiting is not None:
        limit = p.queue_per_replica * max(ready, 1)
        fired = s.queue_waiting > limit
        extra = math.ceil(s.queue_waiting / p.queue_capacity_per_replica) if fired else 0
        out.append(Trigger(name="queue", value=s.queue_waiting, target=limit, fired=fired, replicas=ready + extra))
    if s.ttft_p99_seconds is not None:
        fired = s.ttft_p99_seconds > p.ttft_p99_slo_seconds
        want = _ratio_replicas(ready, s.ttft_p99_seconds, p.ttft_p99_slo_seconds) if fired else ready
        out.append(Trigger(name="ttft_p99", value=s.ttft_p99_seconds, target=p.ttft_p99_slo_seconds, fired=fired, replicas=want))
    if s.kv_cache_usage is not None:
        fired = s.kv_cache_usage > p.kv_cache_target
        want = _ratio_replicas(ready, s.kv_cache_usage, p.kv_cache_target) if fired else ready
        out.append(Trigger(name="kv_cache", value=s.kv_cache_usage, target=p.kv_cache_target, fired=fired, replicas=want))
    if s.gpu_util_percent is not None:
        sustained = util_since is not None and now_s - util_since >= p.gpu_util_sustain_seconds
        fired = s.gpu_util_percent > p.gpu_util_target_percent and sustained
        want = _ratio_replicas(ready, s.gpu_util_percent, p.gpu_util_target_percent) if fired else ready
        out.append(Trigger(name="gpu_util", value=s.gpu_util_percent, target=p.gpu_util_target_percent, fired=fired, replicas=want))
    return out


def _needed(current: int, ready: int, s: Signals, p: ScalingPolicy) -> int:
    """Replicas the load justifies when no trigger fires; ``current`` when that cannot be told.

    Measured on the Ready replicas; the ones still starting count as needed (as if at target),
    so replicas that have not served yet are never taken for spare capacity.
    """
    if s.gpu_util_percent is None or s.queue_waiting is None or s.queue_waiting > 0:
        return current
    needed = math.ceil(ready * s.gpu_util_percent / p.gpu_util_target_percent)
    if s.kv_cache_usage is not None:
        needed = max(needed, math.ceil(ready * s.kv_cache_usage / p.kv_cache_target))
    return needed + current - ready


def down_step(current: int, policy: ScalingPolicy) -> int:
    """Replicas one step down removes: ``scale_down_step_percent`` of the fleet, at least one."""
    return max(1, math.floor(current * policy.scale_down_step_percent / 100))


def _fmt(t: Trigger) -> str:
    return f"{t.name} {t.value:g} > {t.target:g} (wants {t.replicas})"


def decide(
    now_s: float,
    current: int,
    signals: Signals,
    policy: ScalingPolicy,
    state: ScalerState,
    floor: int = 0,
    ready: int | None = None,
) -> ScalingDecision:
    """Desired replicas for a deployment at ``now_s`` (seconds on any monotonic clock).

    ``current`` is the replicas asked for (the Deployment's spec), ``ready`` those serving, whose
    load the signals measure (default: all of ``current``).
    """
    ready = current if ready is None else max(0, min(ready, current))
    util_high = signals.gpu_util_percent is not None and signals.gpu_util_percent > policy.gpu_util_target_percent
    util_since = (state.util_above_since_s if state.util_above_since_s is not None else now_s) if util_high else None
    below_since = state.below_since_s
    triggers: list[Trigger] = []
    capped_by: str | None = None

    if signals.blind:
        desired = current
        below_since = None
        reason = f"hold at {current}: metrics unavailable ({signals.error or 'no data'})"
        cause = "metric_fallback"
    else:
        triggers = _triggers(now_s, ready, signals, policy, util_since)
        fired = [t for t in triggers if t.fired]
        needed = _needed(current, ready, signals, policy)
        if fired:
            below_since = None
            top = max(fired, key=lambda t: t.replicas)
            reason = "; ".join(_fmt(t) for t in fired)
            if top.replicas <= current:
                desired, cause = current, "starting"
                reason = f"hold at {current}: {current - ready} starting replica(s) cover the want ({reason})"
            else:
                desired, cause = top.replicas, TRIGGER_CAUSES[top.name]
                if desired > current + policy.max_step_up:
                    desired, capped_by = current + policy.max_step_up, "max_step_up"
                reason = "up: " + reason + (f" ({ready} of {current} ready)" if ready < current else "")
        elif needed < current:
            below_since = now_s if below_since is None else below_since
            quiet_for = now_s - below_since
            since_change = math.inf if state.last_change_s is None else now_s - state.last_change_s
            if quiet_for < policy.stabilisation_seconds:
                desired, cause = current, "stabilising"
                reason = f"hold at {current}: below target for {quiet_for:.0f}s of {policy.stabilisation_seconds:.0f}s window"
            elif since_change < policy.cooldown_seconds:
                desired, cause = current, "cooldown"
                reason = f"hold at {current}: cooldown, {since_change:.0f}s of {policy.cooldown_seconds:.0f}s since last change"
            else:
                desired, cause = max(needed, current - down_step(current, policy)), "below_target"
                reason = (
                    f"down one step ({current} -> {desired}, the load needs {needed}): below target for"
                    f" {quiet_for:.0f}s, {since_change:.0f}s since last change"
                )
        else:
            below_since = None
            desired, cause = current, "at_target"
            reason = f"hold at {current}: at target"

    lower = max(policy.min_replicas, floor)
    if desired < lower:
        desired, cause = lower, "floor"
        reason += f"; raised to floor {lower} (min {policy.min_replicas}, schedule/pre-warm {floor})"
    if desired > policy.max_replicas:
        desired, capped_by = policy.max_replicas, "max_replicas"
        cause = capped_by if desired <= current else cause
        reason += f"; capped at max_replicas {policy.max_replicas}"
    budget = policy.budget_replicas
    if budget is not None and desired > budget:
        desired, capped_by = budget, "budget"
        cause = capped_by if desired <= current else cause
        reason += f"; budget guard: {policy.max_gpus} GPUs allow {budget} replicas"

    last_change = state.last_change_s
    if desired != current:
        last_change, below_since = now_s, None
    return ScalingDecision(
        desired=desired,
        reason=reason,
        cause=cause,
        triggers=triggers,
        capped_by=capped_by,
        state=ScalerState(last_change_s=last_change, below_since_s=below_since, util_above_since_s=util_since),
    )
