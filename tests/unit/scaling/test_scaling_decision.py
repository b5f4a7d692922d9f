"""One test per scaling rule of the pure decision function."""

from itertools import pairwise

import pytest
from pydantic import ValidationError

from workflows.scaling.prewarm import expected_peak, prewarm_floor
from workflows.scaling.completion import drain_replicas, drain_seconds
from workflows.scaling.decide import ScalerState, ScalingPolicy, Signals, decide, down_step, predicted_ttft_p99, slo_replicas

POLICY = ScalingPolicy(min_replicas=1, max_replicas=40, queue_per_replica=5, queue_capacity_per_replica=20)
QUIET = Signals(queue_waiting=0, running=2, request_rate=1.0, kv_cache_usage=0.1, ttft_p99_seconds=0.2, gpu_util_percent=10)


def run_quiet(current: int, start: float, until: float, step: float = 30, policy=POLICY, state=None, floor=0):
    """Feed quiet signals every ``step`` seconds; returns the replicas after each decision."""
    state = state or ScalerState()
    seen = []
    t = start
    while t <= until:
        d = decide(t, current, QUIET, policy, state, floor)
        current, state = d.desired, d.state
        seen.append((t, current))
        t += step
    return seen, state


def test_aggressive_up_absorbs_queue_in_one_step():
    d = decide(0, 4, Signals(queue_waiting=200, gpu_util_percent=50), POLICY, ScalerState())
    assert d.desired == 4 + 10  # current + ceil(200 / 20), not one at a time
    assert d.reason.startswith("up: queue 200 > 20")
    assert d.state.last_change_s == 0


def test_queue_below_per_replica_threshold_does_not_fire():
    d = decide(0, 4, Signals(queue_waiting=20, gpu_util_percent=50), POLICY, ScalerState())
    assert d.desired == 4
    assert [(t.name, t.fired) for t in d.triggers] == [("queue", False)]  # utilisation is no trigger by default


def test_step_up_is_capped():
    policy = POLICY.model_copy(update={"max_step_up": 3})
    d = decide(0, 2, Signals(queue_waiting=1000), policy, ScalerState())
    assert (d.desired, d.capped_by) == (5, "max_step_up")


def test_triggers_combine_by_max():
    signals = Signals(queue_waiting=50, ttft_p99_seconds=6.0, kv_cache_usage=0.5, gpu_util_percent=40)
    d = decide(0, 4, signals, POLICY, ScalerState())
    by_name = {t.name: t for t in d.triggers}
    assert by_name["queue"].replicas == 4 + 3
    assert by_name["ttft_p99"].replicas == 8  # ceil(4 * 6 / 2) = 12, at most double
    assert d.desired == 8
    assert "queue" in d.reason and "ttft_p99" in d.reason


def test_a_ratio_trigger_asks_for_the_ratio_up_to_double_and_at_least_one_more():
    """HPA's rule ``ceil(ready * value / target)`` under HPA's default scale-up policy (100 % a
    period): a p99 six times its SLO says the fleet is short, not that it needs six times as many."""
    def ttft_want(ready: int, p99: float) -> int:
        d = decide(0, ready, Signals(ttft_p99_seconds=p99), POLICY, ScalerState())
        return next(t.replicas for t in d.triggers if t.name == "ttft_p99")

    assert ttft_want(4, 2.5) == 5  # ceil(4 * 2.5 / 2)
    assert ttft_want(4, 3.0) == 6
    assert ttft_want(4, 12.0) == 8  # not 24
    assert ttft_want(10, 2.05) == 11  # ceil(10.25): at least one more
    assert ttft_want(0, 12.0) == 2  # nothing Ready yet: the floor of one replica, doubled


