"""The benchmarks' bookkeeping and the baselines' rules, on hand-built cases and small trace slices."""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import datetime

import boto3
import pytest

from benchmarks import scaling, spot, node_cache as staging, traces, yardstick
from benchmarks.baselines import HpaPolicy, HpaRule, KedaPolicy, OraclePolicy, StaticPolicy
from benchmarks.scaling import TideplanePolicy
from tests.public_traces import need
from infra.fleetmodel.fleet import Aggregate, FleetConfig, simulate
from infra.fleetmodel.sizes import fixed
from workflows.scaling.decide import ScalingPolicy, Signals, slo_replicas
from workflows.scaling.floors import DeploymentFloors, FloorEntry, PrewarmSpec

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


def test_a_span_of_a_run_counts_only_its_own_scale_events():
    """Week 1 and week 2 of one 14-day run each report the scale events inside them (both once
    reported the whole run's count)."""
    class UpThenDown:
        name, interval_s = "up-then-down", 30.0

        def initial(self) -> int:
            return 1

        def desired(self, now_s, current, ready, signals) -> int:
            return 3 if now_s < 3600 else 2

    run = _run([1.0] * 7200, UpThenDown())
    assert run.scale_events == 2
    assert (run.hours(0, 1).scale_events, run.hours(1, 2).scale_events) == (1, 1)


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


