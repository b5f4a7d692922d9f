"""The benchmarks' bookkeeping and the baselines' rules, on hand-built cases and small trace slices."""

from __future__ import annotations

from datetime import datetime

import pytest

from benchmarks import scaling, spot, staging, traces
from benchmarks.baselines import HpaPolicy, HpaRule, KedaPolicy, OraclePolicy, StaticPolicy
from benchmarks.scaling import TideplanePolicy
from infra.fleetmodel.fleet import Aggregate, FleetConfig, simulate
from infra.fleetmodel.sizes import fixed
from workflows.scaling import ScalingPolicy, Signals
from workflows.schedule_floors import DeploymentFloors, FloorEntry, PrewarmSpec

CFG = FleetConfig()
T0 = datetime.fromisoformat(scaling.DEFAULT_START)


def _run(counts: list[float], policy, cfg: FleetConfig = CFG):
    """``policy`` over per-second arrivals of 500-token prompts and 200-token answers."""
    return simulate(Aggregate(counts, cfg.step_s, fixed(500, 200), cfg.load()), policy, len(counts), cfg, [], "aggregate")


def test_gpu_hours_are_the_integral_of_replicas():
    hour = _run([0.0] * 3600, StaticPolicy("three", 3))
    assert hour.gpu_hours == pytest.approx(3.0)
    assert hour.cost == pytest.approx(3.0 * CFG.gpu_hour_price)
    assert hour.slo_minutes_percent == 100.0  # minutes without requests are not violations


def test_cold_start_delays_service_as_configured():
    class StepUp:
        name, interval_s = "step-up", 30.0

        def initial(self) -> int:
            return 1

        def desired(self, now_s, current, ready, signals) -> int:
            return 3

    capacity = Aggregate([0.0], 15, fixed(500, 200), CFG.load()).window(0).capacity_rps
    r = _run([2.5 * capacity] * 1200, StepUp())  # 2.5 replicas of demand on one
    first = 2  # the first decision runs at t = 30 s (scrape 2)
    assert r.replicas[first - 1] == 1 and r.replicas[first] == 3  # paid from the order on
    ready_at = first + round(CFG.cold_start_s / CFG.scrape_s)
    assert r.ready[ready_at - 1] == 1 and r.ready[ready_at] == 3  # serving only after the cold start
    assert r.minute_p99_exact[2] > CFG.ttft_slo_s and r.minute_p99_exact[-1] < CFG.ttft_slo_s  # the backlog drains


def test_hpa_rule_tolerance_scale_up_limit_and_down_stabilisation():
    hpa = HpaPolicy(start=4, target_percent=50)
    assert hpa.desired(0, 4, 4, Signals(gpu_util_percent=53)) == 4  # within 10 % of target
    assert hpa.desired(15, 4, 4, Signals(gpu_util_percent=100)) == 8  # ceil(4 * 100 / 50)
    assert HpaPolicy(start=10, target_percent=10).desired(0, 10, 10, Signals(gpu_util_percent=100)) == 20  # +100 % per sync at most
    assert HpaPolicy(start=2, target_percent=10).desired(0, 2, 2, Signals(gpu_util_percent=100)) == 6  # or +4 pods
    assert hpa.desired(30, 8, 8, Signals(gpu_util_percent=10)) == 8  # 2 wanted, but 8 was recommended < 300 s ago
    assert hpa.desired(316, 8, 8, Signals(gpu_util_percent=10)) == 2  # the window has passed
    assert hpa.desired(330, 2, 2, Signals()) == 2  # no metric: hold
    capped = HpaPolicy(start=4, target_percent=50, rule=HpaRule(max_replicas=5))
    assert capped.desired(0, 4, 4, Signals(gpu_util_percent=100)) == 5


