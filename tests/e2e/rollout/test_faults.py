"""End to end in the sandbox: a good release still gets promoted when the outside world misbehaves.

- the Kubernetes API answers 20 % of requests 500 / 409 Conflict / late, and S3 (through the
  fault proxy infra/sandbox/s3faults.py) answers a share of requests 500 / 503 / reset / cut short
  while staging: the rollout converges, retries are bounded and visible in the history;
- Prometheus stops mid-canary: the rollout pauses and says why, never promoting blind; started
  again and resumed, it promotes;
- the Temporal dev server restarts mid-rollout (state in its --db-filename): the rollout goes on.

One worker (every real activity) for the module, pointed at the S3 fault proxy.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import boto3
import httpx
import pytest
from kubernetes import client
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError
from temporalio.worker import Worker

from infra.sandbox.config import Demand, Profile
from infra.sandbox.knobs import set_demand, set_profile
from infra.sandbox.kubeclient import api_client, raw
from infra.sandbox.launcher import WEIGHTS_BUCKET
from infra.sandbox.s3faults import S3Faults
from tests.sandbox_fixtures import create_logical_deployment
from workers.client import connect
from workers.config import load_settings
from activities.core.workflow_signals import WorkflowSignals
from workers.worker import WORKFLOWS, build_activities
from workflows.core.naming import rollout_workflow_id, versioned_name
from workflows.rollout.client import rollout_result, start_rollout
from workflows.rollout.types import (
    Outcome,
    ResumeInput,
    RolloutInput,
    RolloutResult,
    RolloutStatus,
    Stage,
)

MODEL = "faults-llm"
WEIGHTS_BYTES = 40 * 1024 * 1024  # five 8 MiB ranged GETs
KUBE_FAULTS = {"rate": 0.2, "kinds": ["500", "409", "delay"], "delay_seconds": 1}
S3_KINDS = ("500", "503", "reset", "truncate", "delay")
S3_SEED = 83  # at 25 %, the first draws inject a cut-short GET, a 503, a reset and a 500
FORWARD_ATTEMPTS = 5  # workflows/rollout/workflow.py _FORWARD: the most attempts a forward step gets


@dataclass
class Ctx:
    client: Client
    api: client.ApiClient
    kubeapi: str
    task_queue: str
    s3: S3Faults
    weights_uri: str
    sha256: str


@pytest.fixture(scope="module")
async def ctx(sandbox):
    """A worker whose S3 goes through the fault proxy, its activities built as ``tideplane worker``
    builds them (stage_weights signals its progress through the worker's client); a well-behaved
    profile for MODEL."""
    with pytest.MonkeyPatch.context() as mp, S3Faults(sandbox.urls["moto"], seed=S3_SEED) as s3:
        for k, v in {**sandbox.env, "AWS_ENDPOINT_URL": s3.url, "TIDEPLANE_AWS_ENDPOINT_URL": s3.url}.items():
            mp.setenv(k, v)
        config = load_settings()  # the worker's settings, read once from the sandbox's environment
        data = random.Random(11).randbytes(WEIGHTS_BYTES)
        key = f"faults/{uuid.uuid4().hex}/model.safetensors"
        boto3.client("s3", endpoint_url=sandbox.urls["moto"]).put_object(Bucket=WEIGHTS_BUCKET, Key=key, Body=data)
        api = api_client(sandbox.urls["kubeapi"])
        set_profile(api, MODEL, None, Profile(load_seconds=20, error_rate=0.0, ttft_seconds=0.15, tpot_seconds=0.025, capacity_rps=4))
        temporal = await connect(config)
        task_queue = f"faults-{uuid.uuid4().hex[:8]}"
        with ThreadPoolExecutor(max_workers=16) as executor:
            async with Worker(
                temporal, task_queue=task_queue, workflows=WORKFLOWS, activity_executor=executor,
                activities=build_activities(config, WorkflowSignals(temporal, asyncio.get_running_loop())),
            ):
                yield Ctx(temporal, api, sandbox.urls["kubeapi"], task_queue, s3, f"s3://{WEIGHTS_BUCKET}/{key}", hashlib.sha256(data).hexdigest())


@pytest.fixture
async def deployment(ctx, request):
    """A stable chat 1.0.0 (2 replicas, 8 rps offered) in a namespace of its own, deleted afterwards
    with any rollout of it still running: a rerun of a failed test starts its rollout afresh instead
    of failing on the first attempt's workflow id."""
    namespace = "faults-" + request.node.name.removeprefix("test_")[:40].replace("_", "-").strip("-")
    create_logical_deployment(ctx.api, namespace, "chat", "1.0.0", MODEL, replicas=2)
    set_demand(ctx.api, f"{namespace}/chat", Demand(rps=8))
    yield f"{namespace}/chat"
    handle = ctx.client.get_workflow_handle(rollout_workflow_id(f"{namespace}/chat"))
    try:
        if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
            await handle.terminate("test teardown")
    except RPCError:
        pass  # never started (the test failed before its rollout)
    client.CoreV1Api(ctx.api).delete_namespace(namespace)


def rollout_input(ctx: Ctx, deployment: str, version: str, window: float = 4, **changes) -> RolloutInput:
    """A compressed rollout (20 -> 50 -> 100 %, gates every 2 s) with lenient latency gates: these
    tests are about faults, not verdicts."""
    return RolloutInput.model_validate({
        "deployment": deployment,
        "model": MODEL,
        "version": version,
        "image": "vllm/vllm-openai:v0.6.3",
        "weights_uri": ctx.weights_uri,
        "sha256": ctx.sha256,
        "replicas": 2,
        "steps": [{"weight": 20, "window_seconds": window}, {"weight": 50, "window_seconds": window}],
        "gate_interval_seconds": 2,
        "query_window_seconds": 10,
        "gates": {"min_requests": 1, "max_latency_degradation": 2.0},
        "warm_up": {"requests": 4, "deadline_seconds": 60},
        "scale_down_delay_seconds": 0,
        **changes,
    })


async def status_when(handle: WorkflowHandle, predicate, timeout: float, what: str) -> RolloutStatus:
    """Poll the ``status`` query until ``predicate`` holds (query errors while Temporal is away are retried)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = await handle.query("status", result_type=RolloutStatus)
            if predicate(status):
                return status
        except RPCError:
            status = None
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last status: {status}")
        await asyncio.sleep(0.3)


def route_weights(api: client.ApiClient, deployment: str) -> dict[str, int]:
    namespace, name = deployment.split("/")
    route = client.CustomObjectsApi(api).get_namespaced_custom_object("gateway.networking.k8s.io", "v1", namespace, "httproutes", name)
    return {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}


def assert_promoted_cleanly(ctx: Ctx, deployment: str, result: RolloutResult) -> None:
    """Promoted, one Deployment and one Service per version, one route sending 100 % to the new one."""
    assert result.outcome is Outcome.PROMOTED, result.reason
    namespace, name = deployment.split("/")
    old, new = versioned_name(name, "1.0.0"), versioned_name(name, result.version)
    apps, core = client.AppsV1Api(ctx.api), client.CoreV1Api(ctx.api)
    assert sorted(d["metadata"]["name"] for d in raw(apps.list_namespaced_deployment(namespace, _preload_content=False))["items"]) == [old, new]
    assert sorted(s["metadata"]["name"] for s in raw(core.list_namespaced_service(namespace, _preload_content=False))["items"]) == [old, new]
    routes = client.CustomObjectsApi(ctx.api).list_namespaced_custom_object("gateway.networking.k8s.io", "v1", namespace, "httproutes")
    assert [r["metadata"]["name"] for r in routes["items"]] == [name]
    assert route_weights(ctx.api, deployment) == {old: 0, new: 100}


async def activity_attempts(handle: WorkflowHandle) -> dict[str, int]:
    """Activity type -> highest attempt number that ran, from the history (retries made visible)."""
    types: dict[int, str] = {}
    attempts: Counter[str] = Counter()
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            types[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.HasField("activity_task_started_event_attributes"):
            started = event.activity_task_started_event_attributes
            kind = types[started.scheduled_event_id]
            attempts[kind] = max(attempts[kind], started.attempt)
    return dict(attempts)


class RouteWatch:
    """Samples the route's weights in the background while faults fly (failed reads are skipped)."""

    def __init__(self, api: client.ApiClient, deployment: str):
        self.sums: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(api, deployment), daemon=True)

    def _run(self, api, deployment) -> None:
        while not self._stop.wait(0.5):
            try:
                self.sums.append(sum(route_weights(api, deployment).values()))
            except client.ApiException:
                pass

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


