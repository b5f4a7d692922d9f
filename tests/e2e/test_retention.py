"""Retention: the pure planner, the RegistryRetention workflow on the time-skipping server with
the real activities (registry in moto, Deployments in the Kubernetes API emulator), the CLI and
the daily schedule on a Temporal dev server."""

from __future__ import annotations

import asyncio
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from kubernetes import client
from temporalio.client import ScheduleRange
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.registry import Registry, delete_registry_weights, list_referenced_versions, list_registry_versions
from infra.sandbox import kubeclient
from tests.kube_fixtures import run_kube_api, write_kubeconfig
from workers import registry_cli
from workers.config import settings
from workers.registry_cli import RETENTION_SCHEDULE_ID, ensure_retention_schedule
from workflows.naming import LABEL_APP, LABEL_MODEL, LABEL_VERSION
from workflows.registry.schema import (
    Canary,
    Deprecated,
    ListReferencesInput,
    ModelVersionRef,
    Stable,
    Testing as StatusTesting,
    VersionSummary,
)
from workflows.registry.retention import RETENTION_WORKFLOW, RegistryRetention, RetentionInput, RetentionResult, plan_retention

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)


def summary(version: str, status, model: str = "llama", stable_until=None, deleted=None, location=None) -> VersionSummary:
    return VersionSummary(
        model=model,
        version=version,
        revision=1,
        status=status,
        weights_location=location or f"s3://b/weights/{model}/{version}/",
        stable_until=stable_until,
        size_bytes=1000,
        quantization="none",
        created_at=NOW - 90 * DAY,
        weights_deleted_at=deleted,
    )


def decisions(versions, referenced=None, **policy) -> dict[str, tuple[str, str]]:
    plan = plan_retention(versions, NOW, referenced or {}, **policy)
    return {f"{d.model}@{d.version}": (d.action, d.reason) for d in plan}


def test_deprecated_age_decides():
    plan = decisions([
        summary("1.0.0", Deprecated(since=NOW - 31 * DAY)),
        summary("1.1.0", Deprecated(since=NOW - 29 * DAY)),
        summary("1.2.0", Deprecated(since=NOW - 30 * DAY)),
    ])
    assert plan["llama@1.0.0"] == ("delete", "deprecated 31.0 days ago (> 30 days)")
    assert plan["llama@1.1.0"] == ("keep", "deprecated only 29.0 days ago (<= 30 days)")
    assert plan["llama@1.2.0"][0] == "keep", "exactly 30 days is not more than 30"


def test_stable_canary_testing_are_never_deleted():
    plan = decisions([
        summary("1.0.0", Stable(since=NOW - 400 * DAY)),
        summary("1.1.0", Canary(percent=5, since=NOW - 100 * DAY)),
        summary("1.2.0", StatusTesting()),
    ], deprecated_days=0)
    assert plan == {
        "llama@1.0.0": ("keep", "stable"),
        "llama@1.1.0": ("keep", "canary at 5 %"),
        "llama@1.2.0": ("keep", "testing"),
    }


def test_previous_stable_is_kept_at_least_rollback_days():
    # With a short deprecation period the rollback rule is what keeps the previous stable.
    fresh = [
        summary("1.0.0", Deprecated(since=NOW - 20 * DAY), stable_until=NOW - 20 * DAY),
        summary("1.1.0", Deprecated(since=NOW - 5 * DAY), stable_until=NOW - 5 * DAY),
        summary("1.2.0", Stable(since=NOW - 5 * DAY)),
    ]
    plan = decisions(fresh, deprecated_days=3)
    assert plan["llama@1.1.0"] == (
        "keep", "previous stable (rollback target): stable until 5.0 days ago, kept at least 7 days"
    )
    assert plan["llama@1.0.0"][0] == "delete", "only the latest previous stable is the rollback target"
    stale = [s.model_copy(update={"stable_until": NOW - 8 * DAY, "status": Deprecated(since=NOW - 8 * DAY)}) if s.version == "1.1.0" else s for s in fresh]
    assert decisions(stale, deprecated_days=3)["llama@1.1.0"][0] == "delete"


def test_referenced_by_a_deployment_is_kept_whatever_its_status():
    plan = decisions(
        [summary("1.0.0", Deprecated(since=NOW - 365 * DAY)), summary("1.0.0", Deprecated(since=NOW - 365 * DAY), model="qwen")],
        referenced={"llama@1.0.0": ["llm-serving/chat-v1-0-0", "batch/summarise-v1-0-0"]},
    )
    assert plan["llama@1.0.0"] == ("keep", "referenced by Deployment llm-serving/chat-v1-0-0, batch/summarise-v1-0-0")
    assert plan["qwen@1.0.0"][0] == "delete", "references are per model, not per version string"


def test_deleted_weights_are_left_out_and_shared_weights_are_kept():
    plan = decisions([
        summary("0.9.0", Deprecated(since=NOW - 90 * DAY), deleted=NOW - 50 * DAY),
        summary("1.0.0", Deprecated(since=NOW - 90 * DAY), location="s3://b/hub/llama/"),
        summary("1.0.1", Stable(since=NOW - 90 * DAY), location="s3://b/hub/llama"),
    ])
    assert "llama@0.9.0" not in plan
    assert plan["llama@1.0.0"] == ("keep", "shares weights at s3://b/hub/llama/ with llama@1.0.1")


