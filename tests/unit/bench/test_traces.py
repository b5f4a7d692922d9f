"""The trace loaders read each public trace's own format (small slices, read in place)."""

from __future__ import annotations

import json

import pytest

from benchmarks import traces
from tests.public_traces import need

M_MID_GAP = range(522, 533)  # windows where every m-mid client reports zero (a gap in the release)


@pytest.fixture(scope="module")
def m_mid():
    need(traces.SERVEGEN)
    return traces.load_servegen("m-mid", clients=12)


def test_servegen_sums_client_rates_per_window():
    need(traces.SERVEGEN)
    one = traces.load_servegen("m-large", clients=1)
    two = traces.load_servegen("m-large", clients=2)
    assert one.window_s == 600 and len(one.windows) == 2016  # 14 days of 10-minute windows
    assert [w.start_s for w in one.windows[:3]] == [0, 600, 1200]
    # chunk-0 (first by name) reports 1.3316666666666668 req/s with cv 8.598 in its first window
    assert one.windows[0].rate == pytest.approx(1.3316666666666668)
    assert one.windows[0].dispersion == pytest.approx(8.598383725990791**2)
    both = [w.rate for w in two.windows[:50] if w.rate is not None]
    assert all(b >= a for a, b in zip([w.rate for w in one.windows[:50] if w.rate is not None], both))


def test_servegen_m_mid_gap_windows_are_missing_not_zero(m_mid):
    rates = [w.rate for w in m_mid.windows]
    assert all(rates[i] is None for i in M_MID_GAP)
    assert rates[521] is not None and rates[521] > 0
    assert all(r is None or r > 0 for r in rates)  # a zero is never reported as demand


def test_servegen_partial_gap_edges_are_missing_too():
    """Windows at a gap's edge where only a few small clients report read as missing, not a trough."""
    need(traces.SERVEGEN)
    full = traces.load_servegen("m-mid")
    known = sorted(w.rate for w in full.windows if w.rate is not None)
    assert full.windows[533].rate is None  # 14 req/s against a median of ~1950: the gap's ragged edge
    assert known[0] > 0.2 * known[len(known) // 2]  # real troughs stay well above the cut-off


def test_arrivals_keep_each_window_total_and_carry_gaps_forward(m_mid):
    steps = m_mid.arrivals(15, seed=3)
    assert len(steps) == 2016 * 40
    assert steps == m_mid.arrivals(15, seed=3)
    assert steps != m_mid.arrivals(15, seed=4)
    for i in (0, 100, 521):
        assert sum(steps[i * 40 : (i + 1) * 40]) == pytest.approx(m_mid.windows[i].rate * 600)
    # a missing window carries the last known window's demand forward
    assert sum(steps[522 * 40 : 523 * 40]) == pytest.approx(m_mid.windows[521].rate * 600)


def test_azure_requests_and_counts():
    need(traces.AZURE_CODE)
    requests = traces.load_azure()
    assert len(requests) == 8819
    assert requests[0].t_s == 0 and requests[0].prompt_tokens == 4808 and requests[0].output_tokens == 10
    assert 57 * 60 < requests[-1].t_s < 58 * 60
    per_second = traces.bin_requests(requests, 1.0)
    assert sum(per_second) == 8819
    assert max(per_second) == 67  # the trace's busiest second
    assert sum(traces.bin_requests(requests, 60.0)) == 8819


def test_skynomad_one_means_preempted():
    need(traces.SKYNOMAD)
    trace = traces.load_availability()
    assert trace.name == "skynomad-h100" and len(trace.zones) == 13
    by_name = {z.zone: z for z in trace.zones}
    raw = json.loads((traces.SKYNOMAD / "zones" / "us-west1-b_h100_16.json").read_text())
    z = by_name["us-west1-b"]
    assert z.step_s == 600 and z.gpus == 8
    assert (z.region, z.instance_type, z.domain) == ("us-west1", "a3-highgpu-8g", "a3-highgpu-8g/us-west1-b")
    assert z.spot_price == raw["metadata"]["price_info"]["price"]
    assert z.on_demand_price == raw["metadata"]["price_info"]["on_demand_price"]
    assert len(z.available) == len(raw["data"])
    assert [not a for a in z.available] == [v == 1 for v in raw["data"]]
    assert sum(not a for a in z.available) == sum(raw["data"]) > 0


def test_launch_counts_are_matched_to_samples_by_time():
    need(traces.SKYNOMAD)
    trace = traces.load_availability()
    z = {z.zone: z for z in trace.zones}
    # first CSV row, 2025-10-03T17:10-07:00 = the zones' start_time 00:10Z: us-west1-b got 13 of 16, us-east5-a 0
    assert z["us-west1-b"].requested == 16 and z["us-west1-b"].launched[:4] == [13, 15, 15, 16]
    assert z["us-east5-a"].launched[0] == 0
    assert len(z["us-west1-b"].launched) == len(z["us-west1-b"].available)
    preempted = next(i for i, a in enumerate(z["us-west1-b"].available) if not a)
    assert z["us-west1-b"].capacity(preempted) == 0 and z["us-west1-b"].capacity(0) == 13


def test_any_step_and_instance_type(tmp_path):
    """A folder in the documented format with another step, instance type and cloud."""
    for zone, data in (("us-east-1a", [0, 1, 0]), ("us-east-1b", [0, 0, 0])):
        doc = {"metadata": {"zone": zone, "gap_seconds": 300, "instance_type": "p5.48xlarge",
                            "price_info": {"price": 30.0, "on_demand_price": 98.32}}, "data": data}
        (tmp_path / f"{zone}.json").write_text(json.dumps(doc))
    trace = traces.load_availability(tmp_path)
    assert trace.name == tmp_path.name and trace.step_s == 300 and trace.steps == 3
    a = trace.zones[0]
    assert (a.region, a.domain, a.gpus, a.launched, a.capacity(0), a.capacity(1)) == (
        "us-east-1", "p5.48xlarge/us-east-1a", 1, None, None, 0)


def test_an_absent_trace_names_its_path_and_how_to_get_it(capsys):
    """A clone without ../shared/traces: the loaders and `tideplane bench` say which trace and where it comes from."""
    from benchmarks.cli import main  # what `tideplane bench` runs

    absent = traces.TRACES_DIR / "skynomad-h100" / "no-such-zone"
    with pytest.raises(traces.TraceMissing) as raised:
        traces.load_availability(absent)
    message = str(raised.value)
    assert str(absent) in message and "TIDEPLANE_TRACES_DIR" in message and "github.com/andylizf/skynomad-artifact" in message
    assert main(["spot", "--no-sweep", "--trace", str(absent)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tideplane bench: public trace ") and str(absent) in err