async def test_rollout_converges_under_kube_api_and_s3_faults(ctx, deployment, caplog):
    caplog.set_level(logging.DEBUG, logger="urllib3.util.retry")  # the kube client's own brief retries of 5xx
    ctx.s3.configure(rate=0.25, kinds=S3_KINDS, delay_seconds=0.5)
    async with httpx.AsyncClient(base_url=ctx.kubeapi) as http:
        (await http.put("/sandbox/faults", json=KUBE_FAULTS)).raise_for_status()
        try:
            with RouteWatch(ctx.api, deployment) as watch:
                handle = await start_rollout(ctx.client, rollout_input(ctx, deployment, "2.0.0"), task_queue=ctx.task_queue)
                result = await asyncio.wait_for(rollout_result(handle), 120)
        finally:
            ctx.s3.configure(rate=0)
            (await http.delete("/sandbox/faults")).raise_for_status()
    attempts = await activity_attempts(handle)
    client_retries = sum("Incremented Retry" in r.getMessage() for r in caplog.records)
    print(
        f"\nS3: {ctx.s3.requests} requests, injected {dict(ctx.s3.injected)}, staging resumed at byte"
        f" {result.staged.resumed_bytes}; kube client retries of 5xx/429: {client_retries};"
        f" highest attempt per activity: {attempts}"
    )

    assert_promoted_cleanly(ctx, deployment, result)
    staged = Path(result.staged.path) / "model.safetensors"
    assert result.staged.size_bytes == WEIGHTS_BYTES
    assert hashlib.sha256(staged.read_bytes()).hexdigest() == ctx.sha256
    assert set(ctx.s3.injected) - {"delay"}  # S3 requests failed, and staging still verified
    assert attempts["stage_weights"] > 1  # the cut-short GET failed an attempt; the next one finished
    assert max(attempts.values()) <= FORWARD_ATTEMPTS  # no step needed more attempts than its policy allows
    assert client_retries + sum(a - 1 for a in attempts.values()) > 0  # faults were met, and retried visibly
    assert watch.sums and set(watch.sums) == {100}


