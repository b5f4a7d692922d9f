"""``tideplane bench scaling --jobs``: policies run side by side give the figures they give one after another."""

from benchmarks import scaling, traces
from benchmarks.loadtest import ReplicaFigures
from tests.public_traces import need
from infra.fleetmodel.fleet import FleetConfig


def test_suite_in_two_processes_matches_one_after_another():
    need(traces.SERVEGEN)
    work = scaling.load_workload(traces.SERVEGEN, 0, clients=12).slice(12 * 3600, 13 * 3600, "noon")
    cfg = FleetConfig(step_s=15.0)
    alone = scaling.suite(work, cfg, None, ReplicaFigures(30.0, 0.2, "a fixed figure"))
    side_by_side = scaling.suite(work, cfg, None, ReplicaFigures(30.0, 0.2, "a fixed figure"), jobs=2)
    assert [r.policy for r in side_by_side] == [r.policy for r in alone]
    assert [(r.gpu_hours, r.minute_p99_hist, r.minute_p99_exact, r.hour_fine, r.replicas) for r in side_by_side] == \
        [(r.gpu_hours, r.minute_p99_hist, r.minute_p99_exact, r.hour_fine, r.replicas) for r in alone]
