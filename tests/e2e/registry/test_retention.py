"""Retention: the RegistryRetention workflow on the time-skipping server with the real
activities (registry in moto, Deployments in the Kubernetes API emulator), the metric it records,
the CLI and the daily schedule on a Temporal dev server (the pure planner:
tests/unit/registry/test_retention.py)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from kubernetes import client
from temporalio.client import ScheduleRange
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.clients.kube import KubeClient
from activities.clients.s3 import S3Client
from activities.registry.store import Registry
from activities.registry.registry_activities import RegistryActivities
from activities.core.deployments import ROUTE_API
from infra.sandbox import kubeclient
from infra.sandbox.worker_identity import enable_serving_namespace
from tests.kube_fixtures import run_kube_api, write_kubeconfig
from workers.cli import registry as registry_cli
from workers.config import Settings
from workers.cli.registry import ensure_retention_schedule
from workflows.core import search_attributes
from workflows.core.naming import LABEL_APP, LABEL_MODEL, LABEL_VERSION, RETENTION_SCHEDULE_ID
from workflows.registry.contract import DeleteWeightsInput, ListReferencesInput
from workflows.registry.retention import DELETE_HEARTBEAT, RETENTION_WORKFLOW, RegistryRetention, RetentionInput, RetentionResult
from workflows.core.versions import Canary, Stable
from workflows.core.naming import MODEL_ROLLOUT_WORKFLOW
from workflows.core.telemetry import RETENTION_ACTIONS

DAY = timedelta(days=1)


# --- the workflow ------------------------------------------------------------------------------


@pytest.fixture
def bucket(moto_url):
    name = f"models-{uuid.uuid4().hex[:12]}"
    S3Client(moto_url, "us-east-1").boto.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def kube_url():
    """The Kubernetes API emulator, spoken to by the official client like a real cluster."""
    with run_kube_api() as url:
        api = kubeclient.api_client(url)
        core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
        for ns in ("llm-serving", "batch"):
            enable_serving_namespace(core.api_client, ns)
        # What retired versions leave behind must not count: llama@1.1.0's Deployment has 0
        # replicas and weight 0 in the route. llama@1.0.0 has 0 replicas too, but the route still
        # sends it traffic; llama@1.3.0 runs a replica; the unlabelled one must not confuse the scan.
        for ns, name, labels, replicas in [
            ("llm-serving", "chat-v1-0-0", {LABEL_APP: "chat", LABEL_MODEL: "llama", LABEL_VERSION: "1.0.0"}, 0),
            ("llm-serving", "chat-v1-1-0", {LABEL_APP: "chat", LABEL_MODEL: "llama", LABEL_VERSION: "1.1.0"}, 0),
            ("batch", "summarise-v1-3-0", {LABEL_APP: "summarise", LABEL_MODEL: "llama", LABEL_VERSION: "1.3.0"}, 1),
            ("batch", "unrelated", {LABEL_APP: "unrelated", LABEL_VERSION: "1.0.0"}, 1),
        ]:
            apps.create_namespaced_deployment(ns, {
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {LABEL_APP: labels[LABEL_APP]}},
                    "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "server", "image": "vllm"}]}},
                },
            })
        backends = [{"kind": "Service", "name": name, "port": 8000, "weight": w} for name, w in (("chat-v1-0-0", 100), ("chat-v1-1-0", 0))]
        custom.create_namespaced_custom_object(*ROUTE_API, "llm-serving", "httproutes", {
            "apiVersion": "/".join(ROUTE_API), "kind": "HTTPRoute", "metadata": {"name": "chat", "namespace": "llm-serving"},
            "spec": {"parentRefs": [{"name": "inference-gateway"}], "rules": [{"backendRefs": backends}]},
        })
        yield url


@pytest.fixture(scope="module")
async def dev_env():
    """A Temporal dev server with tideplane's search attributes: retention lists running
    rollouts through visibility, which the time-skipping test server does not implement."""
    buffer = MetricBuffer(10_000)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        search_attributes=list(search_attributes.ALL),
        runtime=Runtime(telemetry=TelemetryConfig(metrics=buffer)),
        ui=False,
    )
    env.metrics = buffer  # the worker's metric updates, read by retention_actions
    try:
        yield env
    finally:
        await env.shutdown()


async def start_rollout(env: WorkflowEnvironment, model: str, version: str) -> str:
    """A running ModelRollout of model@version as visibility lists it (its first workflow task
    upserts these search attributes); on a queue no worker polls, so it stays where it is."""
    workflow_id = f"rollout/llm-serving/{uuid.uuid4().hex[:8]}"
    await env.client.start_workflow(
        MODEL_ROLLOUT_WORKFLOW, {"deployment": "llm-serving/chat", "model": model, "version": version, "image": "vllm"},
        id=workflow_id, task_queue=f"no-worker-{uuid.uuid4().hex[:8]}",
        search_attributes=TypedSearchAttributes([
            SearchAttributePair(search_attributes.MODEL, model), SearchAttributePair(search_attributes.VERSION, version),
        ]),
    )
    # Visibility records a start asynchronously (milliseconds, longer on a busy machine): wait for it.
    for _ in range(100):
        if [w async for w in env.client.list_workflows(f'WorkflowId = "{workflow_id}" AND ExecutionStatus = "Running"')]:
            return workflow_id
        await asyncio.sleep(0.1)
    raise AssertionError(f"{workflow_id} never listed as running")


@pytest.fixture
def activities(moto_url, bucket, kube_url, tmp_path) -> RegistryActivities:
    """Built as the worker builds them; the cluster through a kubeconfig, as the sandbox's env file gives it."""
    kube = KubeClient.connect(write_kubeconfig(kube_url, tmp_path / "kubeconfig"))
    return RegistryActivities(S3Client(moto_url, "us-east-1"), kube, bucket)