def test_utilisation_when_turned_on_must_be_sustained():
    policy = POLICY.model_copy(update={"gpu_util_sustain_seconds": 120, "gpu_util_trigger": True})
    hot = Signals(queue_waiting=0, gpu_util_percent=95)
    d = decide(0, 4, hot, policy, ScalerState())
    assert d.desired == 4 and d.state.util_above_since_s == 0
    d = decide(90, 4, hot, policy, d.state)
    assert d.desired == 4
    d = decide(120, 4, hot, policy, d.state)
    assert d.desired == 5  # ceil(4 * 95 / 80)
    # a dip below target restarts the clock
    d = decide(150, 5, Signals(queue_waiting=0, gpu_util_percent=70), policy, d.state)
    assert d.state.util_above_since_s is None


def test_down_only_after_stabilisation_window_one_step():
    policy = POLICY.model_copy(update={"stabilisation_seconds": 300, "cooldown_seconds": 0})
    seen, _ = run_quiet(6, start=0, until=330, policy=policy)
    assert [r for t, r in seen if t < 300] == [6] * 10
    assert dict(seen)[300] == 5  # one step, not straight to the 1 the load justifies
    assert dict(seen)[330] == 5  # next step waits for a new window


def test_cold_start_does_not_compound():
    # 10 serve at 100 %, a queue builds; the new replicas need minutes: their load is still on the 10
    hot = Signals(queue_waiting=200, gpu_util_percent=100, ttft_p99_seconds=1.5)
    d = decide(0, 10, hot, POLICY, ScalerState(), ready=10)
    assert d.desired == 10 + 10  # ready + ceil(200 / 20)
    current, state = d.desired, d.state
    for t in (30, 60, 90, 120, 150):  # every decision while they start sees the same load
        d = decide(t, current, hot, POLICY, state, ready=10)
        assert d.desired == 20, f"t={t}: the starting replicas already cover the want"
        assert d.cause == "starting" and "10 starting replica(s) cover the want" in d.reason
        state = d.state
    assert state.last_change_s == 0  # holding is not a change


def test_a_further_rise_while_starting_adds_only_the_difference():
    d = decide(0, 20, Signals(queue_waiting=400, gpu_util_percent=100), POLICY, ScalerState(), ready=10)
    assert (d.desired, d.cause) == (10 + 20, "queue_depth")  # 10 more than the 20 asked for already
    assert "(10 of 20 ready)" in d.reason
    d = decide(0, 20, Signals(queue_waiting=0, ttft_p99_seconds=3.0), POLICY, ScalerState(), ready=15)
    assert d.desired == 23  # ceil(15 ready * 3 / 2), not ceil(20 * 3 / 2) = 30


def test_ready_defaults_to_current():
    hot = Signals(queue_waiting=0, ttft_p99_seconds=6.0)
    assert decide(0, 4, hot, POLICY, ScalerState()).desired == decide(0, 4, hot, POLICY, ScalerState(), ready=4).desired == 8


def test_replicas_still_starting_are_not_spare_capacity():
    policy = POLICY.model_copy(update={"stabilisation_seconds": 0, "cooldown_seconds": 0})
    # the 5 Ready are what 15 req/s needs: the 15 starting are needed, nothing to take down
    d = decide(0, 20, Signals(queue_waiting=0, request_rate=15), policy, ScalerState(), ready=5)
    assert (d.desired, d.cause) == (20, "at_target")
    # 1 req/s: a step down from the spec, never below what the load needs
    d = decide(0, 20, Signals(queue_waiting=0, request_rate=1), policy, ScalerState(), ready=5)
    assert d.desired == 18 and d.cause == "below_target"  # 20 - 10 %; the load needs 1 + 15 starting


