"""Quantiles as Prometheus computes them over vLLM's buckets, and DCGM utilisation under vLLM."""

from __future__ import annotations

import math

import pytest

from infra.fleetmodel.engine import load_engine
from infra.fleetmodel.metrics import TTFT_BUCKETS, Histogram, bucket_counts, dcgm_gpu_util, exact_quantile, histogram_quantile
from infra.fleetmodel.replica import Replica, Request


def test_histogram_quantile_interpolates_inside_the_bucket_like_prometheus():
    # 100 requests at 1.1 s: all in vLLM's (1.0, 2.5] bucket; Prometheus answers 1 + 1.5 * 0.99
    counts = bucket_counts(TTFT_BUCKETS, [(1.1, 100)])
    assert histogram_quantile(0.99, TTFT_BUCKETS, counts) == pytest.approx(2.485)
    assert exact_quantile([(1.1, 100)], 0.99) == 1.1  # within a 2 s SLO; the histogram says it is not


def test_histogram_quantile_edges():
    assert math.isnan(histogram_quantile(0.99, TTFT_BUCKETS, [0.0] * (len(TTFT_BUCKETS) + 1)))
    beyond = bucket_counts(TTFT_BUCKETS, [(5000.0, 10)])
    assert histogram_quantile(0.99, TTFT_BUCKETS, beyond) == TTFT_BUCKETS[-1]  # +Inf bucket: highest finite bound
    first = bucket_counts(TTFT_BUCKETS, [(0.0005, 4)])
    assert histogram_quantile(0.5, TTFT_BUCKETS, first) == pytest.approx(0.0005)  # first bucket starts at 0
    mixed = bucket_counts(TTFT_BUCKETS, [(0.3, 98), (3.0, 2)])
    assert histogram_quantile(0.99, TTFT_BUCKETS, mixed) == pytest.approx(2.5 + 2.5 * 0.5)


def test_histogram_exposes_cumulative_buckets():
    hist = Histogram((0.1, 1.0))
    hist.observe(0.05, 3)
    hist.observe(0.5)
    hist.observe(5)
    assert hist.cumulative() == [("0.1", 3), ("1.0", 4), ("+Inf", 5)]
    assert hist.count == 5 and hist.sum == pytest.approx(5.65)


def test_dcgm_reads_near_full_while_any_request_runs():
    engine = load_engine()
    replica = Replica(engine)
    replica.advance_to(60.0, [Request(0.0, 200, 500)])  # one small request: the GPU is far from full
    (done,) = replica.finished
    busy = replica.busy_s / done.finished_s
    assert busy == pytest.approx(1.0)
    assert dcgm_gpu_util(busy, engine.busy_duty) >= 95.0
    assert dcgm_gpu_util(replica.busy_s / 60.0, engine.busy_duty) < 20.0  # idle for the rest of the minute
