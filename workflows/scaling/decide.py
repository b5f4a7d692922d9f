"""The reactive scaling decision: signals in, desired replicas out, with the reason.

Pure code on plain values (pydantic models, floats, ints), so the ReactiveScaling workflow, the
unit tests and the offline scaling benchmark run the very same rules:

- sized to the SLO, not to a utilisation target: from the arrival rate (requests/s the deployment
  starts serving), each replica's service rate and its unloaded TTFT, an M/M/c (Erlang C) model
  with a burstiness factor predicts the p99 TTFT of a candidate replica count; the fleet wants the
  fewest replicas whose prediction is within ``slo_margin`` of the TTFT SLO, so the headroom grows
  with the square root of the load instead of a fixed fraction of it;
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

DCGM's GPU utilisation is not a default trigger: under vLLM it is a duty cycle (a kernel runs
whenever any request is in the batch), so it reads ~100 % at light load and never shows spare
capacity. ``gpu_util_trigger`` turns it back on (and lets it size scale-down, as before).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field, model_validator

from workflows.core.bounds import DAY_SECONDS, MAX_GPUS_PER_REPLICA, MAX_REPLICAS, Replicas, SecondsOrZero
from workflows.cost.budget import MonthlyBudget
from workflows.scaling.completion import drain_replicas, drain_seconds
from workflows.scaling.cpu_fallback import CpuFallback
from workflows.core.pools import PoolClass
from workflows.spot.mix import SpotMixPolicy


class ScalingPolicy(BaseModel):
    """Targets and pacing of one deployment's loop; changed live by the ``update_policy`` update."""

    min_replicas: Replicas = 1
    max_replicas: Replicas = 8
    queue_per_replica: float = Field(
        5, ge=0, description="waiting requests per replica tolerated before the queue trigger fires"
    )
    queue_capacity_per_replica: float = Field(
        20, gt=0, description="waiting requests one added replica absorbs: +ceil(waiting / this)"
    )
    ttft_p99_slo_seconds: float = Field(2.0, gt=0)
    completion_p95_slo_seconds: float | None = Field(
        None, gt=0, description="batch only: the class's SLO in completion time (p95 end to end, and the backlog's drain"
        " time), which replaces the TTFT triggers (workflows/scaling/completion.py)"
    )
    replica_capacity_rps: float = Field(
        4, gt=0, description="requests/s one replica serves at full batch, at the deployment's usual request sizes"
        " (the SLO model's per-replica service rate; a load test or the fleet model measures it)"
    )
    replica_ttft_seconds: float = Field(0.2, ge=0, description="p99 TTFT of a replica with no queue (front end + prefill)")
    arrival_burstiness: float = Field(
        1.0, gt=0, description="multiplies the predicted queueing delay: 1 for Poisson arrivals, more for bursty"
        " ones (Kingman's (ca^2 + cs^2) / 2)"
    )
    slo_margin: float = Field(0.8, gt=0, le=1, description="the predicted p99 TTFT must stay within this share of the SLO")
    gpu_util_trigger: bool = Field(
        False, description="scale on DCGM utilisation too (off: under vLLM it reads ~100 % whenever a batch runs)"
    )
    gpu_util_target_percent: float = Field(80, gt=0, le=100)
    gpu_util_sustain_seconds: SecondsOrZero = Field(120, description="utilisation must stay above target this long")
    kv_cache_target: float = Field(0.9, gt=0, le=1, description="KV-cache usage fraction")
    stabilisation_seconds: SecondsOrZero = Field(300, description="load below target this long before a step down")
    cooldown_seconds: SecondsOrZero = Field(600, description="since the last change before a step down")
    max_step_up: int = Field(16, ge=1, le=MAX_REPLICAS, description="most replicas added by one decision")
    ratio_step_up_percent: float | None = Field(
        100, ge=1, description="most a ratio trigger (TTFT p99, KV cache, GPU utilisation, completion p95) adds in one"
        " decision, as a percentage of the Ready replicas (HPA's default scale-up policy: 100); null: the whole ratio"
    )
    scale_down_step_percent: float = Field(
        10, ge=0, le=100, description="one step down removes max(1, floor(current * this / 100)) replicas"
    )
    forecast_horizon_seconds: float = Field(
        0, ge=0, le=DAY_SECONDS, description="forecast demand this far ahead and hold the replicas its peak needs (the cold start:"
        " node, image, weights, compile, warm-up); 0: off"
    )
    forecast_error_quantile: float = Field(
        0.9, ge=0, le=1, description="the forecast is sized up by this quantile of its own recent actual/forecast ratios"
    )
    forecast_every_seconds: float = Field(
        300, gt=0, le=DAY_SECONDS, description="how often the loop reads the demand history and forecasts"
    )
    gateway_queue_limit: bool = Field(
        False, description="write the gateway's queue limit (an Envoy Gateway BackendTrafficPolicy on the route) from"
        " the Ready replicas' capacity within the SLO: beyond it requests get 429 at once (workflows/scaling/queue_limit.py)"
    )
    max_gpus: int | None = Field(None, ge=0, le=MAX_REPLICAS * MAX_GPUS_PER_REPLICA, description="budget guard: GPUs the deployment may hold")
    gpus_per_replica: int = Field(1, ge=0, le=MAX_GPUS_PER_REPLICA)
    priority_class: PoolClass = Field(
        "realtime",
        description="realtime: on-demand GPUs, floor kept (min_replicas >= 1); batch: spot, may scale to zero",
    )
    cpu_fallback: CpuFallback | None = Field(
        None, description="batch only: CPU deployment scaled up while GPU replicas are unavailable"
    )
    spot_mix: SpotMixPolicy | None = Field(
        None, description="batch only: place the replicas as the spot policy's plan_mix says, per spot pool plus an"
        " on-demand base (workflows/spot/mix.py), instead of scaling the versioned Deployment"
    )
    monthly_budget: MonthlyBudget | None = Field(
        None, description="growth that would take the month's GPU spend over this budget is refused (workflows/cost/budget.py)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ScalingPolicy:
        if self.priority_class == "realtime" and self.min_replicas < 1:
            raise ValueError(
                "a realtime deployment keeps its floor: min_replicas must be >= 1 (only batch scales to zero)"
            )
        if self.monthly_budget is not None and self.monthly_budget.protected and self.priority_class != "realtime":
            raise ValueError("monthly_budget.protected is for the realtime class only (priority_class is batch)")
        if self.completion_p95_slo_seconds is not None and self.priority_class != "batch":
            raise ValueError("completion_p95_slo_seconds is for the batch class only (realtime scales on TTFT)")
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
    def completion_slo(self) -> float | None:
        """The batch class's completion-time SLO, when it is the one this policy scales on."""
        return self.completion_p95_slo_seconds if self.priority_class == "batch" else None

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
    request_rate: float | None = Field(None, description="requests/s the deployment starts serving (first tokens)")
    rejected_rate: float | None = Field(
        None, description="requests/s its gateway refused (queue full, 429): demand the replicas did not see"
    )
    kv_cache_usage: float | None = Field(None, description="fraction 0..1 (max over replicas)")
    ttft_p99_seconds: float | None = None
    e2e_p95_seconds: float | None = Field(None, description="p95 end-to-end request latency (the batch SLO's measure)")
    gpu_util_percent: float | None = Field(None, description="mean over the deployment's GPUs, 0..100")
    error: str | None = Field(None, description="why the metric source could not be read")

    @property
    def blind(self) -> bool:
        return self.error is not None or all(
            v is None
            for v in (self.queue_waiting, self.request_rate, self.rejected_rate, self.kv_cache_usage, self.ttft_p99_seconds,
                      self.gpu_util_percent)
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


TRIGGER_CAUSES = {"completion": "completion_time", "slo": "slo", "queue": "queue_depth", "ttft_p99": "ttft", "kv_cache": "kv_cache", "gpu_util": "gpu_util"}
# Holds worth counting in the decisions metric; the others (at target, waiting out the window or
# the cooldown) are the loop idling.
NOTABLE_HOLDS = frozenset({"metric_fallback", "budget", "max_replicas"})


class ScalingDecision(BaseModel):
    desired: int
    reason: str
    cause: str = Field(
        description="low-cardinality why, the decisions metric's reason label: a trigger (slo, completion_time, queue_depth, ttft,"
        " kv_cache, gpu_util), starting, below_target, stabilising, analysis (scale-in frozen under a canary), cooldown, at_target, metric_fallback, floor, max_replicas or budget"
    )
    triggers: list[Trigger] = Field(default_factory=list)
    capped_by: str | None = Field(None, description="max_replicas | max_step_up | budget | monthly_budget, when a cap cut the step")
    state: ScalerState


P99_TAIL = 0.01


def _ttft_p99(rate: float, replicas: int, erlang_b: float, p: ScalingPolicy) -> float:
    """Unloaded TTFT + burstiness x the p99 wait of M/M/c, given Erlang B of ``replicas`` servers."""
    mu = p.replica_capacity_rps
    if replicas * mu <= rate:
        return math.inf
    load = rate / mu
    waits = replicas * erlang_b / (replicas - load * (1 - erlang_b))  # Erlang C: P(wait > 0)
    wait = math.log(waits / P99_TAIL) / (replicas * mu - rate) if waits > P99_TAIL else 0.0
    return p.replica_ttft_seconds + p.arrival_burstiness * wait


def _erlang_b(load: float, servers: int, previous: float) -> float:
    """Erlang B of ``servers`` from that of one fewer (1.0 for none): stable for large fleets."""
    return load * previous / (servers + load * previous)


def predicted_ttft_p99(rate: float, replicas: int, p: ScalingPolicy) -> float:
    """p99 TTFT of ``replicas`` serving ``rate`` requests/s: the unloaded TTFT plus the p99 wait of
    an M/M/c queue (Erlang C: ``P(wait > t) = C * exp(-(c mu - lambda) t)``) times the burstiness.
    Infinite when the replicas cannot keep up."""
    if rate <= 0:
        return p.replica_ttft_seconds
    blocking = 1.0
    for k in range(1, replicas + 1):
        blocking = _erlang_b(rate / p.replica_capacity_rps, k, blocking)
    return _ttft_p99(rate, replicas, blocking, p)


def slo_replicas(rate: float, p: ScalingPolicy) -> int:
    """Fewest replicas whose predicted p99 TTFT at ``rate`` is within ``slo_margin`` of the SLO
    (headroom ~ sqrt(load), as in square-root staffing); ``MAX_REPLICAS`` when none is."""
    if rate <= 0:
        return 0
    goal = p.slo_margin * p.ttft_p99_slo_seconds
    blocking = 1.0
    for c in range(1, MAX_REPLICAS + 1):
        blocking = _erlang_b(rate / p.replica_capacity_rps, c, blocking)
        if _ttft_p99(rate, c, blocking, p) <= goal:
            return c
    return MAX_REPLICAS


def demand_rate(s: Signals) -> float:
    """Requests/s the deployment is asked for: those it served and those its gateway refused."""
    return (s.request_rate or 0.0) + (s.rejected_rate or 0.0)


def _ratio_replicas(ready: int, value: float, target: float, p: ScalingPolicy) -> int:
    """HPA-style ``ceil(ready * value / target)``, at least one more than serve now when above
    target, at most ``ratio_step_up_percent`` more (HPA's default scale-up policy, 100 %: double):
    a latency far past its target says the fleet is short, not by how much (a 12.6 s p99 on 2
    replicas asked for 13, where 4 drained the burst); the SLO and queue triggers size what the
    arrivals need."""
    base = max(ready, 1)
    want = math.ceil(base * value / target)
    if p.ratio_step_up_percent is not None:
        want = min(want, base + math.ceil(base * p.ratio_step_up_percent / 100))
    return max(ready + 1, want)


def _triggers(now_s: float, ready: int, s: Signals, p: ScalingPolicy, util_since: float | None) -> list[Trigger]:
    """Each trigger's want, from the replicas whose load the signals measure (the Ready ones)."""
    out: list[Trigger] = []
    if p.completion_slo is not None:
        out.append(_completion_trigger(ready, s, p, p.completion_slo))
    if (s.request_rate is not None or s.rejected_rate is not None) and p.completion_slo is None:
        rate = demand_rate(s)
        predicted = predicted_ttft_p99(rate, ready, p)
        goal = p.slo_margin * p.ttft_p99_slo_seconds
        fired = predicted > goal
        want = max(ready + 1, slo_replicas(rate, p)) if fired else ready
        out.append(Trigger(name="slo", value=round(min(predicted, 1e9), 3), target=goal, fired=fired, replicas=want))
    if s.queue_waiting is not None:
        limit = p.queue_per_replica * max(ready, 1)
        fired = s.queue_waiting > limit
        extra = math.ceil(s.queue_waiting / p.queue_capacity_per_replica) if fired else 0
        out.append(Trigger(name="queue", value=s.queue_waiting, target=limit, fired=fired, replicas=ready + extra))
    if s.ttft_p99_seconds is not None and p.completion_slo is None:
        fired = s.ttft_p99_seconds > p.ttft_p99_slo_seconds
        want = _ratio_replicas(ready, s.ttft_p99_seconds, p.ttft_p99_slo_seconds, p) if fired else ready
        out.append(Trigger(name="ttft_p99", value=s.ttft_p99_seconds, target=p.ttft_p99_slo_seconds, fired=fired, replicas=want))
    if s.kv_cache_usage is not None:
        fired = s.kv_cache_usage > p.kv_cache_target
        want = _ratio_replicas(ready, s.kv_cache_usage, p.kv_cache_target, p) if fired else ready
        out.append(Trigger(name="kv_cache", value=s.kv_cache_usage, target=p.kv_cache_target, fired=fired, replicas=want))
    if s.gpu_util_percent is not None and p.gpu_util_trigger:
        sustained = util_since is not None and now_s - util_since >= p.gpu_util_sustain_seconds
        fired = s.gpu_util_percent > p.gpu_util_target_percent and sustained
        want = _ratio_replicas(ready, s.gpu_util_percent, p.gpu_util_target_percent, p) if fired else ready
        out.append(Trigger(name="gpu_util", value=s.gpu_util_percent, target=p.gpu_util_target_percent, fired=fired, replicas=want))
    return out


def _completion_trigger(ready: int, s: Signals, p: ScalingPolicy, slo: float) -> Trigger:
    """Batch: the worse of the measured p95 completion time and the backlog's predicted drain time."""
    waiting, rate = s.queue_waiting or 0.0, s.request_rate or 0.0
    drain = drain_seconds(waiting, rate, ready, p.replica_capacity_rps)
    value = max(drain, s.e2e_p95_seconds or 0.0)
    fired = value > slo
    want = ready
    if fired:
        want = max(ready + 1, drain_replicas(waiting, rate, slo, p.replica_capacity_rps))
        if s.e2e_p95_seconds is not None and s.e2e_p95_seconds > slo:
            want = max(want, _ratio_replicas(ready, s.e2e_p95_seconds, slo, p))
    return Trigger(name="completion", value=round(min(value, 1e9), 3), target=slo, fired=fired, replicas=want)


def _needed(current: int, ready: int, s: Signals, p: ScalingPolicy) -> int:
    """Replicas the load justifies when no trigger fires; ``current`` when that cannot be told.

    From the arrival rate (the SLO model) and, when ``gpu_util_trigger`` is on, from utilisation;
    KV-cache usage bounds either. Measured on the Ready replicas; the ones still starting count
    as needed, so replicas that have not served yet are never taken for spare capacity.
    """
    if s.queue_waiting is None or s.queue_waiting > 0:
        return current
    wants = []
    if s.request_rate is not None or s.rejected_rate is not None:
        slo, rate = p.completion_slo, demand_rate(s)
        wants.append(slo_replicas(rate, p) if slo is None else drain_replicas(0, rate, slo, p.replica_capacity_rps))
    if p.gpu_util_trigger and s.gpu_util_percent is not None:
        wants.append(math.ceil(ready * s.gpu_util_percent / p.gpu_util_target_percent))
    if not wants:
        return current
    if s.kv_cache_usage is not None:
        wants.append(math.ceil(ready * s.kv_cache_usage / p.kv_cache_target))
    return max(wants) + current - ready


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
    floor_by: str = "schedule/pre-warm",
    scale_in_frozen: str | None = None,
) -> ScalingDecision:
    """Desired replicas for a deployment at ``now_s`` (seconds on any monotonic clock).

    ``current`` is the replicas asked for (the Deployment's spec), ``ready`` those serving, whose
    load the signals measure (default: all of ``current``); ``floor_by`` names who set ``floor``;
    ``scale_in_frozen``: why the fleet must not shrink now (a canary in analysis), None: it may.
    """
    ready = current if ready is None else max(0, min(ready, current))
    util_high = (
        policy.gpu_util_trigger
        and signals.gpu_util_percent is not None
        and signals.gpu_util_percent > policy.gpu_util_target_percent
    )
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
            if scale_in_frozen is not None:
                desired, cause = current, "analysis"
                reason = f"hold at {current}: scale-in frozen at {current}: {scale_in_frozen} (the load needs {needed})"
            elif quiet_for < policy.stabilisation_seconds:
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
        reason += f"; raised to floor {lower} (min {policy.min_replicas}, {floor_by} {floor})"
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
