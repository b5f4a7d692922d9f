"""The scaling bench's lower bound (benchmarks.bound): hand-checkable schedules and its defining property."""

from __future__ import annotations

import pytest

from benchmarks import bound, scaling
from benchmarks.loadtest import ReplicaFigures, load_test_capacity
from infra.fleetmodel.fleet import FleetConfig
from infra.fleetmodel.sizes import fixed


def test_a_step_in_demand_is_ordered_exactly_a_cold_start_ahead():
    paid, orders, alive, skipped, optimal = bound.cheapest_schedule([1, 1, 1, 1, 3, 3, 3, 3], cold_slots=2, slots_per_minute=1, skip_share=0.0)
    assert optimal and skipped == []
    assert orders == [0, 0, 2, 0, 0, 0, 0, 0]
    assert alive == [1, 1, 1, 1, 3, 3, 3, 3]
    assert paid == pytest.approx(4 * 1 + 4 * 3 + 2 * 2)  # the two ordered are paid while they start


def test_a_skip_allowance_of_one_minute_skips_the_single_spike():
    needs = [1, 1, 1, 5, 1, 1, 1, 1]
    paid, orders, _, skipped, _ = bound.cheapest_schedule(needs, cold_slots=2, slots_per_minute=1, skip_share=1 / 8)
    assert (paid, skipped, sum(orders)) == (pytest.approx(8.0), [3], 0)
    without, *_ = bound.cheapest_schedule(needs, cold_slots=2, slots_per_minute=1, skip_share=0.0)
    assert without == pytest.approx(8 * 1 + 4 + 4 * 2)  # four more for the spike, paid from their order two slots ahead


def test_the_cold_start_is_rounded_down_to_whole_slots():
    assert bound.cold_start_slots(524.0, 15.0) == 34
    with pytest.raises(ValueError, match="divide a minute"):
        bound.lower_bound([1.0], 7.0, 1.0, 0.0, 1)


def test_the_bound_is_below_every_policy_that_keeps_the_slo():
    """Every policy of the bench on an hour with a surge (cold start one minute): none that keeps
    99.5 % of minutes within the SLO pays fewer GPU-hours than the bound."""
    cfg = FleetConfig(cold_start_s=60.0)
    counts = [120.0 if 1200 <= t < 1800 else 2.0 for t in range(3600)]
    work = scaling.Workload("surge", "synthetic", counts, fixed(500, 200), bursts=False)
    replica = ReplicaFigures(load_test_capacity(cfg, fixed(500, 200)), 0.2, "synthetic")
    runs = scaling.suite(work, cfg, None, replica)
    keeping = [r for r in runs if r.slo_minutes_percent >= 99.5 and r.policy != "oracle"]  # the oracle has no cold start
    assert {scaling.family(r.policy) for r in keeping} >= {"static", "hpa"}  # a surge no reactive policy meets in time
    b = bound.lower_bound(scaling.per_scrape(counts, cfg.scrape_s), cfg.scrape_s, replica.capacity_rps, cfg.cold_start_s, cfg.load().gpus)
    assert b.optimal and b.slo_minutes_percent >= 99.5
    assert 0 < b.gpu_hours <= min(r.gpu_hours for r in keeping)
