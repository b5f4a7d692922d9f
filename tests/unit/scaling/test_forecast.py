"""The demand forecast over the cold-start horizon and the warm-pool decisions built on it."""

import math

import pytest

from workflows.scaling.forecast import DAY_S, WEEK_S, forecast_demand
from workflows.scaling.warm_pool import (
    NodeCosts,
    WarmPoolFloor,
    break_even_seconds,
    claim_ttl_seconds,
    freed_nodes,
    lapsed_claims,
    nodes_for,
    warm_pool_size,
    with_floors,
    with_freed,
)

STEP = 300.0  # 5-minute samples keep a week of history small


def tide(t: float, height: float = 1.0, weekend: float = 1.0) -> float:
    """A daily tide: 10 req/s at night, 110 at 14:00; ``weekend`` scales Saturday and Sunday."""
    day = (t % WEEK_S) // DAY_S
    scale = weekend if day >= 5 else 1.0
    return height * scale * (60 - 50 * math.cos(2 * math.pi * ((t % DAY_S) / DAY_S - 14 / 24 + 0.5)))


def series(n: int, f) -> list[float]:
    return [f(i * STEP) for i in range(n)]


def test_first_sample_forecasts_the_level():
    f = forecast_demand([7.0], STEP, 600)
    assert (f.basis, f.expected, f.upper, f.checked) == ("trend", 7.0, 7.0, 0)


def test_no_history_forecasts_nothing():
    assert forecast_demand([], STEP, 600).basis == "none"
    assert forecast_demand([None, math.nan], STEP, 600).upper == 0


def test_trend_under_a_day_extrapolates_a_ramp():
    ramp = [10.0 + i for i in range(12)]  # +1 req/s every 5 minutes, an hour of it
    f = forecast_demand(ramp, STEP, 900)
    assert f.basis == "trend"
    assert f.expected == pytest.approx(21 + 3)  # three samples ahead on the fitted line
    assert f.error_ratio == pytest.approx(1.0)  # a straight line is forecast exactly at past origins


def test_trend_reaches_no_farther_than_the_history_it_was_fitted_on():
    # four minutes of a ramp, asked about the next fifteen: the line is followed four minutes out, then held
    f = forecast_demand([0.0, 1.0, 2.0, 3.0], 60.0, 900)
    assert f.basis == "trend"
    assert f.expected == pytest.approx(3 + 4)


def test_origins_without_a_full_trend_of_history_do_not_size_the_forecast():
    # a level of 0.5 req/s in the first minutes, then bursts of 10: the forecast from the first
    # minute missed by 20x, which says nothing about a forecast from a quarter of an hour
    minutes = [0.5, 0.5, 0.5, 10.0, 3.0, 2.0, 0.5, 0.5, 10.0, 5.0, 0.5, 0.0, 4.0, 8.0, 3.0, 2.0]
    early = forecast_demand(minutes, 60.0, 900, error_quantile=0.5)
    assert (early.checked, early.error_ratio) == (0, 1.0)
    assert early.upper == early.expected < 10.0
    # with an hour behind it, origins that had the trend's 30 minutes of history are checked
    later = forecast_demand(minutes * 4, 60.0, 900, error_quantile=0.5)
    assert later.checked > 0
    # a loop a few seconds old (1 s steps): an origin with half of today's history is checked
    assert forecast_demand([5.0] * 10, 1.0, 1.0).checked == 1


def test_trend_never_forecasts_below_zero():
    f = forecast_demand([10.0 - i for i in range(10)], STEP, 3600)
    assert f.expected >= 1.0 and f.upper >= f.level


def test_daily_seasonality_sees_the_morning_ramp_before_it_comes():
    # a day and a half of tide, now 08:00 on the second day: the load climbs steeply over the next hour
    now = DAY_S + 8 * 3600
    hist = series(int(now / STEP) + 1, tide)
    f = forecast_demand(hist, STEP, 3600)
    assert f.basis == "daily"
    actual_peak = max(tide(now + k * STEP) for k in range(1, 13))
    assert f.expected == pytest.approx(actual_peak, rel=0.02)
    trend_only = forecast_demand(hist[-int(DAY_S / STEP) + 1 :], STEP, 3600)  # under a day: no seasonality
    assert trend_only.basis == "trend"
    assert abs(trend_only.expected - actual_peak) > 3 * abs(f.expected - actual_peak)