def test_keda_rule_sizes_on_the_total_per_replica():
    waiting = KedaPolicy(start=2, target_per_replica=10)
    assert waiting.desired(0, 2, 2, Signals(queue_waiting=95, running=400)) == 6  # ceil(95 / 10), +4 pods at most
    assert waiting.desired(15, 6, 6, Signals(queue_waiting=0, running=400)) == 6  # stabilising
    assert waiting.desired(400, 6, 6, Signals(queue_waiting=0, running=400)) == 1  # min replicas: waiting alone says nothing is needed
    in_flight = KedaPolicy(start=2, target_per_replica=100, metric="in_flight")
    assert in_flight.desired(0, 2, 2, Signals(queue_waiting=95, running=400)) == 5  # ceil(495 / 100)
    assert in_flight.desired(15, 5, 5, Signals(queue_waiting=0, running=480)) == 5  # 480 / (100 x 5): within tolerance
    assert in_flight.desired(30, 5, 5, Signals(error="prometheus down")) == 5


def test_oracle_sizes_each_interval_for_its_busiest_second():
    counts = [10.0] * 15 + [95.0] + [10.0] * 14
    oracle = OraclePolicy(counts, lambda t: 20.0)
    assert oracle.initial() == 1  # seconds 0-14: ceil(10 / 20)
    assert oracle.need(15) == 5  # seconds 15-29 hold the burst: ceil(95 / 20)


def test_curves_are_compared_at_equal_slo_on_their_frontier():
    curve = [(90.0, 100.0), (99.0, 300.0), (95.0, 500.0), (100.0, 400.0)]  # (95, 500) is dominated by (99, 300)
    assert scaling.frontier(curve) == [(90.0, 100.0), (99.0, 300.0), (100.0, 400.0)]
    assert scaling.at_slo(curve, 94.5) == pytest.approx(200.0)
    assert scaling.at_slo(curve, 99.5) == pytest.approx(350.0)
    assert scaling.at_slo(curve, 80.0) is None


def test_tideplane_policy_applies_schedule_floor_at_local_time():
    floors = DeploymentFloors(deployment="bench/fleet", floors=[FloorEntry(at="09:00", replicas=12), FloorEntry(at="18:00", replicas=0)])
    p = TideplanePolicy(ScalingPolicy(min_replicas=1, max_replicas=50), start=2, floors=floors, time_zone="Europe/Paris", t0=T0)
    # t0 is Monday 00:00 UTC = 01:00 in Paris; 08:00 UTC = 09:00 local
    r = _run([0.0] * 86400, p)
    nine = round(8 * 3600 / 15)
    assert max(r.replicas[: nine - 2]) == 2
    assert r.replicas[nine + 2] == 12
    assert r.ready[nine + 2] < 12 and r.ready[nine + 2 + round(CFG.cold_start_s / 15)] == 12