def test_down_step_is_a_share_of_the_fleet():
    policy = POLICY.model_copy(update={"max_replicas": 400, "stabilisation_seconds": 300, "cooldown_seconds": 600})
    assert [down_step(n, policy) for n in (1, 8, 19, 20, 200)] == [1, 1, 1, 2, 20]
    # small fleet: one replica per step, as before
    seen, _ = run_quiet(8, start=0, until=1230, policy=policy)
    assert [r for _, r in seen if r < 8][:1] == [7] and min(r for _, r in seen) == 6
    # large fleet: 10 % per step, stabilisation and cooldown still pace it
    seen, _ = run_quiet(200, start=0, until=3600, policy=policy)
    downs = [(t, r) for (_, prev), (t, r) in pairwise(seen) if r < prev]
    assert downs[0] == (300, 180)
    assert all(b[0] - a[0] >= 600 for a, b in pairwise(downs))
    assert dict(seen)[3600] < 120  # ~halved within the hour (one replica per step would be 194)
    # the step never goes below what the load justifies
    busy = Signals(queue_waiting=0, request_rate=755)
    d = decide(0, 200, busy, policy.model_copy(update={"stabilisation_seconds": 0}), ScalerState())
    assert d.desired == 190 == slo_replicas(755, policy)  # what 755 req/s needs, not 180
    one = policy.model_copy(update={"scale_down_step_percent": 0, "stabilisation_seconds": 0})
    assert decide(0, 200, QUIET, one, ScalerState()).desired == 199


def test_cooldown_delays_down_after_a_change():
    policy = POLICY.model_copy(update={"stabilisation_seconds": 300, "cooldown_seconds": 600})
    state = ScalerState(last_change_s=0)
    seen, state = run_quiet(6, start=30, until=630, policy=policy, state=state)
    first_down = next(t for t, r in seen if r < 6)
    assert first_down == 600  # the window ended at 330, the cooldown only at 600
    d = decide(600, 6, QUIET, policy, ScalerState(last_change_s=0, below_since_s=30))
    assert d.desired == 5 and "down one step" in d.reason
    d = decide(599, 6, QUIET, policy, ScalerState(last_change_s=0, below_since_s=30))
    assert d.desired == 6 and "cooldown" in d.reason


def test_load_returning_resets_the_window():
    policy = POLICY.model_copy(update={"stabilisation_seconds": 300, "cooldown_seconds": 0})
    _, state = run_quiet(6, start=0, until=240, policy=policy)
    d = decide(270, 6, Signals(queue_waiting=3, gpu_util_percent=60), policy, state)
    assert d.desired == 6 and d.state.below_since_s is None
    seen, _ = run_quiet(6, start=300, until=570, policy=policy, state=d.state)
    assert all(r == 6 for _, r in seen)


def test_floor_from_schedule_raises_and_bounds_down():
    d = decide(0, 2, QUIET, POLICY, ScalerState(), floor=8)
    assert d.desired == 8 and "floor 8" in d.reason
    policy = POLICY.model_copy(update={"stabilisation_seconds": 0, "cooldown_seconds": 0})
    seen, _ = run_quiet(8, start=0, until=3000, policy=policy, floor=5)
    assert min(r for _, r in seen) == 5


def test_hold_when_blind():
    policy = POLICY.model_copy(update={"stabilisation_seconds": 0, "cooldown_seconds": 0})
    d = decide(0, 6, Signals(error="prometheus: connection refused"), policy, ScalerState(below_since_s=-1000))
    assert d.desired == 6
    assert "metrics unavailable (prometheus: connection refused)" in d.reason
    assert d.state.below_since_s is None  # blind time never counts as quiet
    d = decide(0, 6, Signals(), policy, ScalerState())
    assert d.desired == 6 and "no data" in d.reason


def test_unknown_demand_never_scales_down():
    policy = POLICY.model_copy(update={"stabilisation_seconds": 0, "cooldown_seconds": 0})
    d = decide(0, 6, Signals(queue_waiting=0, ttft_p99_seconds=0.1), policy, ScalerState())
    assert d.desired == 6


def test_budget_guard_caps_and_reports():
    policy = POLICY.model_copy(update={"max_gpus": 16, "gpus_per_replica": 2})
    d = decide(0, 4, Signals(queue_waiting=400), policy, ScalerState())
    assert (d.desired, d.capped_by) == (8, "budget")
    assert "budget guard: 16 GPUs allow 8 replicas" in d.reason
    d = decide(0, 4, QUIET, policy, ScalerState(), floor=20)
    assert d.desired == 8  # not even a schedule floor exceeds the budget


