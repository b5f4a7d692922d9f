"""Coordination bench (issue 32): one deployment's release, size and capacity type, steered by one
control plane or by three tools that do not know of each other.

Four scenarios, each a canary of a version that is exactly as good as the stable (so every
rollback is a false one) through the product's default ladder (1 → 5 → 50 → 100 %, its windows,
a gate every 60 s):

- ``ramp``: demand grows ×3 during the 50 % step;
- ``reclaim``: during the 50 % step the canary's spot node is reclaimed; its pods come back on
  on-demand after a cold start;
- ``spot-mix``: the deployment runs a spot mix, so its versioned Deployment holds 0 replicas and
  the pools hold the total (``tideplane.io/spot-mix-target``);
- ``tie``: at the 50/50 step the canary's name sorts first (``chat-v1-10-0`` before
  ``chat-v1-9-0``) while demand grows ×1.5.

Policies:

- ``tideplane``: the product's rules: the loop sizes the total from deployment-wide demand and
  freezes scale-in under a canary; the canary follows the live total at each step
  (``gates.canary_replicas``); a failed gate is diagnosed (``diagnosis.diagnose``): an overload
  re-sizes, lost capacity holds the clock and routes the live pods' weight; the stable is the
  recorded one; a spot mix is read through its total; promotion sizes the new version to the
  current total and retires the old one only once the new one is Ready.
- ``uncoordinated``: Argo Rollouts' basic canary next to a KEDA-style loop on the stable: the
  canary's share fixed from the start-time replicas (its ``spec.replicas``: 0 under a spot mix), a
  failed gate rolls back, the gates count the pods' own requests only (not the gateway's 503s),
  the loop scales the Deployment with the most traffic (a tie goes to the name that sorts first)
  on that Deployment's own load, promotion sizes the new version to the start-time count and the
  old one is scaled to 0 after the scale-down delay (a spot mix's pools are never touched).

Both use the same gates (``gates.evaluate``, ``StepAnalysis``: the product's pure functions), the
same loop target and timings, and the same queueing model of the fleet, which is this module's own
(an M/M/c queue per version, ``Fleet``): Erlang C gives each version's TTFT p99 from its load and
Ready replicas. No workflow runs here: the scenarios' e2e versions on the sandbox are a separate
step (docs/benchmarks.md says which are done).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.scaling import markdown_table as _table
from benchmarks.scaling import write_csv
from workflows.rollout.cause_actions import MAX_RESIZES
from workflows.rollout.diagnosis import CanaryFleet, Cause, Diagnosis, diagnose
from workflows.rollout.gates import (
    ERROR_RATE,
    GATEWAY_ERROR_RATE,
    P99_LATENCY,
    REQUEST_COUNT,
    STABLE_P99_LATENCY,
    TPOT_P99,
    TTFT_P99,
    AnalysisLimits,
    Decision,
    Gates,
    StepAnalysis,
    canary_replicas,
    evaluate,
    required_passes,
)
from workflows.rollout.types import DEFAULT_STEPS

SCENARIOS = ("ramp", "reclaim", "spot-mix", "tie")
POLICIES = ("tideplane", "uncoordinated")
COLUMNS = ["scenario", "policy", "false_rollbacks", "slo_miss_minutes", "leaked_replicas", "gpu_hours", "promote_seconds", "outcome"]

STEP_S = 15.0  # simulation step
GATE_INTERVAL_S = 60.0  # the rollout's default gate_interval_seconds
LOOP_INTERVAL_S = 30.0  # KEDA's default polling interval; the product's loop decides as often
COLD_START_S = 180.0  # a replica ordered now is Ready this much later
SCALE_DOWN_WINDOW_S = 600.0  # longer than the cold start, as a skilled operator sets it
RETIRE_DELAY_S = 600.0  # the rollout's default scale_down_delay_seconds
HORIZON_S = 2 * 3600.0  # every run is measured over the same two hours (a full ladder takes about 80 min)

# The fleet: each replica serves SLOTS requests at once, each taking SERVICE_S; the loop aims at TARGET_UTIL.
SLOTS = 32
SERVICE_S = 8.0
PER_REPLICA_RPS = SLOTS / SERVICE_S
TARGET_UTIL = 0.6
N0 = 40  # the stable's replicas at the start: at 1 % the canary sees the gates' 50 requests a minute
BASE_RPS = N0 * PER_REPLICA_RPS * TARGET_UTIL
PREFILL_S = 0.2  # TTFT of an unqueued request
TPOT_S = 0.03
GATES = Gates()
LIMITS = AnalysisLimits()
TTFT_SLO_S = GATES.ttft_p99_slo_seconds


def erlang_c(servers: int, load: float) -> float:
    """Probability that an arrival waits in an M/M/``servers`` queue offered ``load`` Erlangs (< servers)."""
    blocked = 1.0  # Erlang B by its recurrence (no factorials: stable for thousands of servers)
    for k in range(1, servers + 1):
        blocked = load * blocked / (k + load * blocked)
    rho = load / servers
    return blocked / (1 - rho * (1 - blocked))


def ttft_p99(rps: float, ready: int) -> float:
    """TTFT p99 of a version offered ``rps`` on ``ready`` replicas (inf: saturated or no replica)."""
    if rps <= 0:
        return PREFILL_S
    servers = ready * SLOTS
    load = rps * SERVICE_S
    if servers == 0 or load >= servers:
        return math.inf
    waits = erlang_c(servers, load)
    if waits <= 0.01:
        return PREFILL_S
    return PREFILL_S + math.log(waits / 0.01) / (servers / SERVICE_S - rps)


def loop_target(rps: float) -> int:
    """Replicas the loop wants for ``rps`` at its target utilisation."""
    return max(1, math.ceil(rps / (PER_REPLICA_RPS * TARGET_UTIL) - 1e-9))


@dataclass
class Version:
    """One version's Deployments: its own replicas, a spot mix's pools, and replicas on the way."""

    name: str
    replicas: int = 0
    ready_at: list[float] = field(default_factory=list)  # one entry per replica: when it is (was) Ready
    pools: int = 0  # a spot mix's pool Deployments (the versioned Deployment itself then says 0)

    @property
    def total(self) -> int:
        return self.replicas + self.pools

    def ready(self, now: float) -> int:
        return sum(1 for t in self.ready_at if t <= now)

    def scale(self, replicas: int, now: float) -> None:
        """Set the own replicas; new ones are Ready a cold start later, the newest go first."""
        replicas = max(0, replicas)
        held = self.replicas
        if replicas > held:
            self.ready_at += [now + COLD_START_S] * (replicas - held)
        elif replicas < held:
            self.ready_at = sorted(self.ready_at)[: replicas + self.pools]
        self.replicas = replicas

    def lose(self, pods: int, now: float) -> None:
        """``pods`` Ready pods gone (a reclaim); their replacements are Ready a cold start later."""
        ready = sorted(t for t in self.ready_at if t <= now)[:pods]
        for t in ready:
            self.ready_at.remove(t)
            self.ready_at.append(now + COLD_START_S)


@dataclass
class Run:
    scenario: str
    policy: str
    stable: Version
    canary: Version
    weight: int = 0  # the canary's route weight
    outcome: str = "running"
    false_rollbacks: int = 0
    promoted_at: float | None = None
    gpu_seconds: float = 0.0
    miss_seconds: dict[int, bool] = field(default_factory=dict)  # minute -> over SLO


def demand(scenario: str, t: float, ramp: tuple[float, float] | None) -> float:
    """Requests per second at ``t``: flat, or growing during the 50 % step (``ramp``: its start, end)."""
    if ramp is None or scenario not in ("ramp", "tie"):
        return BASE_RPS
    factor = 3.0 if scenario == "ramp" else 1.5
    start, end = ramp
    if t <= start:
        return BASE_RPS
    return BASE_RPS * (1 + (factor - 1) * min(1.0, (t - start) / (end - start)))


def simulate(scenario: str, policy: str) -> dict:
    """One scenario under one policy; the row the CSV holds."""
    coordinated = policy == "tideplane"
    mixed = scenario == "spot-mix"
    names = ("chat-v1-9-0", "chat-v1-10-0") if scenario == "tie" else ("chat-v1-0-0", "chat-v1-1-0")
    stable = Version(names[0], replicas=0 if mixed else N0, pools=N0 if mixed else 0, ready_at=[0.0] * N0)
    run = Run(scenario, policy, stable, Version(names[1]))
    steps = list(DEFAULT_STEPS)
    start_total = stable.replicas  # what the uncoordinated rollout reads: spec.replicas (0 under a mix)
    t, step_i, step_since, analysis, resizes = 0.0, 0, 0.0, StepAnalysis(), 0
    held_since: float | None = None  # tideplane: the analysis clock paused for lost capacity
    route_weight = 0  # what the route sends the canary (tideplane routes the live pods' share)
    last_loop, last_gate, last_up, reclaimed = -LOOP_INTERVAL_S, 0.0, 0.0, False
    retire_at: float | None = None
    ramp: tuple[float, float] | None = None
    planned = 0  # canary replicas the step sized
    enter_step = True
    while True:
        now_rps = demand(scenario, t, ramp)
        # ---- the rollout
        if run.outcome == "running":
            step = steps[step_i]
            if enter_step:
                enter_step, step_since, analysis, resizes = False, t, StepAnalysis(), 0
                if step.weight == 50 and scenario in ("ramp", "tie"):
                    ramp = (t, t + step.window_seconds * 0.5)
                total = stable.total if coordinated else start_total  # the live total, or the start-time spec.replicas
                planned = total if step.weight == 100 else canary_replicas(total, step.weight)
                run.canary.scale(planned, t)
            if step.weight == 100:
                # tideplane moves the route once the new version carries the total; Argo moves it at once
                if not coordinated or run.canary.ready(t) >= run.canary.replicas:
                    run.weight = route_weight = 100
                    run.outcome, run.promoted_at = "promoted", t
                    retire_at = t + RETIRE_DELAY_S
            elif run.canary.ready(t) >= min(planned, run.canary.replicas) or run.weight == step.weight:
                run.weight = step.weight
                route_weight = step.weight if held_since is None else route_weight
            if scenario == "reclaim" and step.weight == 50 and not reclaimed and t - step_since >= 300:
                reclaimed = True
                run.canary.lose(max(1, run.canary.ready(t) // 2 + 1), t)
            if run.weight == step.weight and step.weight < 100 and t - last_gate >= GATE_INTERVAL_S:
                last_gate = t
                decision, found = _observe(run, analysis, now_rps, step.weight, route_weight, planned, t, coordinated)
                if decision == "hold":
                    held_since = held_since if held_since is not None else t
                    route_weight = found.live_weight if found and found.live_weight is not None else route_weight
                elif decision == "resize":
                    resizes += 1
                    if resizes > MAX_RESIZES:
                        run.outcome = "paused"
                    else:
                        planned = found.replicas if found and found.replicas else run.canary.replicas
                        run.canary.scale(planned, t)
                        step_since, analysis = t, StepAnalysis()
                elif decision == "rollback":
                    run.false_rollbacks += 1
                    run.outcome = "rolled back"
                    run.weight = route_weight = 0
                    retire_at = t + RETIRE_DELAY_S
                elif decision == "pause":
                    run.outcome = "paused"
                else:
                    if held_since is not None:  # capacity back: the clock resumes where it stopped
                        step_since += t - held_since
                        held_since, route_weight = None, step.weight
                    if t - step_since >= step.window_seconds and analysis.passes >= required_passes(step.window_seconds, GATE_INTERVAL_S):
                        step_i += 1
                        enter_step = True
        # ---- retirement of the version that no longer carries traffic
        if retire_at is not None and t >= retire_at:
            gone = stable if run.outcome == "promoted" else run.canary
            if coordinated:
                gone.pools = 0  # scale_version to 0 takes a spot mix down too (the uncoordinated one: spec.replicas only)
            gone.scale(0, t)
            retire_at = None
        # ---- the loop
        if t - last_loop >= LOOP_INTERVAL_S:
            last_loop = t
            last_up = _loop(run, now_rps, route_weight, t, coordinated, last_up)
        # ---- the fleet
        _account(run, now_rps, route_weight, t)
        t += STEP_S
        if t >= HORIZON_S:
            return _row(run)


def _split(run: Run, rps: float, weight: int) -> tuple[float, float]:
    return rps * (100 - weight) / 100, rps * weight / 100


def _observe(
    run: Run, analysis: StepAnalysis, rps: float, step_weight: int, weight: int, planned: int, now: float, coordinated: bool,
) -> tuple[str, Diagnosis | None]:
    """One gate observation, recorded on the step's ``analysis``: what the rollout does next
    (continue, hold for lost capacity, resize an overload, rollback, pause) and tideplane's
    diagnosis, whose ``live_weight`` and ``replicas`` say how (the product's own sizing)."""
    stable_rps, canary_rps = _split(run, rps, weight)
    s_ready, c_ready = run.stable.ready(now), run.canary.ready(now)
    served = canary_rps if c_ready else 0.0  # the gateway answers 503 for a backend with no live pod
    lost_rps = canary_rps - served
    window = GATE_INTERVAL_S
    pods_requests = served * window
    values = {
        REQUEST_COUNT: pods_requests,
        ERROR_RATE: 0.0,  # the pods' own 5xx: a good version answers none
        **({GATEWAY_ERROR_RATE: lost_rps / canary_rps if canary_rps else 0.0} if coordinated else {}),  # the gateway's 503s
        P99_LATENCY: min(ttft_p99(served, c_ready), 1e6) + SERVICE_S,
        STABLE_P99_LATENCY: min(ttft_p99(stable_rps, s_ready), 1e6) + SERVICE_S,
        TTFT_P99: min(ttft_p99(served, c_ready), 1e6),
        TPOT_P99: TPOT_S,
    }
    evaluation = evaluate(values, GATES)
    if coordinated:
        fleet = CanaryFleet(
            weight=step_weight, canary_wanted=planned, canary_ready=c_ready, stable_ready=s_ready,
            no_healthy_upstream=lost_rps * window, canary_rps=served, stable_rps=stable_rps,
        )
        found = diagnose(evaluation, fleet)
        if found.cause is Cause.LOST_CAPACITY:
            return "hold", found
        if found.cause is Cause.OVERLOAD:
            return "resize", found
    decision = analysis.record(evaluation, LIMITS)
    if decision is Decision.ROLLBACK:
        return "rollback", None
    return ("continue" if decision is Decision.CONTINUE else "pause"), None


def _loop(run: Run, rps: float, weight: int, now: float, coordinated: bool, last_up: float) -> float:
    """One autoscaler decision; returns when it last scaled up (the scale-down window runs from there)."""
    stable, canary = run.stable, run.canary
    if coordinated:
        target = stable  # the recorded stable (after promotion: the new version)
        if run.outcome == "promoted":
            target = canary
        wanted = loop_target(rps)  # the whole deployment's demand: the loop sizes the total
        frozen = 0 < weight < 100 and run.outcome == "running"
    else:
        # KEDA on "the" Deployment: the one with the most traffic, a tie to the name that sorts first,
        # on that Deployment's own share of the traffic
        shares = {stable.name: 100 - weight, canary.name: weight}
        top = max(shares.values())
        name = sorted(n for n, w in shares.items() if w == top)[0]
        target = stable if name == stable.name else canary
        wanted = loop_target(rps * shares[name] / 100)
        frozen = False
    held = target.total  # both loops read a spot mix's total (get_scale), and write the mix
    if wanted > held:
        _set_total(target, wanted, now)
        return now
    if wanted < held and not frozen and now - last_up >= SCALE_DOWN_WINDOW_S:
        _set_total(target, wanted, now)
    return last_up


def _set_total(version: Version, total: int, now: float) -> None:
    if version.pools:
        version.pools = max(0, total - version.replicas)  # the mix's pools hold the total
        version.ready_at = sorted(version.ready_at)[: version.total] + [now + COLD_START_S] * max(0, version.total - len(version.ready_at))
    else:
        version.scale(total, now)


def _account(run: Run, rps: float, weight: int, now: float) -> None:
    stable_rps, canary_rps = _split(run, rps, weight)
    run.gpu_seconds += (run.stable.total + run.canary.total) * STEP_S
    over = ttft_p99(stable_rps, run.stable.ready(now)) > TTFT_SLO_S or ttft_p99(canary_rps, run.canary.ready(now)) > TTFT_SLO_S
    minute = int(now // 60)
    run.miss_seconds[minute] = run.miss_seconds.get(minute, False) or over


def _row(run: Run) -> dict:
    serving = run.canary if run.outcome == "promoted" else run.stable
    idle = run.stable if serving is run.canary else run.canary
    return {
        "scenario": run.scenario,
        "policy": run.policy,
        "false_rollbacks": run.false_rollbacks,
        "slo_miss_minutes": sum(run.miss_seconds.values()),
        "leaked_replicas": idle.total,
        "gpu_hours": round(run.gpu_seconds / 3600, 1),
        "promote_seconds": "" if run.promoted_at is None else round(run.promoted_at),
        "outcome": run.outcome,
    }


def run_all(out: Path) -> list[dict]:
    rows = [simulate(s, p) for s in SCENARIOS for p in POLICIES]
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "coordination.csv", rows, COLUMNS)
    (out / "coordination.md").write_text(markdown_table(rows) + "\n")
    return rows


def markdown_table(rows: list[dict]) -> str:
    return _table(rows, COLUMNS)
