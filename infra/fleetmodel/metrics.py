"""Metrics as the real exporters expose them, and quantiles as Prometheus computes them.

vLLM's histogram bucket boundaries (vllm/v1/metrics/loggers.py) so that ``histogram_quantile``
over them behaves as on a real fleet: the 1.0-2.5 s TTFT bucket straddles a 2 s SLO, and
Prometheus interpolates linearly inside it. DCGM's GPU utilisation is a duty cycle (time with
any kernel running), not a share of the GPU's capacity.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

import numpy as np

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# name -> (buckets, HELP text); the latency families vLLM 0.32 exports (names, buckets and HELP as
# vllm/v1/metrics/loggers.py and buckets.py declare them).
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": (TTFT_BUCKETS, "Histogram of time to first token in seconds."),
    "vllm:inter_token_latency_seconds": (ITL_BUCKETS, "Histogram of inter-token latency in seconds."),
    "vllm:request_time_per_output_token_seconds": (ITL_BUCKETS, "Histogram of time_per_output_token_seconds per request."),
    "vllm:e2e_request_latency_seconds": (REQUEST_BUCKETS, "Histogram of e2e request latency in seconds."),
    "vllm:request_queue_time_seconds": (REQUEST_BUCKETS, "Histogram of time spent in WAITING phase for request."),
    "vllm:request_prefill_time_seconds": (REQUEST_BUCKETS, "Histogram of time spent in PREFILL phase for request."),
    "vllm:request_decode_time_seconds": (REQUEST_BUCKETS, "Histogram of time spent in DECODE phase for request."),
}


class Histogram:
    """A Prometheus histogram; weights may be fractional (the aggregate mode observes expected counts)."""

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(bounds)
        self.counts = [0.0] * (len(self.bounds) + 1)  # last slot: +Inf
        self.sum = 0.0
        self.count = 0.0

    def observe(self, value: float, n: float = 1) -> None:
        if n <= 0:
            return
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[tuple[str, float]]:
        """(le label, cumulative count), as the text exposition writes them."""
        out, running = [], 0.0
        for bound, count in zip((*self.bounds, math.inf), self.counts):
            running += count
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), running))
        return out

    def snapshot(self) -> list[float]:
        return list(self.counts)


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Prometheus' ``histogram_quantile`` over per-bucket counts (not cumulative; last = +Inf bucket).

    Linear interpolation inside the bucket holding the rank; the first bucket starts at 0; a rank
    in the +Inf bucket answers the highest finite bound. NaN when there are no observations.
    """
    total = sum(counts)
    if total <= 0:
        return math.nan
    rank = q * total
    below = 0.0
    for i, count in enumerate(counts):
        if below + count >= rank and count > 0:
            if i == len(bounds):
                return bounds[-1]
            start = 0.0 if i == 0 else bounds[i - 1]
            return start + (bounds[i] - start) * (rank - below) / count
        below += count
    return bounds[-1]


def exact_quantile(values: Iterable[tuple[float, float]], q: float) -> float:
    """Nearest-rank quantile of (value, weight) pairs; NaN when the weights sum to zero."""
    pairs = list(values)
    return exact_quantile_of(np.array([v for v, _ in pairs], dtype=float), np.array([w for _, w in pairs], dtype=float), q)


def exact_quantile_of(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """``exact_quantile`` of parallel arrays: sorted by (value, weight), the first value whose running
    weight reaches ``q`` of the total (sums in that order, as a Python loop would add them)."""
    order = np.lexsort((weights, values))
    values, weights = values[order], weights[order]
    running = np.cumsum(weights)
    if not len(running) or running[-1] <= 0:
        return math.nan
    reached = np.flatnonzero((running >= q * running[-1] - 1e-9) & (weights > 0))
    return float(values[reached[0]] if len(reached) else values[-1])


def bucket_counts(bounds: Sequence[float], values: Iterable[tuple[float, float]]) -> list[float]:
    """Per-bucket counts of (value, weight) pairs, as a histogram of ``bounds`` would count them."""
    pairs = list(values)
    return bucket_counts_of(bounds, np.array([v for v, _ in pairs], dtype=float), np.array([w for _, w in pairs], dtype=float))


def bucket_counts_of(bounds: Sequence[float], values: np.ndarray, weights: np.ndarray) -> list[float]:
    """``bucket_counts`` of parallel arrays (a value on a bound counts in that bound's bucket, as ``le`` says)."""
    where = np.searchsorted(np.asarray(bounds, dtype=float), values, side="left")
    return np.bincount(where, weights=weights, minlength=len(bounds) + 1).tolist()


def dcgm_gpu_util(busy_fraction: float, duty: float) -> float:
    """``DCGM_FI_DEV_GPU_UTIL`` of a vLLM GPU: percent of the sample period with a kernel running.

    A replica with any request in its batch runs steps back to back, so this sits near
    ``100 * duty`` whatever the batch size: it says "busy", not "how full".
    """
    return round(100.0 * max(0.0, min(1.0, busy_fraction)) * duty, 1)