def test_min_and_max_always_hold():
    policy = ScalingPolicy(min_replicas=2, max_replicas=5)
    assert decide(0, 0, Signals(), policy, ScalerState()).desired == 2
    d = decide(0, 3, Signals(queue_waiting=1000), policy, ScalerState())
    assert (d.desired, d.capped_by) == (5, "max_replicas")
    assert decide(0, 9, QUIET, policy, ScalerState()).desired == 5  # a lowered max applies at once
    assert decide(0, 3, QUIET, policy, ScalerState(), floor=50).desired == 5


def test_policy_refuses_min_above_max():
    with pytest.raises(ValidationError, match=r"min_replicas \(5\) > max_replicas \(2\)"):
        ScalingPolicy(min_replicas=5, max_replicas=2)
    with pytest.raises(ValidationError, match="exceeds max_gpus"):
        ScalingPolicy(min_replicas=3, gpus_per_replica=4, max_gpus=8)


def test_prewarm_floor_looks_ahead_by_startup_time():
    history = {"0:9": [2, 3, 2, 3], "0:10": [8, 9, 12, 10], "6:23": [1, 1], "0:0": [4]}
    assert expected_peak([8, 9, 12, 10], 0.75) == 10.5
    assert prewarm_floor(history, weekday=0, minute_of_day=9 * 60 + 30, startup_seconds=600).floor == 3  # 09:40 still 09h
    ahead = prewarm_floor(history, weekday=0, minute_of_day=9 * 60 + 50, startup_seconds=600)
    assert ahead.floor == 11 and set(ahead.slots) == {"0:9", "0:10"}  # 10:00 peak reached within start-up
    wrap = prewarm_floor(history, weekday=6, minute_of_day=23 * 60 + 55, startup_seconds=600)
    assert wrap.floor == 4 and "0:0" in wrap.slots  # Sunday night looks into Monday 00h
    assert prewarm_floor({}, 0, 0, 600).floor == 0


def test_slo_sizing_is_the_fewest_replicas_within_the_slo_margin():
    goal = POLICY.slo_margin * POLICY.ttft_p99_slo_seconds
    for rate in (0.5, 3, 40, 400, 4000):
        n = slo_replicas(rate, POLICY.model_copy(update={"max_replicas": 2000}))
        assert predicted_ttft_p99(rate, n, POLICY) <= goal < predicted_ttft_p99(rate, n - 1, POLICY)
    assert slo_replicas(0, POLICY) == 0 and predicted_ttft_p99(8, 2, POLICY) == float("inf")  # 2 x 4 req/s: no margin


def test_slo_headroom_grows_with_the_square_root_of_load():
    mu = POLICY.replica_capacity_rps
    headroom = {load: slo_replicas(load * mu, POLICY) - load for load in (4, 100, 2500)}
    assert all(h > 0 for h in headroom.values())
    assert headroom[100] / 100 < headroom[4] / 4 and headroom[2500] / 2500 < headroom[100] / 100  # a shrinking share
    bursty = POLICY.model_copy(update={"arrival_burstiness": 4})
    assert slo_replicas(400, bursty) > slo_replicas(400, POLICY)


def test_arrival_rate_above_what_the_slo_allows_scales_up_in_one_decision():
    d = decide(0, 2, Signals(queue_waiting=0, request_rate=40), POLICY, ScalerState())
    assert (d.desired, d.cause) == (slo_replicas(40, POLICY), "slo") and d.desired == 11
    assert d.reason.startswith("up: slo ")


def test_a_busy_duty_cycle_is_not_load():
    """DCGM reads ~100 % whenever a vLLM batch runs: at 3 req/s two replicas meet the SLO, so the
    loop holds (the utilisation rule scaled up), and at 1 req/s it steps down despite 100 %."""
    policy = POLICY.model_copy(update={"gpu_util_sustain_seconds": 0, "stabilisation_seconds": 0, "cooldown_seconds": 0})
    busy = Signals(queue_waiting=0, request_rate=3, gpu_util_percent=100)
    assert (decide(0, 2, busy, policy, ScalerState()).desired, decide(0, 2, busy, policy, ScalerState()).cause) == (2, "at_target")
    light = Signals(queue_waiting=0, request_rate=1, gpu_util_percent=100)
    assert decide(0, 4, light, policy, ScalerState()).desired == 3
    utilisation = policy.model_copy(update={"gpu_util_trigger": True})  # the old rule, on request
    assert decide(0, 2, busy, utilisation, ScalerState()).desired == 3  # ceil(2 * 100 / 80)