# --- the workflow ------------------------------------------------------------------------------


@pytest.fixture
def bucket(moto_url, monkeypatch):
    name = f"models-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=name)
    monkeypatch.setenv("TIDEPLANE_WEIGHTS_BUCKET", name)
    settings.cache_clear()
    yield name
    settings.cache_clear()


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
def cluster(kube_url, tmp_path, monkeypatch):
    """settings().kubeconfig pointing at the emulator, as the sandbox's env file does."""
    monkeypatch.setenv("TIDEPLANE_KUBECONFIG", str(write_kubeconfig(kube_url, tmp_path / "kubeconfig")))
    settings.cache_clear()
    yield kube_url
    settings.cache_clear()


ACTIVITIES = [list_registry_versions, delete_registry_weights, list_referenced_versions]


def test_referenced_versions_come_from_deployment_labels(cluster):
    refs = ActivityEnvironment().run(list_referenced_versions, ListReferencesInput())
    assert refs.where == {"llama@1.1.0": ["llm-serving/chat-v1-1-0"], "llama@1.3.0": ["batch/summarise-v1-3-0"]}
    assert refs.refs == [ModelVersionRef(model="llama", version="1.1.0"), ModelVersionRef(model="llama", version="1.3.0")]
    only = ActivityEnvironment().run(list_referenced_versions, ListReferencesInput(namespaces=["batch"]))
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
    listing = registry.s3.list_objects_v2(Bucket=registry.bucket, Prefix="weights/")
    return {o["Key"] for o in listing.get("Contents", [])}


async def test_retention_workflow_dry_run_then_delete(time_skipping_env, bucket, cluster, tmp_path):
    env = time_skipping_env
    registry = Registry.from_settings()
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

    with ThreadPoolExecutor(8) as executor:
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[RegistryRetention],
            activities=ACTIVITIES,
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

            real = await run(RetentionInput())
            assert [f"{d.model}@{d.version}" for d in real.deleted] == ["llama@1.0.0"] and not real.dry_run
            assert weight_keys(registry) == before - {"weights/llama/1.0.0/llama-1.0.0.safetensors"}
            gone = registry.show("llama", "1.0.0")
            assert gone.weights.deleted_at == real.at and gone.status.state == "deprecated"

            again = await run(RetentionInput())
            assert again.deleted == [] and len(again.kept) == 6, "deleted weights drop out of the plan"

            await env.sleep(timedelta(days=21))  # three weeks later on the server's clock
            later = await run(RetentionInput())
            assert [f"{d.model}@{d.version}" for d in later.deleted] == ["qwen@0.1.0"]
            kept = {f"{d.model}@{d.version}": d.reason for d in later.kept}
            assert kept["llama@1.2.0"] == "deprecated only 24.0 days ago (<= 30 days)", "past its rollback week"


async def test_cli_runs_retention_and_applies_the_schedule(bucket, cluster, tmp_path, monkeypatch, capsys):
    """`tideplane registry retention --dry-run` and `... schedule` against a Temporal dev server."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        ui=False,
    )
    queue = f"retention-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TIDEPLANE_TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    monkeypatch.setenv("TIDEPLANE_TASK_QUEUE", queue)
    settings.cache_clear()
    registry = Registry.from_settings()
    populate(registry, tmp_path, datetime.now(timezone.utc))
    before = weight_keys(registry)
    try:
        with ThreadPoolExecutor(8) as executor:
            async with Worker(
                env.client,
                task_queue=queue,
                workflows=[RegistryRetention],
                activities=ACTIVITIES,
                activity_executor=executor,
            ):
                code = await asyncio.to_thread(registry_cli.main, ["registry", "retention", "--dry-run"])
        out = capsys.readouterr().out
        assert code == 0 and "**Registry retention (dry run)**" in out
        assert "- `llama@1.0.0`: would delete — deprecated 40.0 days ago (> 30 days)" in out
        assert "- `llama@1.1.0`: keep — referenced by Deployment llm-serving/chat-v1-1-0" in out
        assert "1 deleted, 6 kept, would free" in out
        assert weight_keys(registry) == before

        assert await ensure_retention_schedule(env.client, queue, hour=3) == "created"
        assert await asyncio.to_thread(registry_cli.main, ["registry", "schedule", "--hour", "4", "--minute", "30"]) == 0
        assert f"schedule {RETENTION_SCHEDULE_ID} updated: RegistryRetention daily at 04:30 UTC" in capsys.readouterr().out
        desc = await env.client.get_schedule_handle(RETENTION_SCHEDULE_ID).describe()
        action = desc.schedule.action
        assert (action.workflow, action.id, action.task_queue) == (RETENTION_WORKFLOW, "registry-retention", queue)
        [daily] = desc.schedule.spec.calendars  # the server stores the cron line as a calendar
        assert (daily.hour[0].start, daily.minute[0].start, daily.day_of_week[0]) == (4, 30, ScheduleRange(0, 6))
    finally:
        await env.shutdown()