async def test_a_slow_download_reports_its_progress_to_the_rollout(ctx, deployment):
    """Issue 35: S3 answers every request 3 s late, so staging outlasts the 5 s a report waits at
    least; stage_weights signals its rollout through the worker's client (bounded: every 5 % and 5 s
    at most), and the status query keeps what it was told: bytes, total, rate."""
    ctx.s3.configure(rate=1.0, kinds=("delay",), delay_seconds=3)
    try:
        handle = await start_rollout(ctx.client, rollout_input(ctx, deployment, "2.3.0"), task_queue=ctx.task_queue)
        told = await status_when(handle, lambda s: s.download is not None, 60, "a download report")
    finally:
        ctx.s3.configure(rate=0)
    result = await asyncio.wait_for(rollout_result(handle), 120)
    report = told.download
    print(f"\nreported to the rollout: {report.describe()}; staging took {result.staged.seconds:.1f} s")
    assert report.bytes_total == WEIGHTS_BYTES and 0 < report.bytes_done <= WEIGHTS_BYTES
    assert report.bytes_per_second > 0 and report.reported_at is not None
    assert_promoted_cleanly(ctx, deployment, result)
    signals = 0
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_execution_signaled_event_attributes"):
            signals += event.workflow_execution_signaled_event_attributes.signal_name == "staging_progress"
    assert 1 <= signals <= 20, "bounded: at most one report per 5 % of the weights"


async def test_prometheus_stopped_mid_canary_pauses_then_continues(ctx, deployment, sandbox):
    inp = rollout_input(ctx, deployment, "2.1.0", window=6, analysis={"metric_error_limit": 1})
    handle = await start_rollout(ctx.client, inp, task_queue=ctx.task_queue)
    await status_when(handle, lambda s: s.stage is Stage.CANARY and s.last_verdict is not None, 90, "a first gate verdict")
    await asyncio.to_thread(sandbox.sandbox.stop, "prometheus")
    try:
        paused = await status_when(handle, lambda s: s.paused, 60, "the rollout to pause")
    finally:
        await asyncio.to_thread(sandbox.sandbox.restart, "prometheus")
    print(f"\npaused at {paused.weight} %: {paused.pause_reason}")
    assert paused.stage is Stage.PAUSED
    assert "metrics unavailable" in paused.pause_reason and "never promoting blind" in paused.pause_reason
    assert "unreachable" in paused.pause_reason
    assert paused.analysis.consecutive_errors == 2  # metric_error_limit 1: the second error pauses

    await asyncio.sleep(3 * inp.gate_interval_seconds)  # Prometheus is back: a human decides, not the clock
    held = await handle.query("status", result_type=RolloutStatus)
    assert held.paused and held.weight == paused.weight

    await handle.signal("resume", ResumeInput())
    result = await asyncio.wait_for(rollout_result(handle), 90)
    assert_promoted_cleanly(ctx, deployment, result)


async def test_temporal_restarted_mid_rollout_continues(ctx, deployment, sandbox):
    handle = await start_rollout(ctx.client, rollout_input(ctx, deployment, "2.2.0", window=6), task_queue=ctx.task_queue)
    before = await status_when(handle, lambda s: s.stage is Stage.CANARY and s.weight > 0, 90, "the canary at 20 %")
    old_pid = json.loads(sandbox.sandbox.pids_file.read_text())["processes"]["temporal"]["pid"]
    started = time.monotonic()
    new_pid = (await asyncio.to_thread(sandbox.sandbox.restart, "temporal"))["pid"]
    print(f"\nTemporal restarted in {time.monotonic() - started:.1f}s with the rollout at {before.weight} %")
    assert new_pid != old_pid
    result = await asyncio.wait_for(rollout_result(handle), 120)
    assert_promoted_cleanly(ctx, deployment, result)
    assert result.weight_reached == 100
    scheduled = Counter()
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled[event.activity_task_scheduled_event_attributes.activity_type.name] += 1
    assert scheduled["stage_weights"] == 1 and scheduled["ensure_version"] == 1  # continued, not started over
