"""The gateway's queue limit from the SLO model, and refused requests counted as demand."""

from __future__ import annotations

from workflows.scaling.decide import ScalerState, ScalingPolicy, Signals, decide
from workflows.scaling.queue_limit import QueueLimit, queue_limit

POLICY = ScalingPolicy(max_replicas=20, replica_capacity_rps=4, ttft_p99_slo_seconds=2.0, replica_ttft_seconds=0.2)


def test_limit_is_what_the_ready_replicas_drain_within_the_slo():
    assert queue_limit(3, POLICY) == QueueLimit(max_pending_requests=21, retry_after_seconds=2)  # 3 x 4 req/s x 1.8 s
    assert queue_limit(0, POLICY).max_pending_requests == 7  # none ready yet: one replica's worth, never 0
    tight = POLICY.model_copy(update={"replica_ttft_seconds": 2.5})  # an idle replica already misses the SLO
    assert queue_limit(2, tight).max_pending_requests == 2


def test_refused_requests_count_as_demand():
    quiet = Signals(queue_waiting=0, running=4, request_rate=4, kv_cache_usage=0.5, ttft_p99_seconds=1.0)
    assert decide(0, 2, quiet, POLICY, ScalerState()).desired == 2
    refused = quiet.model_copy(update={"rejected_rate": 40.0})
    decision = decide(0, 2, refused, POLICY, ScalerState())
    assert decision.desired >= 12  # 44 req/s at 4 req/s per replica, with SLO headroom
    assert Signals(rejected_rate=3.0).blind is False