def retention_activities(activities: RegistryActivities) -> list:
    return [activities.list_registry_versions, activities.delete_registry_weights, activities.list_referenced_versions]


async def test_references_are_what_can_serve_or_is_being_rolled_out(activities, dev_env):
    rollout = await start_rollout(dev_env, "qwen", "0.1.0")
    env = ActivityEnvironment(client=dev_env.client)
    refs = await env.run(activities.list_referenced_versions, ListReferencesInput())
    assert refs.where == {
        "llama@1.0.0": ["HTTPRoute llm-serving/chat (100 %)"],
        "llama@1.3.0": ["Deployment batch/summarise-v1-3-0 (1 replicas)"],
        "qwen@0.1.0": [f"running rollout {rollout}"],
    }, "a 0-replica Deployment at weight 0 (llama@1.1.0) is no reference"
    assert [f"{r.model}@{r.version}" for r in refs.refs] == ["llama@1.0.0", "llama@1.3.0", "qwen@0.1.0"]
    only = await env.run(activities.list_referenced_versions, ListReferencesInput(namespaces=["batch"]))
    assert set(only.where) == {"llama@1.3.0", "qwen@0.1.0"}
    await dev_env.client.get_workflow_handle(rollout).terminate("test over")


async def test_a_delete_is_refused_while_a_rollout_of_the_version_runs(activities, dev_env, tmp_path):
    """A rollout started after retention planned still stops the delete: the activity asks again."""
    registry = activities.registry
    path = tmp_path / "qwen.safetensors"
    path.write_bytes(b"qwen@0.2.0" * 100)
    registry.register("qwen", "0.2.0", str(path))
    registry.deprecate("qwen", "0.2.0")
    rollout = await start_rollout(dev_env, "qwen", "0.2.0")
    env = ActivityEnvironment(client=dev_env.client)
    delete = DeleteWeightsInput(model="qwen", version="0.2.0", reason="deprecated long ago")
    refused = await env.run(activities.delete_registry_weights, delete)
    assert not refused.deleted and refused.reason == f"referenced by running rollout {rollout}"
    assert registry.resolve("qwen", "0.2.0", verify=True).weights.deleted_at is None, "weights intact, not marked"
    await dev_env.client.get_workflow_handle(rollout).terminate("test over")
    assert (await env.run(activities.delete_registry_weights, delete)).deleted