def test_keda_on_request_rate_scales_up_once_per_period_and_down_after_its_window():
    rate = KedaPolicy(start=2, target_per_replica=20, metric="rate", rule=HpaRule(down_stabilisation_s=900, up_period_s=60), interval_s=30)
    assert rate.name == "keda-rate-20-down900"
    assert rate.desired(0, 2, 2, Signals(request_rate=200)) == 6  # ceil(200 / 20) = 10, +4 pods at most
    assert rate.desired(30, 6, 6, Signals(request_rate=200)) == 6  # the next step waits for the 60 s period
    assert rate.desired(60, 6, 6, Signals(request_rate=200)) == 10
    assert rate.desired(600, 10, 10, Signals(request_rate=20)) == 10  # 10 recommended within the 900 s window
    assert rate.desired(961, 10, 10, Signals(request_rate=20)) == 1


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
    # 44 req/s needs 12 replicas of 4 req/s with the SLO headroom; DCGM reads 100 % either way
    assert slo_replicas(44, p.policy) == 12
    busy, idle = Signals(queue_waiting=0, request_rate=44, gpu_util_percent=100.0), Signals(queue_waiting=0, request_rate=0, gpu_util_percent=100.0)
    for half_minute in range(7 * 24 * 120):  # one week, a decision every 30 s, 12 replicas all along
        now = half_minute * 30.0
        p.desired(now, 12, 12, busy if now // 3600 == 9 else idle)
    week = 7 * 86400
    assert p.floor(week + 8 * 3600 + 55 * 60) == 12  # Monday 08:55: the 09h demand is 10 minutes ahead
    assert p.floor(week + 14 * 3600) == 0  # Monday 14h: 12 replicas stood idle, the load needed none


def test_scaling_bench_on_a_day_of_servegen(tmp_path):
    need(traces.SERVEGEN)
    """Every family runs, the oracle is the cheapest fleet within the SLO, files are written."""
    (report,) = scaling.run(traces.SERVEGEN, tmp_path, CFG, seeds=(0,), clients=12, days=0.5, tuned=False)
    (runs,) = report.runs
    by = {r.policy: r for r in runs}
    assert {scaling.family(n) for n in by} == {"oracle", "static", "hpa", "keda-waiting", "keda-in_flight", "keda-rate", "tideplane"}
    oracle = by["oracle"]
    assert oracle.slo_minutes_percent >= 99.0
    within = [r for r in runs if r.slo_minutes_percent >= oracle.slo_minutes_percent]
    assert min(within, key=lambda r: r.gpu_hours) is oracle
    assert {p.suffix for p in tmp_path.iterdir()} == {".csv", ".md", ".png"}
    (results,) = tmp_path.glob("*-results.csv")
    with results.open() as f:
        contract = list(csv.DictReader(f))
    assert list(contract[0]) == yardstick.CONTRACT_COLUMNS
    assert {(r["policy"], r["seed"], r["split"]) for r in contract} == {(name, "0", "tuning") for name in {*by, "bound"}}  # half a day of week 1
    assert {r["family"] for r in contract} == {"bound", "ideal", "static", "hpa-gpu-util", "keda-waiting", "keda-in_flight", "keda-rate", "tideplane"}
    assert {r["policy"] for r in contract if r["warm_pool"] == "yes"} == scaling.WARM_POOL_POLICIES


def _scenario(*availability: list[bool], spot_prices=(10.0, 20.0), launched=None) -> spot.Scenario:
    """Domains z0, z1 (one region, 10-minute samples); on-demand $80/h per instance."""
    zones = [
        traces.SpotZone(zone=f"r-{i}", region="r", instance_type="t", step_s=600, spot_price=spot_prices[i], on_demand_price=80.0,
                        gpus=8, available=list(a), launched=None if launched is None else launched[i], requested=None if launched is None else 16)
        for i, a in enumerate(availability)
    ]
    return spot.Scenario("test", zones, 0, min(len(a) for a in availability))


def test_all_on_demand_cost_is_hours_times_price():
    s = _scenario([True] * 12, [True] * 12)  # 2 hours
    r = spot.on_demand_only(s, spot.Model(target=4))
    assert r.cost == pytest.approx(2 * 4 * 80.0)
    assert min(r.ready) == 4


def test_spot_only_gets_the_notice_when_the_trace_says_and_relaunches_elsewhere():
    up, down = True, False
    s = _scenario([up, up, down, down, up, up], [up] * 6)
    r = spot.spot_only(s, spot.Model(target=2, notice_s=120, cold_start_s=240))
    # notice at minute 20 (the first sample that reads unavailable), instances stop at 22, z1's serve from 24
    assert r.ready[:22] == [2] * 22 and r.ready[22:24] == [0, 0] and r.ready[24:] == [2] * 36
    assert r.preempted == 2
    assert r.cost == pytest.approx(2 * 10.0 * 22 / 60 + 2 * 20.0 * 40 / 60)
    row = spot.row(r, 1.0, 2)
    assert row["gap_minutes"] == 2 and row["gap_replica_minutes"] == 4


def test_the_replay_never_looks_ahead():
    """Changing the trace after a sample changes nothing before it."""
    up, down = True, False
    model, settings = spot.Model(target=2), spot.Settings(availability=0.9, max_overprovision=2)
    later = [up] * 6 + [down] * 3 + [up] * 3
    a = spot.policy_mix(_scenario(later, later), model, settings)
    b = spot.policy_mix(_scenario([up] * 12, [up] * 12), model, settings)
    assert a.ready[:60] == b.ready[:60] and a.on_demand[:60] == b.on_demand[:60]
    assert a.on_demand[61] > b.on_demand[61], "the notice at minute 60 is the first the policy knows"


def test_a_domain_holds_only_what_its_launches_got():
    up = True
    s = _scenario([up] * 6, [up] * 6, launched=[[1] * 6, [0] * 6])
    r = spot.spot_only(s, spot.Model(target=4))
    assert max(r.spot) == 1 and r.refused_spot > 0 and max(r.ready) == 1


def test_mix_covers_a_correlated_loss_on_demand_and_returns_to_spot():
    up, down = True, False
    zone = [up] * 3 + [down] * 2 + [up] * 9
    s = _scenario(zone, zone)  # both domains fail together: only on-demand can cover
    settings = spot.Settings(availability=0.9, max_overprovision=2, stabilisation_s=600)
    r = spot.policy_mix(s, spot.Model(target=2, notice_s=120, cold_start_s=240), settings)
    assert r.preempted > 0
    # notice at minute 30, spot stops at 32, on-demand ordered at 30 serves from 34
    assert r.ready[28:35] == [2, 2, 2, 2, 0, 0, 2] and min(r.ready[34:50]) >= 2
    assert r.on_demand[-1] == 0, "back on spot after the stabilisation delay"
    assert sum(x < 2 for x in r.ready) == 2

    none = spot.policy_mix(s, spot.Model(target=2, notice_s=120, cold_start_s=240, on_demand_capacity=0), settings)
    assert none.refused_on_demand > 0 and max(none.on_demand) == 0
    assert sum(x < 2 for x in none.ready) > sum(x < 2 for x in r.ready), "on-demand that runs out leaves the gap open"


def test_outputs_are_named_after_the_trace(tmp_path):
    folder = tmp_path / "aws-p5-us-east-1"
    folder.mkdir()
    for zone, data in (("us-east-1a", [0] * 10 + [1] * 4 + [0] * 10), ("us-east-1b", [0] * 24)):
        doc = {"metadata": {"zone": zone, "gap_seconds": 300, "instance_type": "p5.48xlarge",
                            "price_info": {"price": 30.0, "on_demand_price": 98.32}}, "data": data}
        (folder / f"{zone}.json").write_text(json.dumps(doc))
    out = tmp_path / "results"
    table = spot.run(folder, out, spot.Model(target=2), sweep=False)
    assert {p.name for p in out.iterdir()} == {"spot-aws-p5-us-east-1.csv", "spot-aws-p5-us-east-1.md"}
    assert "aws-p5-us-east-1" in (out / "spot-aws-p5-us-east-1.md").read_text()
    assert [r["scenario"] for r in table][:3] == ["us-east-1 (2 zones)"] * 3


class Terminal(io.StringIO):
    """What the bench writes to a terminal."""

    def isatty(self) -> bool:
        return True


def test_staging_bench_resumes_from_the_verified_half(tmp_path, capsys):
    table = staging.run(None, size_bytes=48 * 2**20, files=2, repeats=1, workdir=tmp_path)
    assert capsys.readouterr().err == ""  # no progress lines in a CI log
    values = {row["measure"]: row["value"] for row in table}
    assert values["bytes verified from disk, not fetched again"].startswith("24 of 48")
    assert float(values["throughput ratio stage_weights / boto3 (goal >= 0.9)"]) > 0
    assert list(tmp_path.iterdir()) == []  # the bench cleans up after itself


def test_staging_bench_uses_its_own_s3_after_the_sandbox_env_is_sourced(tmp_path, moto_url, monkeypatch):
    """`source .tideplane/sandbox/env` points AWS_ENDPOINT_URL and TIDEPLANE_AWS_ENDPOINT_URL at
    the sandbox's S3 (here the session's moto): the bench still stages from its own server."""
    for name in ("AWS_ENDPOINT_URL", "TIDEPLANE_AWS_ENDPOINT_URL"):
        monkeypatch.setenv(name, moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "sandbox")
    terminal = Terminal()
    table = staging.run(None, size_bytes=16 * 2**20, files=1, repeats=1, workdir=tmp_path, progress_stream=terminal)
    values = {row["measure"]: row["value"] for row in table}
    shown = [line.rsplit("\r", 1)[-1] for line in terminal.getvalue().split("\n")]  # each phase's last redraw
    for phase in ("upload to moto", "boto3 download_file, run 1", "stage_weights, run 1", "stage_weights, the retry"):
        assert any(line.startswith(f"{phase}: [####################] 16.0 MiB of 16.0 MiB (100 %)  ") and "/s" in line for line in shown), (phase, shown)
    assert values["bytes verified from disk, not fetched again"] == "8 of 16"
    assert values["weight set"] == "0.02 GiB in 1 file"  # not "1 files"
    sandbox_s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    assert staging.BUCKET not in {b["Name"] for b in sandbox_s3.list_buckets()["Buckets"]}


async def test_control_plane_bench_runs_real_loops_and_measures_them():
    from benchmarks import control_plane

    (row,) = await control_plane.run(None, loops=(3,), duration_s=8, interval_s=2, iterations_per_run=3)
    assert row["loops"] == 3 and row["decisions"] >= 6
    assert row["worker_cpu_percent"] > 0 and row["worker_rss_mib"] > 0
    assert row["cycle_p50_ms"] > 0  # decisions that scaled went through scale_version
    assert 10 < row["history_events_per_decision"] < 40
    assert row["history_kib_per_run_max"] < 100  # continue-as-new every 3 decisions bounds a run


# ------------------------------------------------------------------ cold start by its parts, warm pool


def test_each_lever_takes_its_own_part_off_the_cold_start():
    from infra.fleetmodel.coldstart import Levers, load_cold_start

    cold = load_cold_start()
    p = cold.parts_s
    assert cold.fresh_s == sum(cold.fresh().values()) and "image_pull" in cold.fresh()
    pool = cold.warm_s(Levers(warm_pool=True))
    assert cold.fresh_s - pool == p["node_fresh"] - p["node_warm"] + p["image_pull"] - p["image_cached"]
    weights = cold.warm_s(Levers(warm_pool=True, local_weights=True))
    assert pool - weights == p["weights_s3"]
    assert weights - cold.warm_s(Levers(warm_pool=True, local_weights=True, engine_caches=True)) == p["compile"] - p["compile_cached"]


def test_warm_pool_starts_replicas_warm_while_it_has_slots_and_takes_freed_ones_back():
    from benchmarks.nodes import NodeLayer
    from infra.fleetmodel.coldstart import Levers, load_cold_start

    cold = load_cold_start()
    levers = Levers(warm_pool=True, local_weights=True, engine_caches=True)
    nodes = NodeLayer(cold, levers, fresh_s=cold.fresh_s, slot_gpus=1, max_pool_slots=30, gpu_hour_price=10.0)
    nodes.resize(0, peak_within_refill=4, peak_within_break_even=4, running=4)  # prepared before the run: nothing wanted
    nodes.resize(0, peak_within_refill=20, peak_within_break_even=20, running=4)  # 16 more wanted: launch them into the pool
    assert len(nodes.refilling) == 16 and nodes.standby_gpu_hours_per_hour == 16  # launching capacity runs
    assert nodes.startup_seconds(60, 3) == [cold.fresh_s] * 3  # not usable before the refill is done
    later = cold.refill_s + 1
    assert nodes.startup_seconds(later, 18) == [cold.warm_s(levers)] * 16 + [cold.fresh_s] * 2
    assert nodes.standby_gpu_hours_per_hour == 0
    # 8 replicas scaled down while the day's forecast still wants 30: back to the pool, stopped
    nodes.release(later + 600, 8, running_after=17, peak_replicas_within_break_even=30)
    assert nodes.warm_slots == 8 and 0 < nodes.standby_gpu_hours_per_hour < 0.01  # stopped capacity costs its disks
    nodes.release(later + 700, 8, running_after=9, peak_replicas_within_break_even=9)  # not needed again: terminated
    assert nodes.warm_slots == 8


def test_the_fleet_model_starts_each_replica_as_the_policy_says():
    class TwoSpeeds:
        name, interval_s = "two-speeds", 30.0

        def initial(self) -> int:
            return 1

        def desired(self, now_s, current, ready, signals) -> int:
            return 3

        def startup_seconds(self, now_s, count):
            return [60.0, 600.0][:count]

    r = _run([0.0] * 1200, TwoSpeeds())
    first = 2  # the first decision, at t = 30 s
    assert r.replicas[first] == 3
    assert r.ready[first + 60 // 15 - 1] == 1 and r.ready[first + 60 // 15] == 2 and r.ready[first + 600 // 15] == 3


def test_forecast_has_the_ramp_ready_on_the_second_day():
    """A daily step from 4 to 40 req/s at 08:00: on day 2 the forecast's floor has the replicas the
    step needs ordered one cold start before it comes; the reactive loop orders them when it sees it."""
    policy = ScalingPolicy(min_replicas=1, max_replicas=60, replica_capacity_rps=4)
    reactive = TideplanePolicy(policy, start=2, cold_start_s=240)
    ahead = TideplanePolicy(policy.model_copy(update={"forecast_horizon_seconds": 240}), start=2, cold_start_s=240)
    rate = lambda t: 40.0 if 8 * 3600 <= t % 86400 < 20 * 3600 else 4.0  # noqa: E731
    wants = {reactive.name: [], "ahead": []}
    current = {id(reactive): 2, id(ahead): 2}
    for half_minute in range(2 * 24 * 120 - 1):
        now = half_minute * 30.0
        for p, key in ((reactive, reactive.name), (ahead, "ahead")):
            signals = Signals(queue_waiting=0, request_rate=rate(now - 60))  # a 1-minute rate window lags
            current[id(p)] = p.desired(now, current[id(p)], current[id(p)], signals)
            wants[key].append(current[id(p)])
    before = (86400 + 8 * 3600 - 240) // 30  # day 2, 07:56: a cold start before the step
    need = slo_replicas(40, policy)
    assert wants["ahead"][before] >= need > wants[reactive.name][before]
    assert ahead.policy.forecast_horizon_seconds == 240
