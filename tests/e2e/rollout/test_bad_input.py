"""Bad input, tried the way a user sends it (the ``temporal`` CLI against the sandbox's dev server
and a worker with every real activity): each gets a fast answer naming the problem, and the
cluster is left as it was. The README's "Bad input and its answer" table lists these cases and their answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from kubernetes import client
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from infra.sandbox.kubeclient import api_client, raw
from infra.sandbox.launcher import WEIGHTS_BUCKET
from infra.sandbox.worker_identity import enable_serving_namespace
from tests.e2e.rollout.test_faults import status_when
from workers.client import connect
from workers.config import load_settings
from workers.worker import WORKFLOWS, build_activities
from workflows.rollout.types import Outcome, PauseInput, RolloutInput, RolloutResult, Stage
from workflows.rollout.client import rollout_result

BIN = Path(sys.executable).parent
NAMESPACE = "bad-input"  # exists and stays empty: no bad input may create anything in it
MISSING_NAMESPACE = "no-such-namespace"
FAST = 15.0  # seconds: "fails fast" (one workflow task, or one activity that fails non-retryably)


@dataclass
class Ctx:
    client: Client
    api: client.ApiClient
    address: str
    task_queue: str
    weights_uri: str
    sha256: str


@pytest.fixture(scope="module")
async def ctx(sandbox):
    """The sandbox with an empty namespace, a small weights object in S3, and one worker."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in sandbox.env.items():
            mp.setenv(key, value)
        config = load_settings()  # the worker's settings, read once from the sandbox's environment
        api = api_client(sandbox.urls["kubeapi"])
        enable_serving_namespace(api, NAMESPACE)
        data = random.Random(7).randbytes(64 * 1024)
        key = f"bad-input/{uuid.uuid4().hex}/model.safetensors"
        boto3.client("s3", endpoint_url=sandbox.urls["moto"]).put_object(Bucket=WEIGHTS_BUCKET, Key=key, Body=data)
        temporal = await connect(config)
        task_queue = f"bad-input-{uuid.uuid4().hex[:8]}"
        with ThreadPoolExecutor(max_workers=8) as executor:
            async with Worker(
                temporal, task_queue=task_queue, workflows=WORKFLOWS, activities=build_activities(config), activity_executor=executor
            ):
                yield Ctx(
                    temporal, api, sandbox.urls["temporal"], task_queue,
                    f"s3://{WEIGHTS_BUCKET}/{key}", hashlib.sha256(data).hexdigest(),
                )


def rollout(ctx: Ctx, **changes) -> dict:
    """A valid rollout of ``bad-input/<name>`` (changes applied; a None value removes the field)."""
    body = {
        "deployment": f"{NAMESPACE}/chat",
        "model": "llama-3-8b",
        "version": "2.0.0",
        "image": "vllm/vllm-openai:v0.6.3",
        "weights_uri": ctx.weights_uri,
        "sha256": ctx.sha256,
        "steps": [{"weight": 5, "window_seconds": 10}, {"weight": 50, "window_seconds": 10}],
        "gate_interval_seconds": 5,
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not None}


async def temporal(ctx: Ctx, *args: str) -> subprocess.CompletedProcess:
    """The temporal CLI, in a thread (the worker shares this event loop)."""
    argv = [str(BIN / "temporal"), *args, "--address", ctx.address]
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=30)


