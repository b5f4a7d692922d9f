"""How long a queue a deployment may hold before its gateway answers 429 (pure).

A request that waits longer than the TTFT SLO allows is lost anyway: it gets its first token too
late, holds a connection and a retry budget, and hides the overload from the client. The replicas
drain ``replica_capacity_rps`` requests per second each (the SLO model's service rate, measured by
a load test, the batching sweep or the fleet model), so a request that finds ``n`` waiting ahead
of it starts after about ``n / (ready * capacity)`` seconds; keeping that within the SLO's budget
beyond an idle replica's TTFT bounds the queue. Beyond it the gateway fails fast with
``Retry-After``, and the scaling loop counts the refused requests as demand.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from workflows.scaling.decide import ScalingPolicy


class QueueLimit(BaseModel):
    """What the gateway is told: requests that may wait, and when a refused client should retry."""

    max_pending_requests: int = Field(ge=1)
    retry_after_seconds: int = Field(ge=1)


def queue_limit(ready: int, policy: ScalingPolicy) -> QueueLimit:
    """Waiting requests the ``ready`` replicas serve within the TTFT SLO (at least one per replica)."""
    budget_s = max(0.0, policy.ttft_p99_slo_seconds - policy.replica_ttft_seconds)
    serving = max(1, ready)
    return QueueLimit(
        max_pending_requests=max(serving, math.floor(serving * policy.replica_capacity_rps * budget_s)),
        retry_after_seconds=max(1, math.ceil(policy.ttft_p99_slo_seconds)),
    )