def test_daily_forecast_scales_with_todays_level():
    now = DAY_S + 8 * 3600
    hist = series(int(DAY_S / STEP), tide) + [2 * tide(i * STEP) for i in range(int(DAY_S / STEP), int(now / STEP) + 1)]
    f = forecast_demand(hist, STEP, 3600)
    assert f.expected == pytest.approx(2 * max(tide(now + k * STEP) for k in range(1, 13)), rel=0.03)


def test_weekly_seasonality_knows_monday_from_sunday():
    # quiet weekends; now is Monday 08:00 after one week: a daily forecast would copy Sunday
    now = WEEK_S + 8 * 3600
    hist = series(int(now / STEP) + 1, lambda t: tide(t, weekend=0.2))
    f = forecast_demand(hist, STEP, 3600)
    daily = forecast_demand(hist[-int(DAY_S / STEP) - 20 :], STEP, 3600)
    actual = max(tide(now + k * STEP, weekend=0.2) for k in range(1, 13))
    assert f.basis == "weekly" and daily.basis == "daily"
    assert f.expected == pytest.approx(actual, rel=0.05)
    assert daily.expected < 0.9 * actual  # Sunday's shape, lifted by today's level, bounded


def test_upper_carries_the_forecasts_own_recent_error():
    # daily seasonality, but the last day runs 30 % above the day before at every hour with spikes
    # the level ratio does not see: the forecast's past errors size the margin
    now = DAY_S + 20 * 3600
    n = int(now / STEP) + 1
    hist = [tide(i * STEP) * (1.3 if i * STEP >= DAY_S and i % 3 == 0 else 1.0) for i in range(n)]
    f = forecast_demand(hist, STEP, 900, error_quantile=0.9, level_s=3600)
    assert f.basis == "daily" and f.checked > 10
    assert f.error_ratio > 1.1
    assert f.upper == pytest.approx(f.expected * f.error_ratio)


def test_missing_samples_are_skipped():
    hist = [10.0, None, 12.0, math.nan, 14.0]
    f = forecast_demand(hist, STEP, 600)
    assert f.basis == "trend" and f.expected > 12


def test_bad_step_is_refused():
    with pytest.raises(ValueError, match="step_s"):
        forecast_demand([1.0], 0, 600)


# ------------------------------------------------------------------------------- warm pool


def test_nodes_for_whole_replicas_on_whole_nodes():
    assert [nodes_for(r, 8) for r in (0, 0.5, 8, 8.2, 17)] == [0, 1, 1, 2, 3]


def test_warm_pool_holds_the_forecast_beyond_the_running_nodes():
    plan = warm_pool_size(peak_replicas=40, running_nodes=3, replicas_per_node=8, max_size=10)
    assert (plan.size, plan.max_prepared) == (2, 5)  # 40 replicas = 5 nodes, 3 run


def test_warm_pool_is_capped_and_floored():
    assert warm_pool_size(400, 3, 8, max_size=10).size == 10
    assert "capped" in warm_pool_size(400, 3, 8, max_size=10).reason
    assert warm_pool_size(0, 3, 8, max_size=10, min_size=1).size == 1
    with pytest.raises(ValueError):
        warm_pool_size(0, 3, 8, max_size=1, min_size=2)


def test_break_even_is_the_boot_time_saved_against_the_disk_cost():
    costs = NodeCosts(running_per_hour=80.0, stopped_per_hour=0.1, fresh_start_seconds=300, warm_start_seconds=60)
    assert break_even_seconds(costs) == pytest.approx(240 * 80 / 0.1)  # 53 hours: disks are cheap next to GPUs