async def start_cli(ctx: Ctx, workflow_type: str, workflow_id: str, payload: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``temporal workflow start`` with the JSON from a file (a large input exceeds argv limits)."""
    path = tmp_path / "input.json"
    path.write_text(payload)
    return await temporal(
        ctx, "workflow", "start", "--type", workflow_type, "--task-queue", ctx.task_queue,
        "--workflow-id", workflow_id, "--input-file", str(path),
    )


async def failure_of(ctx: Ctx, workflow_id: str) -> str:
    """The message the run failed with (its cause chain), waiting at most FAST seconds."""
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(ctx.client.get_workflow_handle(workflow_id).result(), FAST)
    messages, err = [], failed.value.cause
    while err is not None:
        messages.append(str(err))
        err = err.__cause__
    return " / ".join(messages)


def cluster_objects(ctx: Ctx, namespace: str) -> list[str]:
    """Deployments, Services and HTTPRoutes in ``namespace`` (what a rollout would create)."""
    core, apps, custom = client.CoreV1Api(ctx.api), client.AppsV1Api(ctx.api), client.CustomObjectsApi(ctx.api)
    found = [f"deployment/{d['metadata']['name']}" for d in raw(apps.list_namespaced_deployment(namespace, _preload_content=False))["items"]]
    found += [f"service/{s['metadata']['name']}" for s in raw(core.list_namespaced_service(namespace, _preload_content=False))["items"]]
    routes = custom.list_namespaced_custom_object("gateway.networking.k8s.io", "v1", namespace, "httproutes")
    return found + [f"httproute/{r['metadata']['name']}" for r in routes["items"]]


def namespace_exists(ctx: Ctx, namespace: str) -> bool:
    return any(n["metadata"]["name"] == namespace for n in raw(client.CoreV1Api(ctx.api).list_namespace(_preload_content=False))["items"])


# (case, changes to a valid rollout input, text the failure must contain)
INVALID_ROLLOUTS = [
    ("deployment without namespace", {"deployment": "chat"},
     ["deployment", "deployment must be NAMESPACE/NAME with DNS-label parts, got 'chat'"]),
    ("unknown field", {"replica": 3}, ["replica", "Extra inputs are not permitted"]),
    ("weights not increasing", {"steps": [{"weight": 50, "window_seconds": 10}, {"weight": 5, "window_seconds": 10}]},
     ["steps", "weights must be strictly increasing, got [50, 5]"]),
    ("weight above 100", {"steps": [{"weight": 150, "window_seconds": 10}]}, ["steps.0.weight", "less than or equal to 100"]),
    ("zero-length window", {"steps": [{"weight": 5, "window_seconds": 0}]}, ["steps.0.window_seconds", "greater than 0"]),
    ("image missing", {"image": None}, ["image", "Field required"]),
    ("checksum malformed", {"sha256": "abc123"}, ["sha256", "String should match pattern"]),
    ("oversized env", {"env": {f"VAR_{i}": "x" * 500 for i in range(2000)}},
     ["over the 65536-byte limit (largest field: env,", "pass large data by reference"]),
    ("credential in clear", {"env": {"HF_TOKEN": "hf_abcdef", "VLLM_LOGGING_LEVEL": "INFO"}},
     ["env", "HF_TOKEN looks like a credential", '{"valueFrom": {"secretKeyRef": {"name": SECRET, "key": KEY}}}']),
    ("huge duration", {"gate_interval_seconds": 1e308}, ["gate_interval_seconds", "less than or equal to 2592000"]),
    ("replicas past the bound", {"replicas": 2_147_483_648}, ["replicas", "less than or equal to 10000"]),
    ("query window under 1 s", {"query_window_seconds": 0.4}, ["query_window_seconds", "greater than or equal to 1"]),
    ("version not a label value", {"version": "1.3.0+build.5"}, ["version", "must be a Kubernetes label value"]),
    ("GPU share above 1", {"gpu_memory_utilization": 1.5}, ["gpu_memory_utilization", "less than or equal to 1"]),
    ("credential in clear in args", {"args": ["--api-key", "sk-abcdef123"]},
     ["args", "--api-key carries a credential in clear", "secretKeyRef", "$(NAME)"]),
    ("model not a label value", {"model": "meta-llama/Llama 3"},
     ["model", "must be a Kubernetes label value (1-63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)"]),
    ("port other than 8000", {"port": 8080}, ["port", "only 8000 is supported"]),
    ("mutable image", {"image": "vllm/vllm-openai:latest"}, ["image", "pin a version tag or a digest"]),
]


@pytest.mark.parametrize("changes,expected", [c[1:] for c in INVALID_ROLLOUTS], ids=[c[0] for c in INVALID_ROLLOUTS])
async def test_invalid_rollout_input_fails_at_once_naming_the_field(ctx, tmp_path, changes, expected):
    workflow_id = f"rollout/{NAMESPACE}/{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    cli = await start_cli(ctx, "ModelRollout", workflow_id, json.dumps(rollout(ctx, **changes)), tmp_path)
    assert cli.returncode == 0, cli.stderr
    message = await failure_of(ctx, workflow_id)
    elapsed = time.monotonic() - started
    for text in expected:
        assert text in message
    assert "RolloutInput" in message
    assert elapsed < FAST
    assert cluster_objects(ctx, NAMESPACE) == []


async def test_malformed_json_is_refused_by_the_cli(ctx, tmp_path):
    workflow_id = f"rollout/{NAMESPACE}/malformed"
    cli = await start_cli(ctx, "ModelRollout", workflow_id, '{"deployment": "bad-input/chat", "model": ', tmp_path)
    assert cli.returncode != 0
    assert "input #1 is not valid JSON" in cli.stderr, cli.stderr
    assert cluster_objects(ctx, NAMESPACE) == []


def other_bytes_sha() -> str:
    return hashlib.sha256(b"not these weights").hexdigest()


# (case, changes, text the failure must contain) for inputs only the outside world can judge.
REFUSED_AT_RUN = [
    ("checksum mismatch", lambda ctx: {"sha256": other_bytes_sha()},
     lambda ctx: ["stage_weights failed before any cluster change", f"checksum mismatch for {ctx.weights_uri}",
                  f"expected sha256 {other_bytes_sha()}, actual {ctx.sha256}"]),
    ("S3 object missing", lambda ctx: {"weights_uri": f"s3://{WEIGHTS_BUCKET}/bad-input/missing.safetensors"},
     lambda ctx: ["stage_weights failed before any cluster change",
                  f"weights object not found: s3://{WEIGHTS_BUCKET}/bad-input/missing.safetensors"]),
    ("weights bucket not allowed", lambda ctx: {"weights_uri": "s3://other-bucket/w.safetensors"},
     lambda ctx: ["stage_weights failed before any cluster change", "BucketNotAllowed",
                  "bucket 'other-bucket' is not an allowed weights bucket (TIDEPLANE_WEIGHTS_BUCKETS: "]),
    ("unknown namespace", lambda ctx: {"deployment": f"{MISSING_NAMESPACE}/chat"},
     lambda ctx: ["describe_deployment failed before any cluster change", f"namespace '{MISSING_NAMESPACE}' not found"]),
    ("image not allowed", lambda ctx: {"image": "evil.example.com/miner:1"},
     lambda ctx: ["stage_weights failed before any cluster change", "ImageNotAllowed: image 'evil.example.com/miner:1' is"
                  " not from an allowed registry (TIDEPLANE_IMAGE_PREFIXES: docker.io/vllm/vllm-openai)"]),
    ("namespace not enabled", lambda ctx: {"deployment": "kube-system/evil"},
     lambda ctx: ["describe_deployment failed before any cluster change", "NamespaceNotEnabled: namespace 'kube-system' is not"
                  " enabled for tideplane: label it tideplane.io/serving=true"]),
]


@pytest.mark.parametrize("changes,expected", [c[1:] for c in REFUSED_AT_RUN], ids=[c[0] for c in REFUSED_AT_RUN])
async def test_rollout_fails_before_any_cluster_change(ctx, tmp_path, changes, expected):
    body = rollout(ctx, **changes(ctx))
    workflow_id = f"rollout/{body['deployment']}"
    started = time.monotonic()
    cli = await start_cli(ctx, "ModelRollout", workflow_id, json.dumps(body), tmp_path)
    assert cli.returncode == 0, cli.stderr
    message = await failure_of(ctx, workflow_id)
    elapsed = time.monotonic() - started
    for text in expected(ctx):
        assert text in message
    assert elapsed < FAST
    assert cluster_objects(ctx, NAMESPACE) == []
    assert not namespace_exists(ctx, MISSING_NAMESPACE)


async def test_second_rollout_promote_and_abort_are_refused_when_they_make_no_sense(ctx):
    """A rollout held (paused) right after staging, before it touches the cluster: a second start
    for the deployment, and promote with nothing to promote, are refused; abort ends it; abort
    after completion is refused."""
    first = RolloutInput.model_validate(rollout(ctx, deployment=f"{NAMESPACE}/held"))
    handle = await ctx.client.start_workflow(
        "ModelRollout", first, id=f"rollout/{NAMESPACE}/held", task_queue=ctx.task_queue, result_type=RolloutResult,
        start_signal="pause", start_signal_args=[PauseInput(reason="held by test")],
    )
    workflow_id = handle.id
    # the pause is taken at the checkpoint after staging: until then the stage is an earlier one
    await status_when(handle, lambda s: s.stage is Stage.PAUSED, FAST, "the rollout held after staging")

    second = await temporal(
        ctx, "workflow", "start", "--type", "ModelRollout", "--task-queue", ctx.task_queue, "--workflow-id", workflow_id,
        "--fail-existing", "--input", json.dumps(rollout(ctx, deployment=f"{NAMESPACE}/held", version="3.0.0")),
    )
    assert second.returncode != 0
    assert "Workflow execution is already running" in second.stderr, second.stderr

    promote = await temporal(ctx, "workflow", "update", "execute", "--workflow-id", workflow_id, "--name", "promote", "--input", "{}")
    assert promote.returncode != 0
    assert "nothing to promote: rollout is in stage paused, not in the canary ladder" in promote.stderr, promote.stderr

    abort = await temporal(ctx, "workflow", "signal", "--workflow-id", workflow_id, "--name", "abort", "--input", '{"reason": "test"}')
    assert abort.returncode == 0, abort.stderr
    result = await asyncio.wait_for(rollout_result(handle), FAST)
    assert result.outcome is Outcome.ABORTED and result.weight_reached == 0

    late = await temporal(ctx, "workflow", "signal", "--workflow-id", workflow_id, "--name", "abort", "--input", "{}")
    assert late.returncode != 0
    assert "workflow execution already completed" in late.stderr, late.stderr
    assert cluster_objects(ctx, NAMESPACE) == []


async def test_scale_policy_with_min_above_max_fails_at_once(ctx, tmp_path):
    workflow_id = f"scaling/{NAMESPACE}/chat"
    body = {"deployment": f"{NAMESPACE}/chat", "policy": {"min_replicas": 5, "max_replicas": 2}}
    cli = await start_cli(ctx, "ReactiveScaling", workflow_id, json.dumps(body), tmp_path)
    assert cli.returncode == 0, cli.stderr
    message = await failure_of(ctx, workflow_id)
    assert "policy" in message and "min_replicas (5) > max_replicas (2)" in message
    assert cluster_objects(ctx, NAMESPACE) == []


async def test_schedule_with_invalid_time_zone_is_refused(ctx, tmp_path):
    path = tmp_path / "floors.yaml"
    path.write_text(json.dumps({
        "time_zone": "Mars/Olympus_Mons",
        "schedules": [{"deployment": f"{NAMESPACE}/chat", "floors": [{"at": "09:00", "replicas": 4}]}],
    }))
    cli = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "workers.cli", "schedules", "apply", str(path)], capture_output=True, text=True, timeout=30
    )
    assert cli.returncode == 2
    assert "time_zone: Value error, unknown time zone 'Mars/Olympus_Mons'" in cli.stderr, cli.stderr
    assert [s async for s in await ctx.client.list_schedules() if NAMESPACE in s.id] == []
