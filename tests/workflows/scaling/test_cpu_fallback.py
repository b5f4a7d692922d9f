"""CPU fallback for the batch class: the pure rule, then the loop on Temporal's time-skipping server.

The stubs play a batch GPU deployment whose Ready replicas the test controls (spot capacity gone,
then back) and a CPU deployment whose replicas follow what the loop sets. The loop's metrics
(decisions, replicas, scale-ups and their cold starts, recorded on the workflow metric meter) are
read from the worker's Prometheus endpoint.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from infra.sandbox.ports import free_port
from tests.workflows.core.test_telemetry import ours, samples
from workers.telemetry import metrics_runtime
from workflows.core import naming
from workflows.rollout.contract import SCALE_VERSION, ScaleVersionInput
from workflows.scaling import contract as acts
from workflows.scaling.cpu_fallback import CpuFallback, CpuFallbackState, decide_fallback
from workflows.scaling.decide import ScalingPolicy, Signals
from workflows.scaling.loop_state import PolicyPatch, ScalingInput, ScalingStatus
from workflows.scaling.loop import ReactiveScaling
from workflows.core.telemetry import (
    COLD_START_SECONDS,
    REPLICAS_DESIRED,
    REPLICAS_READY,
    SCALE_UP_ATTEMPTS,
    SCALE_UP_SUCCESSES,
    SCALING_DECISIONS,
)

FALLBACK = CpuFallback(deployment="batch-jobs/summarise-cpu", version="1.0.0", replicas=3, after_seconds=300, stabilisation_seconds=120)


def run(steps: list[tuple[float, int, int]], fallback: CpuFallback = FALLBACK) -> list[int]:
    state, out = CpuFallbackState(), []
    for now, desired, ready in steps:
        d = decide_fallback(now, desired, ready, desired - ready, fallback, state)
        state = d.state
        out.append(d.replicas)
    return out


def test_falls_back_only_after_the_deadline():
    assert run([(0, 4, 4), (10, 4, 1), (200, 4, 1), (309, 4, 2), (310, 4, 2)]) == [0, 0, 0, 0, 3]


def test_a_short_blip_resets_the_deadline():
    assert run([(0, 4, 1), (250, 4, 4), (260, 4, 1), (500, 4, 1), (560, 4, 1)]) == [0, 0, 0, 0, 3]


def test_goes_back_down_only_after_gpu_capacity_stayed_back():
    steps = [(0, 4, 0), (300, 4, 0), (400, 4, 4), (450, 4, 1), (460, 4, 4), (579, 4, 4), (580, 4, 4)]
    assert run(steps) == [0, 3, 3, 3, 3, 3, 0]  # the blip at 450 restarted the 120 s window
    d = decide_fallback(580, 4, 4, 0, FALLBACK, CpuFallbackState(active=True, back_since_s=460))
    assert d.replicas == 0 and "fallback down to 0" in d.reason and not d.state.active


def test_scaled_to_zero_is_not_a_shortage():
    assert run([(0, 0, 0), (1000, 0, 0)]) == [0, 0]
    d = decide_fallback(0, 2, 0, 2, FALLBACK, CpuFallbackState())
    assert "0/2 GPU replica(s) Ready, 2 Unschedulable" in d.reason


class BatchFleet:
    """A batch GPU deployment that holds its replicas but whose Ready count the test sets."""

    def __init__(self) -> None:
        self.replicas, self.ready = 4, 4
        self.signals = Signals(queue_waiting=0, gpu_util_percent=80)  # at target: the GPU loop holds
        self.cpu_calls: list[int] = []

    def activities(self):
        @activity.defn(name=acts.GET_SCALE)
        async def get_scale(target: acts.ScaleTarget) -> acts.ScaleStatus:
            return acts.ScaleStatus(
                version="2.0.0", replicas=self.replicas, ready_replicas=self.ready,
                pending=self.replicas - self.ready, unschedulable=self.replicas - self.ready, priority_class="batch",
            )

        @activity.defn(name=acts.READ_SCALING_SIGNALS)
        async def read_signals(request: acts.ReadSignalsInput) -> Signals:
            return self.signals

        @activity.defn(name=SCALE_VERSION)
        async def scale_version(request: ScaleVersionInput) -> None:
            if (request.deployment.namespace, request.deployment.name, request.version) == ("batch-jobs", "summarise-cpu", "1.0.0"):
                self.cpu_calls.append(request.replicas)
            else:
                self.replicas = request.replicas

        return [get_scale, read_signals, scale_version]


async def metered_client(env) -> tuple[Client, int]:
    """A client on ``env`` whose workers export their metrics on the returned port."""
    port = free_port()
    client = await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        data_converter=pydantic_data_converter,
        runtime=metrics_runtime(port, host="127.0.0.1"),
    )
    return client, port


def decisions_counted(port: int, name: str) -> dict[tuple[str, str], float]:
    """(direction, reason) -> count of this deployment's decisions on the worker's /metrics."""
    return {
        (dict(labels)["direction"], dict(labels)["reason"]): value
        for labels, value in ours(samples(port), SCALING_DECISIONS.name, name).items()
    }


async def test_loop_scales_the_cpu_fallback_up_and_back_down(time_skipping_env):
    env = time_skipping_env
    client, port = await metered_client(env)
    fleet = BatchFleet()
    deployment = f"batch-jobs/s{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4()}"
    policy = ScalingPolicy(priority_class="batch", min_replicas=0, max_replicas=4, cpu_fallback=FALLBACK)
    async with Worker(client, task_queue=queue, workflows=[ReactiveScaling], activities=fleet.activities(),
                      activity_executor=ThreadPoolExecutor(4)):
        handle = await env.client.start_workflow(
            ReactiveScaling.run, ScalingInput(deployment=deployment, policy=policy, interval_seconds=30),
            id=naming.scaling_workflow_id(deployment), task_queue=queue,
        )
        await env.sleep(60)
        assert fleet.cpu_calls == [0]  # converged to "no fallback" at start, once
        fleet.ready = 1  # spot reclaimed: three replicas Unschedulable
        await env.sleep(240)
        assert fleet.cpu_calls == [0]  # short for less than the 300 s deadline
        await env.sleep(120)
        assert fleet.cpu_calls == [0, 3]
        s: ScalingStatus = await handle.query(ReactiveScaling.status)
        up = next(d for d in s.decisions if d.fallback_replicas == 3)
        assert "fallback up to 3: 1/4 GPU replica(s) Ready, 3 Unschedulable" in up.fallback_reason

        fleet.ready = 4  # spot capacity is back
        await env.sleep(90)
        assert fleet.cpu_calls == [0, 3]  # not before the 120 s stabilisation
        await env.sleep(60)
        assert fleet.cpu_calls == [0, 3, 0]
        s = await handle.query(ReactiveScaling.status)
        assert any("fallback down to 0: 4/4 GPU replica(s) Ready" in (d.fallback_reason or "") for d in s.decisions)
        assert all(d.desired == 4 for d in s.decisions)  # the GPU deployment itself was never touched
        await handle.terminate()
    _, name = naming.split_deployment(deployment)
    assert decisions_counted(port, name) == {}  # holds at target are not counted in the decisions metric


async def test_loop_records_its_decisions_replicas_and_cold_starts_in_the_metrics(time_skipping_env):
    env = time_skipping_env
    client, port = await metered_client(env)
    fleet = BatchFleet()
    fleet.replicas = fleet.ready = 1
    deployment = f"batch-jobs/s{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4()}"
    policy = ScalingPolicy(priority_class="batch", min_replicas=0, max_replicas=8)
    fleet.signals = Signals(queue_waiting=100, gpu_util_percent=90)
    activities = fleet.activities()

    @activity.defn(name=SCALE_VERSION)
    async def scale_ready(request: ScaleVersionInput) -> None:
        fleet.replicas = fleet.ready = request.replicas  # Ready at once: the queue keeps asking for more

    activities[2] = scale_ready
    async with Worker(client, task_queue=queue, workflows=[ReactiveScaling], activities=activities,
                      activity_executor=ThreadPoolExecutor(4)):
        handle = await env.client.start_workflow(
            ReactiveScaling.run, ScalingInput(deployment=deployment, policy=policy, interval_seconds=30),
            id=naming.scaling_workflow_id(deployment), task_queue=queue,
        )
        await env.sleep(100)
        await handle.terminate()
    _, name = naming.split_deployment(deployment)
    counted = decisions_counted(port, name)
    assert counted[("up", "queue_depth")] >= 1 and counted[("hold", "max_replicas")] >= 1
    up = frozenset({("kube_namespace", "batch-jobs"), ("deployment", name), ("direction", "up"), ("reason", "queue_depth")})
    assert ours(samples(port), SCALING_DECISIONS.name, name)[up] >= 1  # labelled with the Kubernetes namespace

    got = samples(port)
    batch = {("kube_namespace", "batch-jobs"), ("deployment", name), ("pool", "batch")}
    assert ours(got, REPLICAS_DESIRED.name, name) == {frozenset(batch | {("capacity_type", "spot")}): 8}
    assert ours(got, REPLICAS_READY.name, name) == {frozenset(batch | {("capacity_type", "spot")}): 8}
    # every scale-up was Ready by the next decision, 30 s after the one that asked for it
    attempts = ours(got, SCALE_UP_ATTEMPTS.name, name)[frozenset(batch)]
    assert attempts >= 1 and ours(got, SCALE_UP_SUCCESSES.name, name)[frozenset(batch)] == attempts
    assert ours(got, COLD_START_SECONDS.name + "_count", name)[frozenset(batch)] == attempts
    assert ours(got, COLD_START_SECONDS.name + "_sum", name)[frozenset(batch)] == pytest.approx(30 * attempts, abs=1)


async def test_a_scale_up_taken_back_before_its_replicas_were_ready_counts_as_given_up(time_skipping_env):
    env = time_skipping_env
    client, port = await metered_client(env)
    fleet = BatchFleet()
    fleet.replicas = fleet.ready = 1  # new replicas never become Ready: no spot capacity
    fleet.signals = Signals(queue_waiting=100, gpu_util_percent=90)
    deployment = f"batch-jobs/s{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4()}"
    policy = ScalingPolicy(priority_class="batch", min_replicas=0, max_replicas=8)
    async with Worker(client, task_queue=queue, workflows=[ReactiveScaling], activities=fleet.activities(),
                      activity_executor=ThreadPoolExecutor(4)):
        handle = await env.client.start_workflow(
            ReactiveScaling.run, ScalingInput(deployment=deployment, policy=policy, interval_seconds=30),
            id=naming.scaling_workflow_id(deployment), task_queue=queue,
        )
        await env.sleep(45)
        assert fleet.replicas == 6  # 1 + ceil(100 / 20), none of the 5 new ones Ready
        await handle.execute_update(ReactiveScaling.update_policy, PolicyPatch(max_replicas=3))  # the operator caps it
        await env.sleep(5)
        await handle.terminate()
    assert fleet.replicas == 3
    _, name = naming.split_deployment(deployment)
    got = samples(port)
    batch = frozenset({("kube_namespace", "batch-jobs"), ("deployment", name), ("pool", "batch")})
    assert ours(got, SCALE_UP_ATTEMPTS.name, name)[batch] == 1
    assert ours(got, SCALE_UP_SUCCESSES.name, name)[batch] == 0
    assert batch not in ours(got, COLD_START_SECONDS.name + "_count", name)  # no cold start to measure
