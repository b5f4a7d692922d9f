"""Batching tuned at warm-up, and a full queue failing fast, end to end in the sandbox.

A first deploy with ``batching`` in its input measures two settings on its own replica and keeps
the one within the SLO in the Deployment's engine args. Then a deployment driven far beyond its
capacity: the scaling loop writes the gateway's queue limit (a BackendTrafficPolicy), requests
through the gateway get 429 with Retry-After at once, and the loop scales, counting them as demand.

Real parts only: the rollout starts with the ``temporal`` CLI and runs in a ``tideplane worker``
process; each setting is rolled out as container args of the Deployment (new pods), the fleet
simulator runs each pod's engine under its args, the sweep's completions go through the
version's Service, and vLLM's TTFT/TPOT histograms are read back from Prometheus.

With 24 completions in flight, 4 sequences per step queue most of them for several decode
lifetimes (TTFT p99 far over 2 s); 48 take them all in one batch (TTFT under a second, TPOT ~50 ms).
The better one is measured first, so keeping it changes the args back after the sweep.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest
from kubernetes import client

from infra.sandbox.config import Demand, Profile
from infra.sandbox.knobs import set_demand, set_profile
from infra.sandbox.worker_identity import enable_serving_namespace
from tests.e2e.rollout.test_rollout import IMAGE, NAME, clean_up, rollout_input, temporal_start
from tests.sandbox_fixtures import TEST_TIME_SCALE, create_logical_deployment, wait_until
from workflows.core.naming import (
    TASK_QUEUE,
    rollout_workflow_id,
    scaling_workflow_id,
    traffic_policy_name,
    versioned_name,
)
from workflows.core.batching_settings import BatchingSetting
from workflows.rollout.types import Outcome, RolloutResult
from workflows.scaling.decide import ScalingPolicy
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput
from workflows.rollout.client import rollout_result

MODEL = "e2e-batching-llm"
NAMESPACE = "e2e-batching"
VERSION = "1.0.0"
PROFILE = Profile(load_seconds=20, error_rate=0.0, ttft_seconds=0.15, tpot_seconds=0.05, output_tokens=64, capacity_rps=4)
WIDE = BatchingSetting(max_num_seqs=48, max_num_batched_tokens=2048)
NARROW = BatchingSetting(max_num_seqs=4, max_num_batched_tokens=2048)


def server_args(apps: client.AppsV1Api) -> list[str]:
    dep = apps.read_namespaced_deployment(versioned_name(NAME, VERSION), NAMESPACE)
    return next(c.args for c in dep.spec.template.spec.containers if c.name == "server")


@pytest.fixture
async def tuned(sandbox, kube, registry, worker, temporal, tmp_path_factory):
    model = f"{MODEL}-{uuid.uuid4().hex[:6]}"  # a rerun rolls out a model the registry has not seen
    weights = tmp_path_factory.mktemp("batching-weights") / "model.safetensors"
    weights.write_bytes(b"batching" * 4096)
    registry.register(model, VERSION, str(weights), image=IMAGE)
    set_profile(kube, model, VERSION, PROFILE)
    enable_serving_namespace(kube, NAMESPACE)
    inp = rollout_input(f"{NAMESPACE}/{NAME}", model, VERSION) | {
        "steps": [{"weight": 100, "window_seconds": 1}],
        "batching": {
            "ttft_slo_seconds": 2.0, "tpot_slo_seconds": 0.1, "requests": 48, "concurrency": 24,
            "prompt_tokens": 200, "output_tokens": 64,
            "candidates": [WIDE.model_dump(), NARROW.model_dump()], "deadline_seconds": 120,
        },
    }
    try:
        started = await asyncio.to_thread(temporal_start, sandbox.urls["temporal"], inp)
        assert started.returncode == 0, started.stderr
        handle = temporal.get_workflow_handle(rollout_workflow_id(inp["deployment"]), result_type=RolloutResult)
        result = await asyncio.wait_for(rollout_result(handle), timeout=90)
        yield result, server_args(client.AppsV1Api(kube)), registry.show(model, VERSION)
    finally:
        clean_up(kube, NAMESPACE)


def test_sweep_keeps_the_setting_within_the_slo_in_the_engine_args_and_the_registry(tuned):
    """One test over one sweep (a function fixture: a rerun repeats the sweep, not its result)."""
    result, args, manifest = tuned
    assert result.outcome == Outcome.PROMOTED, result.reason
    assert result.batching is not None and result.batching.setting == WIDE, result.batching
    assert result.batching.within_slo == [WIDE], result.batching
    assert args[-5:] == WIDE.engine_args()  # the last measured (NARROW) was rolled back to WIDE
    assert "--model" in args  # the rollout's own args are kept
    sweep = next(b.batching for b in manifest.benchmarks if b.batching is not None)
    wide, narrow = sweep.points
    assert (wide.setting, narrow.setting, sweep.chosen) == (WIDE, NARROW, WIDE)
    assert narrow.ttft_p99_seconds > 2.0 > wide.ttft_p99_seconds, sweep.points
    assert wide.tpot_p99_seconds <= 0.1 and wide.errors == 0
    assert sweep.reason == result.batching.reason


# ---- queue full: fail fast -----------------------------------------------------------------------

QUEUE_NS = "e2e-queue-full"
QUEUE_MODEL = "e2e-queue-llm"
QUEUE_POLICY = ScalingPolicy(
    min_replicas=1, max_replicas=3, gateway_queue_limit=True, ttft_p99_slo_seconds=2.0, replica_ttft_seconds=0.2,
    replica_capacity_rps=4 * TEST_TIME_SCALE,  # a replica's 4 req/s of sandbox time, as rate() counts it (real seconds)
    stabilisation_seconds=600, cooldown_seconds=600,
)


def probe(url: str) -> tuple[int, float, str | None]:
    started = time.monotonic()
    resp = httpx.post(url, json={"prompt": "hello " * 50, "max_tokens": 16}, timeout=30)
    return resp.status_code, time.monotonic() - started, resp.headers.get("Retry-After")


async def test_burst_beyond_capacity_gets_fast_429s_while_the_loop_scales(sandbox, kube, worker, temporal):  # noqa: F811
    set_profile(kube, QUEUE_MODEL, None, Profile(load_seconds=20, error_rate=0.0, capacity_rps=4))
    create_logical_deployment(kube, QUEUE_NS, NAME, "1.0.0", QUEUE_MODEL, 1)
    apps, custom = client.AppsV1Api(kube), client.CustomObjectsApi(kube)
    deployment = versioned_name(NAME, "1.0.0")
    url = f"{sandbox.urls['fleet']}/gateway/{QUEUE_NS}/{NAME}/v1/completions"  # through the HTTPRoute, as clients call
    handle = None
    try:
        wait_until(lambda: (apps.read_namespaced_deployment(deployment, QUEUE_NS).status.ready_replicas or 0) >= 1, 30, "the replica")
        handle = await temporal.start_workflow(
            ReactiveScaling.run, ScalingInput(deployment=f"{QUEUE_NS}/{NAME}", policy=QUEUE_POLICY, interval_seconds=1, window="5s"),
            id=scaling_workflow_id(f"{QUEUE_NS}/{NAME}"), task_queue=TASK_QUEUE,
        )
        policy_of = lambda: custom.get_namespaced_custom_object(  # noqa: E731
            "gateway.envoyproxy.io", "v1alpha1", QUEUE_NS, "backendtrafficpolicies", traffic_policy_name(NAME))
        wait_until(lambda: _exists(policy_of), 20, "the loop to write the queue limit")
        assert policy_of()["spec"]["circuitBreaker"]["maxPendingRequests"] == 144  # 1 replica x 80 req/s x 1.8 s
        # an idle replica answers, once the gateway's view of the route and its Ready pod has caught up
        wait_until(lambda: probe(url)[0] == 200, 15, "the gateway to answer through the route")

        set_demand(kube, f"{QUEUE_NS}/{NAME}", Demand(rps=20))  # 5x one replica's capacity
        answers: list[tuple[int, float, str | None]] = []
        deadline = time.monotonic() + 25
        rejected_seen = False
        while time.monotonic() < deadline and not (rejected_seen and len(answers) >= 30):
            answers += await asyncio.gather(*(asyncio.to_thread(probe, url) for _ in range(4)))
            status = await handle.query(ReactiveScaling.status)
            rejected_seen = any((d.signals.rejected_rate or 0) > 0 for d in status.decisions)
            await asyncio.sleep(0.2)
        refused = [a for a in answers if a[0] == 429]
        assert len(refused) >= 20, answers
        assert all(retry == "2" for _, _, retry in refused)
        # at once: admitted, each would have waited behind >= 144 others at 80 req/s, i.e. past the SLO's
        # 1.8 s budget; refused, it comes back well inside it (on 2 busy cores, through the simulator's HTTP server)
        latencies = sorted(latency for _, latency, _ in refused)
        assert latencies[len(latencies) // 2] < 0.5 and latencies[-1] < 1.8, latencies
        assert rejected_seen, [d.reason for d in status.decisions[-5:]]
        scaled = apps.read_namespaced_deployment(deployment, QUEUE_NS).spec.replicas
        assert scaled > 1, [d.reason for d in status.decisions[-5:]]
        wait_until(lambda: policy_of()["spec"]["circuitBreaker"]["maxPendingRequests"] > 144, 20, "the limit to follow the new replicas")
    finally:
        if handle is not None:
            await handle.terminate()
        clean_up(kube, QUEUE_NS)


def _exists(read) -> bool:
    try:
        read()
        return True
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
