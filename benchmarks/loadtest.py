"""A replica's capacity as an operator measures it before scoring: a load test of the engine model.

One replica of the fleet model (``infra.fleetmodel``, aggregate mode) takes a constant arrival rate
of requests drawn from a fixed size mix (the tuning data's, pooled); the rate rises until the p99
TTFT breaks the SLO, and the highest rate within it is the replica's capacity. The scored trace
never enters it, and every policy that sizes on a per-replica rate gets the same figure (issue 34:
capacity taken from the scored trace, future hours included, was a leak only tideplane got).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from benchmarks.baselines import StaticPolicy
from infra.fleetmodel.fleet import Aggregate, FleetConfig, simulate
from infra.fleetmodel.sizes import SizeMix, TokenDist

LOAD_TEST_S = 600  # seconds at each rate: ten scored minutes, long enough for the batch to settle
BISECTIONS = 12  # after the doubling brackets the break: the rate to ~0.02 % of the bracket


@dataclass(frozen=True)
class ReplicaFigures:
    """What the policies are told about one replica, fixed before any trace is scored."""

    capacity_rps: float  # ``load_test_capacity``
    unloaded_ttft_s: float  # the largest prompts' TTFT on an idle replica
    sizes_from: str  # the data the size mix came from


def pooled_sizes(sizes: SizeMix, start_s: float, end_s: float) -> SizeMix:
    """One window holding the mix of ``[start_s, end_s)``, each of its windows weighted alike."""
    first, last = sizes.index(start_s), sizes.index(max(start_s, end_s - 1))
    windows = range(first, last + 1)

    def pool(dists: tuple[TokenDist, ...]) -> TokenDist:
        weights: dict[int, float] = {}
        for i in windows:
            for tokens, p in dists[i].points:
                weights[tokens] = weights.get(tokens, 0.0) + p / len(windows)
        return TokenDist.of(weights)

    return replace(sizes, window_s=float("inf"), prompt=(pool(sizes.prompt),), output=(pool(sizes.output),), offset_s=0.0)


def within_slo(cfg: FleetConfig, sizes: SizeMix, rate_rps: float) -> bool:
    """Whether one replica at ``rate_rps`` keeps the run's p99 TTFT within the SLO."""
    counts = [rate_rps] * LOAD_TEST_S
    backend = Aggregate(counts, cfg.step_s, sizes, cfg.load())
    result = simulate(backend, StaticPolicy("load-test", 1), LOAD_TEST_S, replace(cfg, cold_start_s=0.0), [], "aggregate")
    return result.ttft_p99_exact <= cfg.ttft_slo_s


def load_test_capacity(cfg: FleetConfig, sizes: SizeMix) -> float:
    """The highest constant rate (req/s) one replica serves within the TTFT SLO: doubling, then bisection."""
    low, high = 0.0, 1.0
    while within_slo(cfg, sizes, high):
        low, high = high, 2 * high
    for _ in range(BISECTIONS):
        mid = (low + high) / 2
        low, high = (mid, high) if within_slo(cfg, sizes, mid) else (low, mid)
    if low == 0.0:
        raise ValueError(f"one replica breaks the {cfg.ttft_slo_s:g} s TTFT SLO at any load on this size mix")
    return low
