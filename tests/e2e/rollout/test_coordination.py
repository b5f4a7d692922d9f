"""One control plane (issue 32, item 5), end to end in the sandbox: a ModelRollout and a
ReactiveScaling loop on the same deployment, both run by a real ``tideplane worker``, the rollout
started with the temporal CLI.

- ramp and tie: the stable is 1.9.0 and the canary 1.10.0, so at the 50 % step the two carry equal
  traffic and the canary's Deployment sorts first (chat-v1-10-0 < chat-v1-9-0). When the rollout
  reaches 50 %, demand triples. The loop grows the recorded stable (not the canary), the version is
  not rolled back (it is as good as the stable: an overload re-sizes it), promotion sizes the new
  version to the live total and the old version is scaled down only once the new one is Ready.

The bench's other two scenarios (a spot-mix deployment, a reclaim of the canary's node) are not
here yet; test_lost_capacity.py covers a lost canary pod.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kubernetes import client

from infra.sandbox.config import Demand
from infra.sandbox.knobs import set_demand
from tests.e2e.rollout.test_rollout import (
    GOOD_PROFILE,
    NAME,
    RPS,
    clean_up,
    follow,
    prepare,
    report,
    rollout_input,
    stable_ready,
    status,
    temporal_start,
)
from tests.sandbox_fixtures import TEST_TIME_SCALE, wait_until
from workflows.core.naming import TASK_QUEUE, rollout_workflow_id, scaling_workflow_id, versioned_name
from workflows.rollout.types import Outcome, Stage
from workflows.scaling.decide import ScalingPolicy
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput, ScalingStatus

NS_RAMP = "e2e-coord-ramp"
MODEL = "e2e-coord-llm"
OLD, NEW = "1.9.0", "1.10.0"  # chat-v1-10-0 sorts before chat-v1-9-0
MAX_TOTAL = 4  # the loop's cap: the tripled demand asks for more, the base demand for the stable's 2
POLICY = ScalingPolicy(
    min_replicas=2,  # the stable's size before the ramp: the base demand never moves the loop
    max_replicas=MAX_TOTAL,
    queue_per_replica=2,
    queue_capacity_per_replica=4,
    ttft_p99_slo_seconds=30,
    # half a sandbox replica's 4 req/s (in Prometheus' real seconds): each replica stays under half its
    # capacity, where latency is like for like (GOOD_PROFILE), and the loop holds the cap once promoted
    replica_capacity_rps=2 * TEST_TIME_SCALE,
    gpu_util_sustain_seconds=0,
    stabilisation_seconds=3,
    cooldown_seconds=5,
)


@dataclass
class Sample:
    """Both versions' Deployments and the rollout's stage and weight, read together."""

    stage: Stage | None
    weight: int | None
    old_spec: int
    new_spec: int
    new_ready: int


async def sample_fleet(apps: client.AppsV1Api, handle, samples: list[Sample]) -> None:
    """Sample until cancelled: what the tests assert about who scaled what, and when."""
    old_name, new_name = versioned_name(NAME, OLD), versioned_name(NAME, NEW)
    while True:
        now = await status(handle)
        old = await asyncio.to_thread(apps.read_namespaced_deployment, old_name, NS_RAMP)
        try:
            new = await asyncio.to_thread(apps.read_namespaced_deployment, new_name, NS_RAMP)
        except client.ApiException:
            new = None  # not created yet
        samples.append(Sample(
            now.stage if now else None, now.weight if now else None, old.spec.replicas or 0,
            (new.spec.replicas or 0) if new else 0, (new.status.ready_replicas or 0) if new else 0,
        ))
        await asyncio.sleep(0.3)


async def test_demand_tripling_at_a_50_50_tie_grows_the_stable_and_promotes_at_the_live_total(
    sandbox, kube, registry, worker, temporal, tmp_path, request,
):
    prepare(kube, registry, tmp_path, NS_RAMP, MODEL, {NEW: GOOD_PROFILE}, stable=OLD)
    deployment = f"{NS_RAMP}/{NAME}"
    apps = client.AppsV1Api(kube)
    inp = rollout_input(deployment, MODEL, NEW)
    inp["steps"] = [{"weight": 5, "window_seconds": 8}, {"weight": 50, "window_seconds": 20}]
    rollout = temporal.get_workflow_handle(rollout_workflow_id(deployment))
    samples: list[Sample] = []
    try:
        await asyncio.to_thread(wait_until, lambda: stable_ready(kube, NS_RAMP, OLD), 30, "the stable version to be Ready")
        loop = await temporal.start_workflow(
            ReactiveScaling.run, ScalingInput(deployment=deployment, policy=POLICY, interval_seconds=1, window="5s"),
            id=scaling_workflow_id(deployment), task_queue=TASK_QUEUE,
        )
        started = await asyncio.to_thread(temporal_start, sandbox.urls["temporal"], inp)
        assert started.returncode == 0, started.stderr
        sampler = asyncio.ensure_future(sample_fleet(apps, rollout, samples))
        try:
            at_half = lambda s: s.stage is Stage.CANARY and s.weight == 50  # noqa: E731
            await asyncio.wait_for(follow(temporal, deployment, apps, OLD, until=at_half), 90)
            set_demand(kube, deployment, Demand(rps=3 * RPS))
            seen = await asyncio.wait_for(follow(temporal, deployment, apps, OLD), 180)
            await asyncio.sleep(1)  # one more sample after the retirement
        finally:
            sampler.cancel()
        looped: ScalingStatus = await loop.query(ReactiveScaling.status)
        loop_running = (await loop.describe()).status.name == "RUNNING"
        await loop.terminate()
    finally:
        clean_up(kube, NS_RAMP)

    result = seen.result
    at_tie = [s for s in samples if s.stage is Stage.CANARY and s.weight == 50]
    report(request, f"ramp at a 50/50 tie: {result.outcome.value}: {result.reason}; "
                    f"at 50 % (old, new) replicas {sorted({(s.old_spec, s.new_spec) for s in at_tie})}; "
                    f"loop changes {[(d.current, d.desired) for d in looped.decisions if d.applied and d.desired != d.current]}")
    assert result.outcome is Outcome.PROMOTED, result.reason  # no false rollback: the version is as good as the stable
    assert loop_running  # the tie never stopped the loop (no stable read from a sort order, no refusal)
    # the tie: the loop grew the recorded stable while the route split 50/50
    assert at_tie and max(s.old_spec for s in at_tie) == MAX_TOTAL, [(s.old_spec, s.new_spec) for s in at_tie]
    assert any(d.applied and d.desired == MAX_TOTAL for d in looped.decisions)
    # promotion sized the new version to the live total, and it was Ready before the old one went
    promoted = [s for s in samples if s.stage is Stage.PROMOTED]
    assert promoted and promoted[0].new_spec == MAX_TOTAL and promoted[0].new_ready >= MAX_TOTAL
    assert seen.old_replicas_at_promotion == MAX_TOTAL
    retired = [s for s in samples if s.old_spec < MAX_TOTAL and s.stage is Stage.PROMOTED]
    assert retired and retired[-1].old_spec == 0  # no replicas leaked after promotion
    assert all(s.new_ready >= MAX_TOTAL for s in retired)