def populate(registry: Registry, tmp_path: Path, now: datetime) -> None:
    for model, version in [("llama", v) for v in ("1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0", "1.5.0")] + [("qwen", "0.1.0")]:
        path = tmp_path / f"{model}-{version}.safetensors"
        path.write_bytes(f"{model}@{version}".encode() * 100)
        registry.register(model, version, str(path), at=now - 90 * DAY)
    registry.deprecate("llama", "1.0.0", at=now - 40 * DAY)
    registry.deprecate("llama", "1.1.0", at=now - 40 * DAY)
    registry.set_status("llama", "1.2.0", Stable(since=now - 20 * DAY), at=now - 20 * DAY)
    registry.set_status("llama", "1.3.0", Stable(since=now - 3 * DAY), at=now - 3 * DAY)  # demotes 1.2.0
    registry.set_status("llama", "1.4.0", Canary(percent=5, since=now - DAY), at=now - DAY)
    registry.deprecate("qwen", "0.1.0", at=now - 10 * DAY)


def weight_keys(registry: Registry) -> set[str]:
    listing = registry.s3.boto.list_objects_v2(Bucket=registry.bucket, Prefix="weights/")
    return {o["Key"] for o in listing.get("Contents", [])}


def retention_actions(buffer: MetricBuffer) -> Counter:
    """(model, action) -> versions, from the metric updates the worker recorded since the last call."""
    counts: Counter = Counter()
    for update in buffer.retrieve_updates():
        if update.metric.name == RETENTION_ACTIONS.name:
            counts[(update.attributes["model"], update.attributes["action"])] += update.value
    return counts


async def test_retention_workflow_dry_run_then_delete(dev_env, activities, tmp_path):
    env = dev_env
    registry = activities.registry
    populate(registry, tmp_path, datetime.now(timezone.utc))
    before = weight_keys(registry)
    queue = f"retention-{uuid.uuid4().hex[:8]}"
    retention_actions(env.metrics)  # drop what earlier tests recorded

    last_id = ""

    async def run(req: RetentionInput) -> RetentionResult:
        nonlocal last_id
        last_id = f"registry-retention-{uuid.uuid4().hex[:8]}"
        return await env.client.execute_workflow(
            RETENTION_WORKFLOW, req, id=last_id, task_queue=queue, result_type=RetentionResult,
        )

    def key(version: str) -> str:
        return registry.show("llama", version).weights.uri(f"llama-{version}.safetensors").split("/", 3)[3]

    with ThreadPoolExecutor(8) as executor:
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[RegistryRetention],
            activities=retention_activities(activities),
            activity_executor=executor,
        ):
            dry = await run(RetentionInput(dry_run=True))
            assert [f"{d.model}@{d.version}" for d in dry.deleted] == ["llama@1.1.0"], (
                "a deprecated version whose Deployment is at 0 replicas and weight 0 goes"
            )
            kept = {f"{d.model}@{d.version}": d.reason for d in dry.kept}
            assert kept["llama@1.0.0"] == "referenced by HTTPRoute llm-serving/chat (100 %)"
            assert kept["llama@1.2.0"].startswith("previous stable (rollback target)")
            assert kept["llama@1.3.0"] == "referenced by Deployment batch/summarise-v1-3-0 (1 replicas)"
            assert kept["llama@1.4.0"] == "canary at 5 %"
            assert kept["llama@1.5.0"] == "testing" and kept["qwen@0.1.0"].startswith("deprecated only 10.0 days")
            assert dry.dry_run and dry.freed_bytes == len(b"llama@1.1.0") * 100
            assert weight_keys(registry) == before, "a dry run deletes nothing"
            assert registry.show("llama", "1.1.0").weights.deleted_at is None
            assert retention_actions(env.metrics) == {}, "a dry run counts no action"

            real = await run(RetentionInput())
            assert [f"{d.model}@{d.version}" for d in real.deleted] == ["llama@1.1.0"] and not real.dry_run
            assert weight_keys(registry) == before - {key("1.1.0")}
            gone = registry.show("llama", "1.1.0")
            assert gone.weights.deleted_at == real.at and gone.status.state == "deprecated"
            assert retention_actions(env.metrics) == {("llama", "deleted"): 1, ("llama", "kept"): 5, ("qwen", "kept"): 1}
            history = await env.client.get_workflow_handle(last_id).fetch_history()
            [scheduled] = [
                e.activity_task_scheduled_event_attributes for e in history.events
                if e.activity_task_scheduled_event_attributes.activity_type.name == "delete_registry_weights"
            ]
            assert scheduled.heartbeat_timeout.ToTimedelta() == DELETE_HEARTBEAT, "a lost worker's delete is retried within a minute"

            again = await run(RetentionInput())
            assert again.deleted == [] and len(again.kept) == 6, "deleted weights drop out of the plan"

            # A deprecated version being rolled out again is kept while its rollout runs (issue 20).
            rollout = await start_rollout(env, "qwen", "0.1.0")
            busy = await run(RetentionInput(deprecated_days=5, rollback_days=2))
            kept = {f"{d.model}@{d.version}": d.reason for d in busy.kept}
            assert kept["qwen@0.1.0"] == f"referenced by running rollout {rollout}" and busy.deleted == []
            assert kept["llama@1.2.0"] == "deprecated only 3.0 days ago (<= 5 days)", "past a 2-day rollback window"
            await env.client.get_workflow_handle(rollout).terminate("test over")
            done = await run(RetentionInput(deprecated_days=5, rollback_days=2))
            assert [f"{d.model}@{d.version}" for d in done.deleted] == ["qwen@0.1.0"]