def test_prewarm_sizes_the_arrival_rate_history_with_the_declared_replica_capacity():
    from workers.cli.scaling import desired_schedules
    from workflows.scaling.floors import ScheduleFile
    from workflows.scaling.prewarm import demand_replicas

    file = ScheduleFile.model_validate({"schedules": [
        {"deployment": "llm/chat", "prewarm": {"replica_capacity_rps": 20}},
        {"deployment": "llm/code", "prewarm": {}},
    ]})
    inputs = [s.action.args[0] for s in desired_schedules(file, "q").values()]
    sizing = {i.deployment: i.sizing for i in inputs}
    assert sizing["llm/chat"].replica_capacity_rps == 20 and sizing["llm/code"] == ScalingPolicy()
    assert demand_replicas({"0:9": [0, 44]}, sizing["llm/code"]) == {"0:9": [0.0, 12.0]}  # 4 req/s per replica + headroom
    assert demand_replicas({"0:9": [44]}, sizing["llm/chat"]) == {"0:9": [float(slo_replicas(44, sizing["llm/chat"]))]}
    assert slo_replicas(44, sizing["llm/chat"]) < 12


def test_a_batch_class_scales_on_completion_time_not_ttft():
    policy = ScalingPolicy(priority_class="batch", min_replicas=0, max_replicas=20, replica_capacity_rps=4,
                           completion_p95_slo_seconds=60, ttft_p99_slo_seconds=1, queue_per_replica=1000)
    # TTFT far over its SLO, but 100 waiting drain in 100 / (2 * 4 - 3) = 20 s: within the 60 s completion SLO
    calm = decide(0, 2, Signals(queue_waiting=100, request_rate=3, ttft_p99_seconds=9, e2e_p95_seconds=30), policy, ScalerState())
    assert calm.desired == 2 and [t.name for t in calm.triggers] == ["completion", "queue"]
    assert calm.triggers[0].value == 30 and not calm.triggers[0].fired
    # 600 waiting: 120 s to drain on 2; ceil((600 / 60 + 3) / 4) = 4 replicas drain it in time
    late = decide(0, 2, Signals(queue_waiting=600, request_rate=3, e2e_p95_seconds=40), policy, ScalerState())
    assert (late.desired, late.cause) == (4, "completion_time") and drain_seconds(600, 3, 4, 4) <= 60
    # the measured p95 over the SLO asks for its ratio even with no backlog
    slow = decide(0, 2, Signals(queue_waiting=0, request_rate=3, e2e_p95_seconds=90), policy, ScalerState())
    assert slow.desired == 3 and drain_replicas(0, 3, 60, 4) == 1
    with pytest.raises(ValueError, match="completion_p95_slo_seconds is for the batch class only"):
        ScalingPolicy(completion_p95_slo_seconds=60)


def test_scale_in_is_frozen_while_a_canary_is_in_analysis_and_scale_up_is_not():
    """Issue 32: evidence is not taken on a moving fleet. While the route splits traffic with a
    canary the loop holds instead of stepping down; it still scales up, and steps down once the
    freeze lifts (the window it waited counts)."""
    policy = POLICY.model_copy(update={"stabilisation_seconds": 300, "cooldown_seconds": 0})
    frozen = "1.3.0 is a canary in analysis"
    state, current = ScalerState(), 6
    for t in range(0, 331, 30):
        d = decide(t, current, QUIET, policy, state, scale_in_frozen=frozen)
        current, state = d.desired, d.state
    assert current == 6 and d.cause == "analysis" and f"scale-in frozen at 6: {frozen}" in d.reason
    assert decide(360, 6, Signals(queue_waiting=200, gpu_util_percent=50), policy, state, scale_in_frozen=frozen).desired > 6
    assert decide(360, 6, QUIET, policy, state).desired == 5