def test_freed_nodes_go_back_to_the_pool_only_when_needed_again():
    # 2 nodes freed, 3 still run, 1 already warm; the forecast within break-even wants 5 nodes: one goes back
    out = freed_nodes(freed=2, running_after=3, peak_replicas_within_break_even=40, replicas_per_node=8, in_warm_pool=1, max_size=10)
    assert (out.to_warm_pool, out.to_terminate) == (1, 1)
    quiet = freed_nodes(freed=2, running_after=3, peak_replicas_within_break_even=10, replicas_per_node=8, in_warm_pool=0, max_size=10)
    assert (quiet.to_warm_pool, quiet.to_terminate) == (0, 2)
    full = freed_nodes(freed=2, running_after=0, peak_replicas_within_break_even=80, replicas_per_node=8, in_warm_pool=9, max_size=10)
    assert full.to_warm_pool == 1


def test_the_warm_pool_is_sized_to_keep_exactly_the_freed_nodes_the_break_even_peak_needs():
    # 4 nodes run, the cold-start forecast wants none warm; one node is freed
    forecast = warm_pool_size(peak_replicas=4, running_nodes=4, replicas_per_node=1, max_size=5)
    kept = with_freed(forecast, held=0, peak_replicas_within_break_even=4, running=4, freed=1, replicas_per_node=1, max_size=5)
    assert kept.size == 1 and "1 of 1 freed node(s) back to the warm pool" in kept.reason
    gone = with_freed(forecast, held=0, peak_replicas_within_break_even=3, running=4, freed=1, replicas_per_node=1, max_size=5)
    assert gone.size == 0 and "0 of 1 freed" in gone.reason
    # next cycle, 3 running: the kept node stays while the break-even peak needs it, lapses when it no longer does
    after = warm_pool_size(peak_replicas=3, running_nodes=3, replicas_per_node=1, max_size=5)
    assert with_freed(after, held=1, peak_replicas_within_break_even=4, running=3, freed=0, replicas_per_node=1, max_size=5).size == 1
    assert with_freed(after, held=1, peak_replicas_within_break_even=3, running=3, freed=0, replicas_per_node=1, max_size=5) is after


def test_spot_mix_floors_raise_the_warm_pool_in_nodes_added_up_and_capped():
    forecast = warm_pool_size(peak_replicas=8, running_nodes=0, replicas_per_node=8, max_size=6)  # 1 node
    batch = WarmPoolFloor(source="llm-serving/batch", replicas=5, gpus_per_replica=2)  # 2 per 4-GPU node: 3 nodes
    raised = with_floors(forecast, [batch], gpus_per_node=4, max_size=6)
    assert (raised.size, raised.max_prepared) == (3, 3)
    assert raised.reason == "spot mix floor for llm-serving/batch, above the forecast's 1"
    other = WarmPoolFloor(source="llm-serving/embed", replicas=16)  # 4 per node: 4 nodes
    both = with_floors(forecast, [batch, other], gpus_per_node=4, max_size=6)
    assert both.size == 6 and "llm-serving/batch 3 + llm-serving/embed 4 (capped from 7)" in both.reason
    assert with_floors(forecast, [batch.model_copy(update={"replicas": 0})], 4, 6) is forecast  # a lapsed claim
    assert with_floors(warm_pool_size(40, 0, 8, 6), [batch], 4, 6).size == 5  # the forecast's larger size stands


def test_a_claim_lives_a_few_of_its_claimants_intervals_and_lapses_at_its_deadline():
    assert (claim_ttl_seconds(30), claim_ttl_seconds(1)) == (300, 60)  # ten intervals, at least a minute
    assert lapsed_claims({"llm-serving/b": 100.0, "llm-serving/a": 90.0, "llm-serving/c": 100.5}, now=100.0) == [
        "llm-serving/a", "llm-serving/b"]
    assert WarmPoolFloor.model_validate({"source": "llm-serving/batch", "replicas": 2}).ttl_seconds is None  # a signal of before