async def test_cli_runs_retention_and_applies_the_schedule(activities, dev_env, tmp_path, capsys):
    """`tideplane registry retention --dry-run` and `... schedule` against a Temporal dev server."""
    env = dev_env
    queue = f"retention-{uuid.uuid4().hex[:8]}"
    # What the CLI reads from TIDEPLANE_TEMPORAL_ADDRESS, TIDEPLANE_TASK_QUEUE, TIDEPLANE_WEIGHTS_BUCKET.
    settings = Settings(
        temporal_address=env.client.service_client.config.target_host,
        task_queue=queue,
        weights_bucket=activities.registry.bucket,
    )
    registry = activities.registry
    populate(registry, tmp_path, datetime.now(timezone.utc))
    before = weight_keys(registry)
    try:
        with ThreadPoolExecutor(8) as executor:
            async with Worker(
                env.client,
                task_queue=queue,
                workflows=[RegistryRetention],
                activities=retention_activities(activities),
                activity_executor=executor,
            ):
                code = await asyncio.to_thread(registry_cli.main, ["registry", "retention", "--dry-run"], settings)
        out = capsys.readouterr().out
        assert code == 0 and "**Registry retention (dry run)**" in out
        assert "- `llama@1.1.0`: would delete — deprecated 40.0 days ago (> 30 days)" in out
        assert "- `llama@1.0.0`: keep — referenced by HTTPRoute llm-serving/chat (100 %)" in out
        assert "1 deleted, 6 kept, would free" in out
        assert weight_keys(registry) == before

        assert await ensure_retention_schedule(env.client, queue, hour=3) == "created"
        assert await asyncio.to_thread(registry_cli.main, ["registry", "schedule", "--hour", "4", "--minute", "30"], settings) == 0
        assert f"schedule {RETENTION_SCHEDULE_ID} updated: RegistryRetention daily at 04:30 UTC" in capsys.readouterr().out
        desc = await env.client.get_schedule_handle(RETENTION_SCHEDULE_ID).describe()
        action = desc.schedule.action
        assert (action.workflow, action.id, action.task_queue) == (RETENTION_WORKFLOW, "registry-retention", queue)
        [daily] = desc.schedule.spec.calendars  # the server stores the cron line as a calendar
        assert (daily.hour[0].start, daily.minute[0].start, daily.day_of_week[0]) == (4, 30, ScheduleRange(0, 6))
    finally:
        await env.client.get_schedule_handle(RETENTION_SCHEDULE_ID).delete()
