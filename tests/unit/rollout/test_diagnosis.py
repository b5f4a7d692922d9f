"""diagnose names the cause behind a canary observation: regression, overload or lost capacity."""

from workflows.rollout.diagnosis import CanaryFleet, Cause, diagnose, live_weight
from workflows.rollout.gates import Evaluation, GateCheck, Verdict

FAIL_LATENCY = Evaluation(verdict=Verdict.FAIL, checks=[GateCheck(gate="p99_latency", value=2.0, threshold=1.2, passed=False)])
FAIL_ERRORS = Evaluation(verdict=Verdict.FAIL, checks=[GateCheck(gate="error_rate", value=0.2, threshold=0.01, passed=False)])
PASS = Evaluation(verdict=Verdict.PASS)


def fleet(**kw) -> CanaryFleet:
    base = dict(weight=50, canary_wanted=4, canary_ready=4, stable_ready=4, canary_rps=40.0, stable_rps=40.0)
    return CanaryFleet(**{**base, **kw})


def test_a_latency_failure_at_equal_load_is_a_regression_and_deprecates():
    d = diagnose(FAIL_LATENCY, fleet())
    assert d.cause is Cause.REGRESSION and d.deprecates


def test_a_latency_failure_under_twice_the_per_replica_load_is_overload_and_resizes():
    d = diagnose(FAIL_LATENCY, fleet(canary_ready=2, canary_wanted=2))
    assert d.cause is Cause.OVERLOAD and not d.deprecates
    assert d.load_ratio == 2.0 and d.replicas == 4


def test_errors_are_a_regression_whatever_the_load():
    assert diagnose(FAIL_ERRORS, fleet(canary_ready=2, canary_wanted=2)).cause is Cause.REGRESSION


def test_a_lost_pod_is_lost_capacity_with_weights_on_live_pods():
    d = diagnose(PASS, fleet(canary_ready=1, canary_wanted=2))
    assert d.cause is Cause.LOST_CAPACITY and d.live_weight == 25 and not d.deprecates
    assert diagnose(FAIL_ERRORS, fleet(no_healthy_upstream=12)).cause is Cause.LOST_CAPACITY
    assert live_weight(50, 0, 2) == 0


def test_an_oom_kill_or_crash_loop_is_a_regression_even_when_gates_pass():
    d = diagnose(PASS, fleet(crashed={"chat-v1-3-0-abc": "OOMKilled"}))
    assert d.cause is Cause.REGRESSION and "OOMKilled" in d.reason


def test_nothing_to_explain_is_healthy():
    assert diagnose(PASS, fleet()).cause is Cause.HEALTHY
