"""End to end against the sandbox: the ReactiveScaling loop with its real activities.

Prometheus scrapes each serving pod it finds by discovery, the activities (the production classes, built here with
clients pointed at the sandbox) read it and the Kubernetes API emulator over HTTP, and the loop
scales the Deployment through its scale subresource. Demand steps up 5x, then falls; the worker
is stopped and replaced mid-loop.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from kubernetes import client, config
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.clients.s3 import S3Client
from activities.clients.vllm import VllmClient
from activities.rollout.rollout_activities import RolloutActivities
from activities.rollout.serving_pods import ServingPods
from activities.scaling.scaling_activities import ScalingActivities
from infra.sandbox.config import DEMAND_CONFIGMAP, SANDBOX_NAMESPACE
from infra.sandbox.launcher import AWS_ENV
from infra.sandbox.ports import free_port
from tests.sandbox_fixtures import TEST_TIME_SCALE, create_logical_deployment
from workflows.core import naming
from workflows.scaling.decide import ScalingPolicy
from workflows.scaling.contract import DEFAULT_REPLICA_HISTORY_QUERY, ReadSignalsInput, ReplicaHistoryInput
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput, ScalingStatus

NAMESPACE = "e2e-scaling"
POLICY = ScalingPolicy(
    min_replicas=1,
    max_replicas=5,
    queue_per_replica=2,
    queue_capacity_per_replica=4,
    ttft_p99_slo_seconds=30,  # the queue leads here; TTFT lags the queue by the rate window
    # the SLO sizing's service rate: a sandbox replica serves 4 req/s of sandbox time (sandbox.yaml's
    # default profile), and Prometheus' rate() counts real seconds, TEST_TIME_SCALE sandbox seconds each
    replica_capacity_rps=4 * TEST_TIME_SCALE,
    gpu_util_sustain_seconds=0,
    stabilisation_seconds=3,
    cooldown_seconds=5,
)


def deploy(api: client.ApiClient, replicas: int, namespace: str = NAMESPACE) -> None:
    """chat 1.0.0 as tideplane lays it out: its pods carry the labels and port the shipped serving
    job keeps, so Prometheus finds them by discovery as it would in production."""
    create_logical_deployment(api, namespace, "chat", "1.0.0", "llama-3-8b", replicas)


def set_demand(api: client.ApiClient, rps: float, namespace: str = NAMESPACE) -> None:
    client.CoreV1Api(api).patch_namespaced_config_map(
        DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, {"data": {f"{namespace}/chat": json.dumps({"rps": rps})}}
    )


def ready(api: client.ApiClient, namespace: str = NAMESPACE) -> int:
    return client.AppsV1Api(api).read_namespaced_deployment("chat-v1-0-0", namespace).status.ready_replicas or 0


async def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


MODEL_CACHE = Path("/var/cache/tideplane/models")


def scaling_activities(sandbox) -> ScalingActivities:
    """The loop's production activities over the sandbox's cluster and Prometheus."""
    return ScalingActivities(KubeClient.connect(sandbox.kubeconfig), PrometheusClient(sandbox.urls["prometheus"]))


def rollout_activities(sandbox) -> RolloutActivities:
    """The rollout's activities (scale_version, ensure_version) over the sandbox, as the worker builds them."""
    return RolloutActivities(
        KubeClient.connect(sandbox.kubeconfig),
        S3Client(sandbox.urls["moto"], AWS_ENV["AWS_DEFAULT_REGION"]),
        PrometheusClient(sandbox.urls["prometheus"]),
        VllmClient(),
        ServingPods(model_cache_dir=MODEL_CACHE),
        gateway="inference-gateway",
        service_url_template="http://{service}.{namespace}.svc.cluster.local:8000",
    )


def worker(temporal: Client, queue: str, sandbox) -> Worker:
    scaling = scaling_activities(sandbox)
    return Worker(
        temporal,
        task_queue=queue,
        workflows=[ReactiveScaling],
        activities=[scaling.read_scaling_signals, scaling.get_scale, rollout_activities(sandbox).scale_version],
        activity_executor=ThreadPoolExecutor(4),
    )


