"""Canary verdicts and step bookkeeping (pure code), plus validation of the rollout input."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from workflows.rollout import gates as canary
from workflows.rollout.gates import AnalysisLimits, Decision, Evaluation, Gates, StepAnalysis, Verdict, evaluate
from workflows.rollout.types import GateQueries, RolloutInput

GOOD = {
    canary.REQUEST_COUNT: 500.0,
    canary.ERROR_RATE: 0.002,
    canary.P99_LATENCY: 1.1,
    canary.STABLE_P99_LATENCY: 1.0,
    canary.TTFT_P99: 0.4,
    canary.TPOT_P99: 0.03,
}


def test_healthy_canary_passes_with_every_gate_checked():
    result = evaluate(GOOD, Gates())
    assert result.verdict is Verdict.PASS
    assert {c.gate for c in result.checks} == {
        canary.ERROR_RATE, canary.P99_LATENCY, canary.P99_LATENCY_SLO, canary.TTFT_P99, canary.TPOT_P99
    }
    latency = next(c for c in result.checks if c.gate == canary.P99_LATENCY)
    assert latency.threshold == pytest.approx(1.2)


@pytest.mark.parametrize(
    "gate, value",
    [
        (canary.ERROR_RATE, 0.05),
        (canary.P99_LATENCY, 1.25),  # stable 1.0 s, 20 % allowed
        (canary.TTFT_P99, 2.5),
        (canary.TPOT_P99, 0.15),
    ],
)
def test_each_gate_fails_alone_and_names_its_numbers(gate, value):
    result = evaluate({**GOOD, gate: value}, Gates())
    assert result.verdict is Verdict.FAIL
    assert [c.gate for c in result.failed] == [gate]
    assert result.failed[0].value == value
    assert gate in result.describe() and f"{value:.4g}" in result.describe()


def test_thresholds_are_configurable():
    assert evaluate({**GOOD, canary.ERROR_RATE: 0.05}, Gates(max_error_rate=0.1)).verdict is Verdict.PASS
    assert evaluate({**GOOD, canary.P99_LATENCY: 1.1}, Gates(max_latency_degradation=0.05)).verdict is Verdict.FAIL


def test_a_gate_without_any_series_while_requests_flow_is_metric_missing():
    values = {**GOOD, canary.TPOT_P99: None}
    missing = evaluate(values, Gates(), no_series={canary.TPOT_P99: {"vllm:time_per_output_token_seconds_bucket"}})
    assert missing.verdict is Verdict.INCONCLUSIVE
    assert missing.metric_missing == ["vllm:time_per_output_token_seconds_bucket"]
    assert missing.describe().startswith("inconclusive: requests 500") and "metric missing: vllm:time_per_output_token_seconds_bucket" in missing.reason
    # a series with no samples in the window (NaN) is no data, not a missing metric
    assert evaluate(values, Gates()).metric_missing == [] and evaluate(values, Gates()).reason == "no data for tpot_p99"
    # without requests nothing is judged: no traffic is not a missing metric
    idle = evaluate({**values, canary.REQUEST_COUNT: 0.0}, Gates(), no_series={canary.TPOT_P99: {"x"}})
    assert idle.metric_missing == [] and "requests < minimum" in idle.reason
    # a failing gate still rolls back
    failing = evaluate({**values, canary.ERROR_RATE: 0.5}, Gates(), no_series={canary.TPOT_P99: {"x"}})
    assert failing.verdict is Verdict.FAIL


def test_saturated_stable_makes_the_latency_comparison_inconclusive_not_a_pass():
    """Issue 16: stable at 9,106 s p99 made any canary "no worse than stable"."""
    saturated = {**GOOD, canary.STABLE_P99_LATENCY: 7588.0, canary.P99_LATENCY: 9000.0}
    result = evaluate(saturated, Gates())
    assert result.verdict is Verdict.FAIL  # the canary itself is far out of the absolute SLO
    assert [c.gate for c in result.failed] == [canary.P99_LATENCY_SLO]
    assert result.failed[0].threshold == 60.0

    within_slo = evaluate({**saturated, canary.P99_LATENCY: 2.0}, Gates())
    assert within_slo.verdict is Verdict.INCONCLUSIVE
    assert "baseline out of its SLO" in within_slo.reason and "7588" in within_slo.reason
    assert within_slo.deciding_gate == canary.STABLE_P99_LATENCY
    assert canary.P99_LATENCY not in {c.gate for c in within_slo.checks}  # no 9,000 s threshold shown


def test_latency_slo_is_absolute_and_configurable():
    slow = {**GOOD, canary.STABLE_P99_LATENCY: 5.0, canary.P99_LATENCY: 5.5}
    assert evaluate(slow, Gates()).verdict is Verdict.PASS
    result = evaluate(slow, Gates(p99_latency_slo_seconds=5.2))
    assert result.verdict is Verdict.FAIL and [c.gate for c in result.failed] == [canary.P99_LATENCY_SLO]
    # a stable exactly at its SLO is still a baseline
    assert evaluate({**slow, canary.P99_LATENCY: 5.0}, Gates(p99_latency_slo_seconds=5.0)).verdict is Verdict.PASS


def test_too_few_requests_is_inconclusive_even_with_bad_numbers():
    result = evaluate({**GOOD, canary.REQUEST_COUNT: 12, canary.ERROR_RATE: 0.5}, Gates())
    assert result.verdict is Verdict.INCONCLUSIVE
    assert "12 requests" in result.reason


def test_no_request_series_counts_as_no_traffic():
    assert evaluate({**GOOD, canary.REQUEST_COUNT: None}, Gates()).verdict is Verdict.INCONCLUSIVE


def test_missing_gate_data_is_never_a_pass_but_a_failure_still_fails():
    assert evaluate({**GOOD, canary.TTFT_P99: None}, Gates()).verdict is Verdict.INCONCLUSIVE
    assert evaluate({**GOOD, canary.STABLE_P99_LATENCY: None}, Gates()).verdict is Verdict.INCONCLUSIVE
    mixed = {**GOOD, canary.TTFT_P99: None, canary.ERROR_RATE: 0.3}
    assert evaluate(mixed, Gates()).verdict is Verdict.FAIL


def test_unmeasurable_is_an_error():
    assert evaluate(None, Gates(), error="connection refused").reason == "connection refused"
    assert evaluate({**GOOD, canary.TTFT_P99: math.nan}, Gates()).verdict is Verdict.ERROR


def _ev(verdict: Verdict) -> Evaluation:
    return Evaluation(verdict=verdict)


def test_failure_limit_zero_rolls_back_on_first_failure():
    assert StepAnalysis().record(_ev(Verdict.FAIL), AnalysisLimits()) is Decision.ROLLBACK


def test_failure_limit_tolerates_that_many_failures():
    step, limits = StepAnalysis(), AnalysisLimits(failure_limit=2)
    assert [step.record(_ev(Verdict.FAIL), limits) for _ in range(3)] == [
        Decision.CONTINUE,
        Decision.CONTINUE,
        Decision.ROLLBACK,
    ]


def test_inconclusive_limit_pauses_and_resume_gives_a_fresh_budget():
    step, limits = StepAnalysis(), AnalysisLimits(inconclusive_limit=2)
    decisions = [step.record(_ev(Verdict.INCONCLUSIVE), limits) for _ in range(3)]
    assert decisions[-1] is Decision.PAUSE_INCONCLUSIVE and decisions[:2] == [Decision.CONTINUE] * 2
    step.resumed()
    assert step.record(_ev(Verdict.INCONCLUSIVE), limits) is Decision.CONTINUE


def test_metric_error_budget_is_consecutive():
    step, limits = StepAnalysis(), AnalysisLimits(metric_error_limit=1)
    assert step.record(_ev(Verdict.ERROR), limits) is Decision.CONTINUE
    assert step.record(_ev(Verdict.PASS), limits) is Decision.CONTINUE  # resets the streak
    assert step.record(_ev(Verdict.ERROR), limits) is Decision.CONTINUE
    assert step.record(_ev(Verdict.ERROR), limits) is Decision.PAUSE_METRIC_ERRORS
    assert step.errors == 3


def test_step_completes_only_after_window_and_enough_passes():
    step = StepAnalysis(passes=9)
    need = canary.required_passes(600, 60)
    assert need == 10
    assert not step.complete(660, 600, need)
    step.passes = 10
    assert not step.complete(540, 600, need)
    assert step.complete(600, 600, need)
    assert canary.required_passes(30, 60) == 1


@pytest.mark.parametrize("stable, weight, expected", [(10, 1, 1), (10, 5, 1), (10, 50, 5), (3, 50, 2), (4, 100, 4)])
def test_canary_replicas_carry_their_share(stable, weight, expected):
    assert canary.canary_replicas(stable, weight) == expected


BASE = {"deployment": "llm-serving/chat", "model": "llama", "version": "1.3.0", "image": "vllm/vllm-openai:v0.6.3"}


def _error_fields(**fields) -> str:
    with pytest.raises(ValidationError) as info:
        RolloutInput.model_validate({**BASE, **fields})
    return str(info.value)


def test_input_defaults_and_implied_promotion_step():
    inp = RolloutInput.model_validate(BASE)
    assert [(s.weight, s.window_seconds) for s in inp.steps] == [(1, 600), (5, 1800), (50, 1800), (100, 1800)]
    assert inp.gate_interval_seconds == 60 and inp.query_window == "60s"
    assert inp.warm_up.deadline_seconds == 900 and inp.scale_down_delay_seconds == 600
    short = RolloutInput.model_validate({**BASE, "steps": [{"weight": 10, "window_seconds": 60}]})
    assert [s.weight for s in short.steps] == [10, 100]


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"deployment": "chat"}, "deployment"),
        ({"version": ""}, "version"),
        ({"weights_uri": "http://x/y", "sha256": "a" * 64}, "weights_uri"),
        ({"weights_uri": "s3://b/k"}, "sha256"),
        ({"weights_uri": "s3://b/k", "sha256": "xyz"}, "sha256"),
        ({"steps": [{"weight": 5, "window_seconds": 60}, {"weight": 1, "window_seconds": 60}]}, "steps"),
        ({"steps": [{"weight": 0, "window_seconds": 60}]}, "steps.0.weight"),
        ({"steps": [{"weight": 101, "window_seconds": 60}]}, "steps.0.weight"),
        ({"steps": [{"weight": 5, "window_seconds": 0}]}, "steps.0.window_seconds"),
        ({"gate_interval_seconds": 0}, "gate_interval_seconds"),
        ({"replicas": 0}, "replicas"),
        ({"surprise": 1}, "surprise"),
        ({"gate_interval_seconds": 1, "steps": [{"weight": 50, "window_seconds": 86400}]}, "gate_interval_seconds"),
        ({"queries": {"error_rate": 'rate(x{a="${nope}"}[1m])'}}, "queries.error_rate"),
    ],
)
def test_bad_input_names_the_field(fields, named):
    assert named in _error_fields(**fields)


def test_the_gateways_503s_fail_the_canary_whose_pods_count_no_error():
    """A canary pod lost mid-window: the gateway answers 503 for its share and no pod counts them."""
    result = evaluate({**GOOD, canary.GATEWAY_ERROR_RATE: 0.2}, Gates())
    assert result.verdict is Verdict.FAIL
    assert [c.gate for c in result.failed] == [canary.GATEWAY_ERROR_RATE]
    assert evaluate({**GOOD, canary.GATEWAY_ERROR_RATE: 0.002}, Gates()).verdict is Verdict.PASS


def test_no_gateway_data_is_never_a_pass():
    metrics = {"envoy_cluster_upstream_rq_total"}
    result = evaluate({**GOOD, canary.GATEWAY_ERROR_RATE: None}, Gates(), no_series={canary.GATEWAY_ERROR_RATE: metrics})
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.metric_missing == ["envoy_cluster_upstream_rq_total"]
    assert evaluate({**GOOD, canary.GATEWAY_ERROR_RATE: None}, Gates()).verdict is Verdict.INCONCLUSIVE


def test_a_gateway_gate_not_queried_is_not_checked():
    """Runs from before the gateway-errors patch never ask it: their verdicts are judged as before."""
    result = evaluate(GOOD, Gates())
    assert result.verdict is Verdict.PASS and canary.GATEWAY_ERROR_RATE not in {c.gate for c in result.checks}


def test_the_gateway_gate_reads_envoys_counters_for_the_canarys_backend():
    query = GateQueries().by_gate()[canary.GATEWAY_ERROR_RATE]
    assert 'envoy_cluster_upstream_rq_xx{namespace="${namespace}",deployment="${deployment}",version="${version}",envoy_response_code_class="5"}' in query
    assert 'envoy_cluster_upstream_cx_none_healthy{namespace="${namespace}",deployment="${deployment}",version="${version}"}' in query
    # the requests are not ``or vector(0)``: without any series of them there is no data
    assert 'sum(rate(envoy_cluster_upstream_rq_total{namespace="${namespace}",deployment="${deployment}",version="${version}"}[${window}])) +' in query
    assert canary.GATEWAY_ERROR_RATE not in GateQueries().by_gate(gateway=False)
    assert canary.GATEWAY_ERROR_RATE not in GateQueries(gateway_error_rate="").by_gate()


def test_default_queries_use_vllm_histograms_and_known_variables():
    queries = GateQueries().by_gate()
    assert set(queries) == set(canary.GATE_NAMES)
    assert "histogram_quantile(0.99" in queries[canary.TTFT_P99]
    assert "vllm:time_to_first_token_seconds_bucket" in queries[canary.TTFT_P99]
    assert 'version="${stable_version}"' in queries[canary.STABLE_P99_LATENCY]
    assert 'status=~"5.."' in queries[canary.ERROR_RATE]


def test_the_stable_is_asked_only_when_it_served_enough_to_tell():
    serving = {canary.REQUEST_COUNT: 500.0, canary.GATEWAY_ERROR_RATE: None}
    unread = {canary.GATEWAY_ERROR_RATE: ["envoy_cluster_upstream_rq_total", "envoy_cluster_upstream_cx_none_healthy"]}
    assert canary.unread_on_stable(serving, unread, Gates()) == ["envoy_cluster_upstream_cx_none_healthy", "envoy_cluster_upstream_rq_total"]
    assert canary.unread_on_stable(serving, {}, Gates()) == []
    assert canary.unread_on_stable({canary.REQUEST_COUNT: 3.0}, unread, Gates()) == []  # below min_requests: a quiet hour
    # the request count reading nothing is a stable with no traffic, not a missing gate
    assert canary.unread_on_stable({canary.REQUEST_COUNT: None}, {canary.REQUEST_COUNT: ["http_requests_total"]}, Gates()) == []
