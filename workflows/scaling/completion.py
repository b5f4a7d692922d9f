"""A batch class's SLO: completion time (end to end), not time to first token (pure).

A batch request waits behind the backlog; what its caller feels is when it completes. The backlog
of ``waiting`` requests, plus ``rate`` new ones per second, drains on ``replicas`` serving
``capacity`` requests/s each in ``waiting / (replicas * capacity - rate)`` seconds; the replicas that
drain it within the SLO are ``ceil((waiting / slo + rate) / capacity)``. The measured p95 end-to-end
latency (vLLM's ``vllm:e2e_request_latency_seconds``) is the other side of the same SLO.
"""

from __future__ import annotations

import math


def drain_seconds(waiting: float, rate: float, replicas: int, capacity_rps: float) -> float:
    """Seconds until the backlog is served (infinite when the replicas cannot keep up with arrivals)."""
    if waiting <= 0:
        return 0.0
    spare = replicas * capacity_rps - rate
    return waiting / spare if spare > 0 else math.inf


def drain_replicas(waiting: float, rate: float, slo_seconds: float, capacity_rps: float) -> int:
    """Fewest replicas that serve the arrivals and drain the backlog within ``slo_seconds``."""
    return math.ceil((max(0.0, waiting) / slo_seconds + max(0.0, rate)) / capacity_rps)