async def test_loop_scales_up_in_one_decision_and_down_after_window_and_cooldown(sandbox):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    deploy(api, replicas=1)
    set_demand(api, 3)
    temporal = await Client.connect(sandbox.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    queue = f"scaling-e2e-{uuid.uuid4().hex[:6]}"
    deployment = f"{NAMESPACE}/chat"
    inp = ScalingInput(deployment=deployment, policy=POLICY, interval_seconds=1, window="5s")

    async def status() -> ScalingStatus:
        return await handle.query(ReactiveScaling.status)

    async with worker(temporal, queue, sandbox):
        handle = await temporal.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(deployment), task_queue=queue
        )
        await wait_for(lambda: asyncio.to_thread(lambda: ready(api) == 1), 30, "the first replica")
        await asyncio.sleep(2)
        assert all(d.desired == 1 for d in (await status()).decisions)

        set_demand(api, 15)  # 5x: one replica serves 4 rps, the rest queues
        up = await wait_for(
            lambda: _first(status, lambda d: d.desired > d.current), 30, "a scale-up decision"
        )
        assert (up.current, up.desired) == (1, 5)  # straight to what absorbs the queue (capped at max)
        assert up.applied and up.signals.queue_waiting > 2 and "queue" in up.reason
        await wait_for(lambda: asyncio.to_thread(lambda: ready(api) == 5), 30, "5 Ready replicas")
        run_id = (await handle.describe()).run_id

    # the worker goes away mid-loop; a new one picks the same loop up with its state
    await asyncio.sleep(2)
    set_demand(api, 2)
    dropped = time.time()
    async with worker(temporal, queue, sandbox):
        downs = await wait_for(
            lambda: _all(status, lambda d: d.desired < d.current and d.at.timestamp() > dropped, at_least=2), 60, "two steps down"
        )
        assert (await handle.describe()).run_id == run_id  # the same run carried on, with its state:
        first, second = downs[0], downs[1]
        assert (first.current - first.desired, second.current - second.desired) == (1, 1)  # one step at a time
        assert first.at.timestamp() - up.at.timestamp() >= POLICY.cooldown_seconds  # cooldown from the 1st worker's change
        assert first.at.timestamp() - dropped >= POLICY.stabilisation_seconds - 1
        assert second.at.timestamp() - first.at.timestamp() >= POLICY.cooldown_seconds
        await handle.terminate()
    set_demand(api, 0)

    # the pre-warm history: hourly peaks of serving replicas, keyed by local weekday and hour
    history = await asyncio.to_thread(
        ActivityEnvironment().run,
        scaling_activities(sandbox).read_replica_history,
        ReplicaHistoryInput(
            namespace=NAMESPACE,
            deployment="chat",
            time_zone="Europe/Paris",
            weeks=1,
            at=time.time() + 3600,
            query=DEFAULT_REPLICA_HISTORY_QUERY.replace("[1h:1m]", "[1h:1s]"),  # the peak lasted seconds, not minutes
        ),
    )
    assert max(v for values in history.samples.values() for v in values) == 5
    assert all(re.fullmatch(r"[0-6]:([0-9]|1[0-9]|2[0-3])", key) for key in history.samples)


async def test_loop_converges_while_the_api_server_fails_a_fifth_of_requests(sandbox):
    """Issue 9's fault injection for loops: 500s, 409s on writes and 1 s delays on 20 % of API
    calls; the loop still reaches the size the queue asks for, never overshoots max_replicas and
    keeps running, with every activity inside its bounded retry policy."""
    namespace = "e2e-scaling-faults"
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    deploy(api, replicas=1, namespace=namespace)
    set_demand(api, 15, namespace)
    temporal = await Client.connect(sandbox.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    queue = f"scaling-faults-{uuid.uuid4().hex[:6]}"
    deployment = f"{namespace}/chat"
    spec = lambda: client.AppsV1Api(api).read_namespaced_deployment_scale("chat-v1-0-0", namespace).spec.replicas  # noqa: E731
    async with httpx.AsyncClient(base_url=sandbox.urls["kubeapi"], timeout=10) as http:
        (await http.put("/sandbox/faults", json={"rate": 0.2, "kinds": ["500", "409", "delay"], "delay_seconds": 1})).raise_for_status()
        try:
            async with worker(temporal, queue, sandbox):
                handle = await temporal.start_workflow(
                    ReactiveScaling.run,
                    ScalingInput(deployment=deployment, policy=POLICY, interval_seconds=1, window="5s"),
                    id=naming.scaling_workflow_id(deployment),
                    task_queue=queue,
                )
                def five_ready() -> bool:
                    try:
                        return ready(api, namespace) == 5
                    except client.ApiException:  # this test's own reads meet the faults too
                        return False

                await wait_for(lambda: asyncio.to_thread(five_ready), 60, "5 Ready replicas under faults")
                description = await handle.describe()
                attempts = [
                    e.activity_task_started_event_attributes.attempt
                    async for e in handle.fetch_history_events()
                    if e.HasField("activity_task_started_event_attributes")
                ]
                await handle.terminate()
        finally:
            (await http.delete("/sandbox/faults")).raise_for_status()
            set_demand(api, 0, namespace)
    assert description.status.name == "RUNNING"  # faults never failed the loop
    assert spec() == POLICY.max_replicas  # converged on what the queue asks for, not beyond
    assert max(attempts) <= 3  # the loop's retry policy bounds every activity


def test_unreachable_prometheus_reads_as_blind_not_as_a_failure():
    scaling = ScalingActivities(KubeClient(client.ApiClient()), PrometheusClient(f"http://127.0.0.1:{free_port()}"))
    signals = ActivityEnvironment().run(scaling.read_scaling_signals, ReadSignalsInput(namespace="n", deployment="d"))
    assert signals.blind and "unreachable" in signals.error
    with pytest.raises(ApplicationError) as err:
        ActivityEnvironment().run(
            scaling.read_scaling_signals, ReadSignalsInput(namespace="n", deployment="d", queries={"running": "sum(${nope})"})
        )
    assert err.value.non_retryable and "nope" in str(err.value)


async def _first(status, match):
    return next((d for d in (await status()).decisions if match(d)), None)


async def _all(status, match, at_least: int):
    found = [d for d in (await status()).decisions if match(d)]
    return found if len(found) >= at_least else None
