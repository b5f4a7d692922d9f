"""The coordination bench (issue 32): its queueing model, its output contract, and the scenarios'
outcomes that the product's rules decide."""

from __future__ import annotations

import csv
import math

import pytest

from benchmarks import coordination as c


def test_erlang_c_is_the_textbook_value_and_stays_finite_for_thousands_of_servers():
    assert c.erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert c.erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: the utilisation
    assert 0 <= c.erlang_c(4000, 3900.0) <= 1


def test_ttft_grows_with_load_and_a_saturated_or_empty_version_misses():
    light, heavy = c.ttft_p99(0.3 * 10 * c.PER_REPLICA_RPS, 10), c.ttft_p99(0.97 * 10 * c.PER_REPLICA_RPS, 10)
    assert light == c.PREFILL_S < heavy < math.inf
    assert c.ttft_p99(10 * c.PER_REPLICA_RPS, 10) == math.inf and c.ttft_p99(1.0, 0) == math.inf


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("coordination")
    rows = c.run_all(out)
    with (out / "coordination.csv").open() as f:
        return rows, list(csv.DictReader(f))


def test_the_csv_has_one_row_per_scenario_and_policy_with_the_issues_columns(rows):
    _, written = rows
    assert list(written[0]) == c.COLUMNS
    assert [(r["scenario"], r["policy"]) for r in written] == [(s, p) for s in c.SCENARIOS for p in c.POLICIES]


@pytest.mark.parametrize("scenario", c.SCENARIOS)
def test_tideplane_promotes_the_good_version_without_a_false_rollback_or_a_leak(rows, scenario):
    row = next(r for r in rows[0] if r["scenario"] == scenario and r["policy"] == "tideplane")
    assert (row["false_rollbacks"], row["leaked_replicas"], row["outcome"]) == (0, 0, "promoted"), row


def test_an_uncoordinated_canary_that_loses_its_node_is_rolled_back_although_the_version_is_good(rows):
    """Its gates count the pods' own requests: the few live pods are overloaded, the gateway's 503s go unseen."""
    row = next(r for r in rows[0] if r["scenario"] == "reclaim" and r["policy"] == "uncoordinated")
    assert row["false_rollbacks"] == 1 and row["slo_miss_minutes"] > 0


def test_an_uncoordinated_rollout_of_a_spot_mix_sizes_its_canary_from_zero():
    """spec.replicas is 0 under a mix: one canary replica cannot carry 5 %, so the good version is rolled back."""
    row = c.simulate("spot-mix", "uncoordinated")
    assert row["outcome"] == "rolled back" and row["false_rollbacks"] == 1
