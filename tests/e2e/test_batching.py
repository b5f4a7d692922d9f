"""Batching tuned at warm-up, end to end in the sandbox: a first deploy with ``batching`` in its
input measures two settings on its own replica and keeps the one within the SLO in the
Deployment's engine args.

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

import pytest
from kubernetes import client

from infra.sandbox.config import Profile
from infra.sandbox.knobs import set_profile
from infra.sandbox.worker_identity import enable_serving_namespace
from tests.e2e.test_rollout import IMAGE, NAME, clean_up, registry, rollout_input, temporal_start, worker  # noqa: F401
from workflows.naming import rollout_workflow_id, versioned_name
from workflows.rollout.batching import BatchingSetting
from workflows.rollout.types import Outcome, RolloutResult

MODEL = "e2e-batching-llm"
NAMESPACE = "e2e-batching"
VERSION = "1.0.0"
PROFILE = Profile(load_seconds=20, error_rate=0.0, ttft_seconds=0.15, tpot_seconds=0.05, output_tokens=64, capacity_rps=4)
WIDE = BatchingSetting(max_num_seqs=48, max_num_batched_tokens=2048)
NARROW = BatchingSetting(max_num_seqs=4, max_num_batched_tokens=2048)


def server_args(apps: client.AppsV1Api) -> list[str]:
    dep = apps.read_namespaced_deployment(versioned_name(NAME, VERSION), NAMESPACE)
    return next(c.args for c in dep.spec.template.spec.containers if c.name == "server")


@pytest.fixture(scope="module")
async def tuned(sandbox, kube, registry, worker, temporal, tmp_path_factory):  # noqa: F811
    weights = tmp_path_factory.mktemp("batching-weights") / "model.safetensors"
    weights.write_bytes(b"batching" * 4096)
    registry.register(MODEL, VERSION, str(weights), image=IMAGE)
    set_profile(kube, MODEL, VERSION, PROFILE)
    enable_serving_namespace(kube, NAMESPACE)
    inp = rollout_input(f"{NAMESPACE}/{NAME}", MODEL, VERSION) | {
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
        result = await asyncio.wait_for(handle.result(), timeout=90)
        yield result, server_args(client.AppsV1Api(kube)), registry.show(MODEL, VERSION)
    finally:
        clean_up(kube, NAMESPACE)


def test_sweep_keeps_the_setting_within_the_slo_in_the_engine_args(tuned):
    result, args, _ = tuned
    assert result.outcome == Outcome.PROMOTED, result.reason
    assert result.batching is not None and result.batching.setting == WIDE, result.batching
    assert result.batching.within_slo == [WIDE]
    assert args[-5:] == WIDE.engine_args()  # the last measured (NARROW) was rolled back to WIDE
    assert "--model" in args  # the rollout's own args are kept


def test_sweep_is_recorded_in_the_registry(tuned):
    result, _, manifest = tuned
    sweep = next(b.batching for b in manifest.benchmarks if b.batching is not None)
    wide, narrow = sweep.points
    assert (wide.setting, narrow.setting, sweep.chosen) == (WIDE, NARROW, WIDE)
    assert narrow.ttft_p99_seconds > 2.0 > wide.ttft_p99_seconds, sweep.points
    assert wide.tpot_p99_seconds <= 0.1 and wide.errors == 0
    assert sweep.reason == result.batching.reason
