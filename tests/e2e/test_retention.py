"""Retention: the RegistryRetention workflow on the time-skipping server with the real
activities (registry in moto, Deployments in the Kubernetes API emulator), the metric it records,
the CLI and the daily schedule on a Temporal dev server (the pure planner:
tests/unit/test_retention.py)."""

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
from temporalio.client import Client, ScheduleRange
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.clients.kube import KubeClient
from activities.clients.s3 import S3Client
from activities.registry import Registry, RegistryActivities
from infra.sandbox import kubeclient
from tests.kube_fixtures import run_kube_api, write_kubeconfig
from workers import registry_cli
from workers.config import Settings
from workers.registry_cli import ensure_retention_schedule
from workflows.naming import LABEL_APP, LABEL_MODEL, LABEL_VERSION, RETENTION_SCHEDULE_ID
from workflows.registry.activities import ListReferencesInput, ModelVersionRef
from workflows.registry.retention import RETENTION_WORKFLOW, RegistryRetention, RetentionInput, RetentionResult
from workflows.registry.schema import Canary, Stable
from workflows.telemetry import RETENTION_ACTIONS

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
        core = client.CoreV1Api(kubeclient.api_client(url))
        apps = client.AppsV1Api(kubeclient.api_client(url))
        for ns in ("llm-serving", "batch"):
            core.create_namespace({"metadata": {"name": ns}})
        # llama@1.1.0 is long deprecated in the registry, but a Deployment (scaled to zero,
        # kept for a fast rollback) still points at it; the other two must not confuse the scan.
        for ns, name, labels in [
            ("llm-serving", "chat-v1-1-0", {LABEL_APP: "chat", LABEL_MODEL: "llama", LABEL_VERSION: "1.1.0"}),
            ("batch", "summarise-v1-3-0", {LABEL_APP: "summarise", LABEL_MODEL: "llama", LABEL_VERSION: "1.3.0"}),
            ("batch", "unrelated", {LABEL_APP: "unrelated", LABEL_VERSION: "1.0.0"}),
        ]:
            apps.create_namespaced_deployment(ns, {
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {LABEL_APP: labels[LABEL_APP]}},
                    "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "server", "image": "vllm"}]}},
                },
            })
        yield url


@pytest.fixture
def activities(moto_url, bucket, kube_url, tmp_path) -> RegistryActivities:
    """Built as the worker builds them; the cluster through a kubeconfig, as the sandbox's env file gives it."""
    kube = KubeClient.connect(write_kubeconfig(kube_url, tmp_path / "kubeconfig"))
    return RegistryActivities(S3Client(moto_url, "us-east-1"), kube, bucket)


def retention_activities(activities: RegistryActivities) -> list:
    return [activities.list_registry_versions, activities.delete_registry_weights, activities.list_referenced_versions]


def test_referenced_versions_come_from_deployment_labels(activities):
    refs = ActivityEnvironment().run(activities.list_referenced_versions, ListReferencesInput())
    assert refs.where == {"llama@1.1.0": ["llm-serving/chat-v1-1-0"], "llama@1.3.0": ["batch/summarise-v1-3-0"]}
    assert refs.refs == [ModelVersionRef(model="llama", version="1.1.0"), ModelVersionRef(model="llama", version="1.3.0")]
    only = ActivityEnvironment().run(activities.list_referenced_versions, ListReferencesInput(namespaces=["batch"]))
    assert list(only.where) == ["llama@1.3.0"]


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


async def test_retention_workflow_dry_run_then_delete(time_skipping_env, activities, tmp_path):
    env = time_skipping_env
    registry = activities.registry
    populate(registry, tmp_path, await env.get_current_time())
    before = weight_keys(registry)
    queue = f"retention-{uuid.uuid4().hex[:8]}"

    async def run(req: RetentionInput) -> RetentionResult:
        # The ages were written against the server's clock: keep it from jumping between runs.
        with env.auto_time_skipping_disabled():
            return await env.client.execute_workflow(
                RETENTION_WORKFLOW, req, id=f"registry-retention-{uuid.uuid4().hex[:8]}", task_queue=queue,
                result_type=RetentionResult,
            )

    # The worker records its metrics into a buffer instead of a Prometheus exporter.
    buffer = MetricBuffer(10_000)
    worker_client = await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        data_converter=pydantic_data_converter,
        runtime=Runtime(telemetry=TelemetryConfig(metrics=buffer)),
    )
    with ThreadPoolExecutor(8) as executor:
        async with Worker(
            worker_client,
            task_queue=queue,
            workflows=[RegistryRetention],
            activities=retention_activities(activities),
            activity_executor=executor,
        ):
            dry = await run(RetentionInput(dry_run=True))
            assert [f"{d.model}@{d.version}" for d in dry.deleted] == ["llama@1.0.0"]
            kept = {f"{d.model}@{d.version}": d.reason for d in dry.kept}
            assert kept["llama@1.1.0"] == "referenced by Deployment llm-serving/chat-v1-1-0"
            assert kept["llama@1.2.0"].startswith("previous stable (rollback target)")
            assert kept["llama@1.3.0"] == "referenced by Deployment batch/summarise-v1-3-0"
            assert kept["llama@1.4.0"] == "canary at 5 %"
            assert kept["llama@1.5.0"] == "testing" and kept["qwen@0.1.0"].startswith("deprecated only 10.0 days")
            assert dry.dry_run and dry.freed_bytes == len(b"llama@1.0.0") * 100
            assert weight_keys(registry) == before, "a dry run deletes nothing"
            assert registry.show("llama", "1.0.0").weights.deleted_at is None
            assert retention_actions(buffer) == {}, "a dry run counts no action"

            real = await run(RetentionInput())
            assert [f"{d.model}@{d.version}" for d in real.deleted] == ["llama@1.0.0"] and not real.dry_run
            assert weight_keys(registry) == before - {registry.show("llama", "1.0.0").weights.uri("llama-1.0.0.safetensors").split("/", 3)[3]}
            gone = registry.show("llama", "1.0.0")
            assert gone.weights.deleted_at == real.at and gone.status.state == "deprecated"
            assert retention_actions(buffer) == {("llama", "deleted"): 1, ("llama", "kept"): 5, ("qwen", "kept"): 1}

            again = await run(RetentionInput())
            assert again.deleted == [] and len(again.kept) == 6, "deleted weights drop out of the plan"

            await env.sleep(timedelta(days=21))  # three weeks later on the server's clock
            later = await run(RetentionInput())
            assert [f"{d.model}@{d.version}" for d in later.deleted] == ["qwen@0.1.0"]
            kept = {f"{d.model}@{d.version}": d.reason for d in later.kept}
            assert kept["llama@1.2.0"] == "deprecated only 24.0 days ago (<= 30 days)", "past its rollback week"


async def test_cli_runs_retention_and_applies_the_schedule(activities, tmp_path, capsys):
    """`tideplane registry retention --dry-run` and `... schedule` against a Temporal dev server."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        ui=False,
    )
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
        assert "- `llama@1.0.0`: would delete — deprecated 40.0 days ago (> 30 days)" in out
        assert "- `llama@1.1.0`: keep — referenced by Deployment llm-serving/chat-v1-1-0" in out
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
        await env.shutdown()
