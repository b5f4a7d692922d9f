"""The benchmarks' bookkeeping, on small slices of the real traces and hand-built cases."""

from __future__ import annotations

import io
import math
from datetime import datetime

import boto3
import pytest

from benchmarks import scaling, spot, staging, traces
from benchmarks.fleet_sim import FleetConfig, simulate
from benchmarks.scaling import SeedPolicy, StaticPolicy, TideplanePolicy
from workflows.scaling.decide import ScalingPolicy, Signals
from workflows.scaling.floors import DeploymentFloors, FloorEntry, PrewarmSpec

CFG = FleetConfig()
T0 = datetime.fromisoformat(scaling.DEFAULT_START)


@pytest.fixture(scope="module")
def day():
    """One day of the first 12 m-large clients at a 15 s step."""
    rate = traces.load_servegen("m-large", clients=12)
    return rate.arrivals(CFG.step_s, seed=0)[: round(86400 / CFG.step_s)]


@pytest.fixture(scope="module")
def results(day):
    return {p.name: simulate(day, p, CFG) for p in scaling.policies(day, CFG, None, "UTC", T0)}


def test_gpu_hours_are_the_integral_of_replicas(results):
    for r in results.values():
        assert r.gpu_hours == pytest.approx(sum(r.replicas) * CFG.step_s / 3600)
        assert r.cost == pytest.approx(r.gpu_hours * CFG.gpu_hour_price)
    hour = simulate([0.0] * 240, StaticPolicy("three", 3), CFG)  # 240 steps of 15 s
    assert hour.gpu_hours == pytest.approx(3.0)


def test_static_peak_never_violates_the_slo(day, results):
    peak = results["static-peak"]
    assert peak.slo_minutes_percent == 100.0
    assert peak.p99_delay_s == 0 and max(peak.delay_s) == 0
    assert peak.replicas[0] == math.ceil(max(day) / CFG.step_s / CFG.capacity_rps)
    assert peak.scale_events == 0


def test_a_fleet_of_one_violates_under_the_peak(day):
    one = simulate(day, StaticPolicy("one", 1), CFG)
    peak_minute = max(range(len(one.minute_ok)), key=lambda m: sum(day[m * 4 : m * 4 + 4]))
    assert not one.minute_ok[peak_minute]
    assert one.slo_minutes_percent < 100
    assert one.p99_delay_s > CFG.ttft_slo_s


def test_cold_start_delays_service_as_configured():
    cfg = FleetConfig(step_s=15, capacity_rps=1, cold_start_s=240)

    class StepUp:
        name, interval_s = "step-up", 30.0

        def initial(self) -> int:
            return 1

        def desired(self, now_s, current, ready, signals) -> int:
            return 3

    r = simulate([30.0] * 80, StepUp(), cfg)  # 2 req/s of demand, 1 req/s per replica
    first = 2  # the first decision runs at t = 30 s (step 2)
    assert r.replicas[first - 1] == 1 and r.replicas[first] == 3  # paid from the order on
    ready_at = first + round(240 / 15)
    assert r.ready[ready_at - 1] == 1 and r.ready[ready_at] == 3  # serving only after the cold start
    assert r.delay_s[ready_at - 1] > 0 and r.delay_s[-1] == 0  # the queue drains once they serve


def test_seed_policy_rules():
    from workflows.scaling.decide import Signals

    seed = SeedPolicy(start=4)
    assert seed.desired(0, 4, 4, Signals(queue_waiting=120, gpu_util_percent=99)) == 4 + 6
    assert seed.desired(30, 4, 4, Signals(queue_waiting=0, gpu_util_percent=10)) == 4
    assert seed.desired(629, 4, 4, Signals(queue_waiting=0, gpu_util_percent=10)) == 4
    assert seed.desired(630, 4, 4, Signals(queue_waiting=0, gpu_util_percent=10)) == 3


def test_tideplane_policy_applies_schedule_floor_at_local_time():
    floors = DeploymentFloors(deployment="bench/fleet", floors=[FloorEntry(at="09:00", replicas=12), FloorEntry(at="18:00", replicas=0)])
    p = TideplanePolicy(ScalingPolicy(min_replicas=1, max_replicas=50), start=2, floors=floors, time_zone="Europe/Paris", t0=T0)
    # t0 is Monday 00:00 UTC = 01:00 in Paris; 08:00 UTC = 09:00 local
    r = simulate([0.0] * round(86400 / 15), p, CFG)
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
        assert any(line.startswith(f"{phase}: 16.0 MiB of 16.0 MiB (100 %)  ") and "/s" in line for line in shown), (phase, shown)
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
