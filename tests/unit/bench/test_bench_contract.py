"""The scaling bench's output contract (benchmarks.yardstick) on a tiny synthetic trace."""

from __future__ import annotations

import csv

import pytest

from benchmarks import yardstick
from benchmarks.baselines import StaticPolicy
from infra.fleetmodel.fleet import Aggregate, FleetConfig, simulate
from infra.fleetmodel.sizes import fixed

CFG = FleetConfig(cold_start_s=60.0)


def _run(counts: list[float], policy):
    return simulate(Aggregate(counts, CFG.step_s, fixed(500, 200), CFG.load()), policy, len(counts), CFG, [], "aggregate")


def _burst_hour() -> list[float]:
    """An hour at 2 req/s with a 10-minute surge to 120 req/s (one replica saturates at ~43 req/s)."""
    return [120.0 if 1200 <= t < 1800 else 2.0 for t in range(3600)]


def test_each_policy_family_and_split_has_its_row_with_request_weighted_slo(tmp_path):
    counts = _burst_hour()
    small, large = _run(counts, StaticPolicy("static-1", 1)), _run(counts, StaticPolicy("static-8", 8))
    rows = yardstick.contract_rows([("tiny", True, [0], [[small, large]]), ("tiny held", False, [3], [[small, large]])], warm_pool=set())
    assert [(r["policy"], r["family"], r["split"], r["seed"]) for r in rows] == [
        ("static-1", "static", "tuning", 0), ("static-8", "static", "tuning", 0),
        ("static-1", "static", "held-out", 3), ("static-8", "static", "held-out", 3),
    ]
    assert rows[1]["gpu_hours"] == pytest.approx(8 * rows[0]["gpu_hours"])
    # the surge's requests queue behind one replica: they are a sixth of the minutes but most of the requests
    assert rows[0]["request_slo_percent"] < rows[0]["slo_minutes_percent"] < 100.0
    assert rows[1]["request_slo_percent"] == pytest.approx(100.0)
    path = tmp_path / "results.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=yardstick.CONTRACT_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    yardstick.plot(rows, tmp_path / "results.png")
    assert (tmp_path / "results.png").stat().st_size > 0
    (cheapest,) = [s for s in yardstick.summary(rows) if s["trace"] == "tiny"]
    assert cheapest["cheapest_policy_at_slo"] == "static-8"


def test_every_bench_policy_name_has_a_contract_family():
    names = {"oracle": "ideal", "bound": "bound", "static-12": "static", "hpa-gpu-util-90": "hpa-gpu-util",
             "keda-waiting-1": "keda-waiting", "keda-in_flight-16": "keda-in_flight", "keda-rate-18.9-down600": "keda-rate", "tideplane-reactive": "tideplane", "tideplane": "tideplane"}
    assert {n: yardstick.contract_family(n) for n in names} == names
    with pytest.raises(ValueError, match="karpenter"):
        yardstick.contract_family("karpenter-spot")