def test_prewarm_learns_from_demand_not_from_its_own_floors():
    """A week held at 12 replicas that were busy only at 09h pre-warms 12 for 09h, not for every hour."""
    floors = DeploymentFloors(deployment="bench/fleet", prewarm=PrewarmSpec(startup_seconds=600))
    p = TideplanePolicy(ScalingPolicy(min_replicas=1, max_replicas=50), start=12, floors=floors, t0=T0)
    busy, idle = Signals(queue_waiting=0, gpu_util_percent=80.0), Signals(queue_waiting=0, gpu_util_percent=0.0)
    for half_minute in range(7 * 24 * 120):  # one week, a decision every 30 s, 12 replicas all along
        now = half_minute * 30.0
        p.desired(now, 12, 12, busy if now // 3600 == 9 else idle)
    week = 7 * 86400
    assert p.floor(week + 8 * 3600 + 55 * 60) == 12  # Monday 08:55: the 09h demand is 10 minutes ahead
    assert p.floor(week + 14 * 3600) == 0  # Monday 14h: 12 replicas stood idle, the load needed none


def test_scaling_bench_on_a_day_of_servegen(tmp_path):
    """Every family runs, the oracle is the cheapest fleet within the SLO, files are written."""
    (report,) = scaling.run(traces.SERVEGEN, tmp_path, CFG, seeds=(0,), clients=12, days=0.5, tuned=False)
    (runs,) = report.runs
    by = {r.policy: r for r in runs}
    assert {scaling.family(n) for n in by} == {"oracle", "static", "hpa", "keda-waiting", "keda-in_flight", "tideplane"}
    oracle = by["oracle"]
    assert oracle.slo_minutes_percent >= 99.0
    within = [r for r in runs if r.slo_minutes_percent >= oracle.slo_minutes_percent]
    assert min(within, key=lambda r: r.gpu_hours) is oracle
    assert {p.suffix for p in tmp_path.iterdir()} == {".csv", ".md", ".png"}


def _zones(*availability: list[bool], spot_prices=(8.0, 16.0)) -> spot.Market:
    zones = [
        traces.SpotZone(zone=f"z{i}", step_s=600, spot_price=spot_prices[i], on_demand_price=80.0, gpus=8, available=list(a))
        for i, a in enumerate(availability)
    ]
    return spot.market(zones)


def test_all_on_demand_cost_is_hours_times_price():
    m = _zones([True] * 12, [True] * 12)  # 2 hours
    r = spot.on_demand_only(m, target=4)
    assert r.cost == pytest.approx(2 * 4 * 10.0)
    assert min(r.ready) == 4


def test_spot_only_gaps_while_its_zone_is_unavailable():
    up, down = True, False
    m = _zones([up, up, down, down, up, up], [up] * 6)  # z0 cheap ($1/GPU-h), z1 $2/GPU-h
    r = spot.spot_only(m, target=2, cold_start_s=240, notice_s=0)
    assert r.ready[:20] == [2] * 20
    assert r.ready[20:24] == [0] * 4  # z0 preempted at minute 20; z1 replicas need 4 minutes
    assert r.ready[24:] == [2] * 36 and r.preempted == 2
    assert r.cost == pytest.approx(2 * 1.0 * 20 / 60 + 2 * 2.0 * 40 / 60)
    table = {row["policy"]: row for row in spot.rows([spot.on_demand_only(m, 2), r], 2)}
    assert table["spot-only"]["gap_minutes"] == 4 and table["spot-only"]["gap_replica_minutes"] == 8

    nowhere = spot.spot_only(_zones([down] * 3), target=2, cold_start_s=240, notice_s=0)
    assert max(nowhere.ready) == 0 and nowhere.cost == 0


def test_mix_falls_back_to_on_demand_and_returns_to_spot():
    up, down = True, False
    zone = [up] * 3 + [down] * 2 + [up] * 9
    m = _zones(zone, zone)  # both zones fail together: only on-demand can cover
    r = spot.tideplane_mix(m, target=2, availability=0.9, window=6, cold_start_s=240, return_delay_s=600, notice_s=60)
    assert r.preempted > 0
    assert max(r.on_demand[30:50]) >= 2  # fallback while spot is gone
    # preempted at minute 30; on-demand ordered on the 60 s notice (minute 29) serves from minute 33
    assert r.ready[27:34] == [2, 2, 2, 0, 0, 0, 2] and min(r.ready[33:50]) >= 2
    assert r.on_demand[-1] == 0  # back on spot after the stabilisation delay
    assert sum(x < 2 for x in r.ready) == 3


def test_staging_bench_resumes_from_the_verified_half(tmp_path):
    table = staging.run(None, size_bytes=48 * 2**20, files=2, repeats=1, workdir=tmp_path)
    values = {row["measure"]: row["value"] for row in table}
    assert values["bytes verified from disk, not fetched again"].startswith("24 of 48")
    assert float(values["throughput ratio stage_weights / boto3 (goal >= 0.9)"]) > 0
    assert list(tmp_path.iterdir()) == []  # the bench cleans up after itself


async def test_control_plane_bench_runs_real_loops_and_measures_them():
    from benchmarks import control_plane

    (row,) = await control_plane.run(None, loops=(3,), duration_s=8, interval_s=2, iterations_per_run=3)
    assert row["loops"] == 3 and row["decisions"] >= 6
    assert row["worker_cpu_percent"] > 0 and row["worker_rss_mib"] > 0
    assert row["cycle_p50_ms"] > 0  # decisions that scaled went through scale_version
    assert 10 < row["history_events_per_decision"] < 40
    assert row["history_kib_per_run_max"] < 100  # continue-as-new every 3 decisions bounds a run
