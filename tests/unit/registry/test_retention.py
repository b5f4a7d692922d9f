"""Retention rules: the pure planner on plain version summaries (workflows/registry/retention.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from workflows.registry.retention import plan_retention
from workflows.core.versions import Canary, Deprecated, Stable
from workflows.registry.schema import VersionSummary
from workflows.core.versions import Testing as StatusTesting

NOW = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)


def summary(version: str, status, model: str = "llama", stable_until=None, deleted=None, location=None, **serving) -> VersionSummary:
    return VersionSummary(
        **serving,
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
        referenced={"llama@1.0.0": ["Deployment llm-serving/chat-v1-0-0 (2 replicas)", "running rollout rollout/batch/summarise"]},
    )
    assert plan["llama@1.0.0"] == (
        "keep", "referenced by Deployment llm-serving/chat-v1-0-0 (2 replicas), running rollout rollout/batch/summarise"
    )
    assert plan["qwen@1.0.0"][0] == "delete", "references are per model, not per version string"


def test_deleted_weights_are_left_out_and_shared_weights_are_kept():
    plan = decisions([
        summary("0.9.0", Deprecated(since=NOW - 90 * DAY), deleted=NOW - 50 * DAY),
        summary("1.0.0", Deprecated(since=NOW - 90 * DAY), location="s3://b/hub/llama/"),
        summary("1.0.1", Stable(since=NOW - 90 * DAY), location="s3://b/hub/llama"),
    ])
    assert "llama@0.9.0" not in plan
    assert plan["llama@1.0.0"] == ("keep", "shares weights at s3://b/hub/llama/ with llama@1.0.1")


def test_the_previous_stable_of_each_deployment_is_its_rollback_target():
    """Two deployments of one model: each keeps the version it last retired, not only the latest."""
    plan = decisions([
        summary("1.0.0", Deprecated(since=NOW - 5 * DAY), retired={"prod/chat": NOW - 5 * DAY}),
        summary("1.1.0", Deprecated(since=NOW - 2 * DAY), retired={"prod/batch": NOW - 2 * DAY}),
        summary("1.2.0", Stable(since=NOW - 2 * DAY), deployments={"prod/chat": Stable(since=NOW - 5 * DAY), "prod/batch": Stable(since=NOW - 2 * DAY)}),
        summary("0.9.0", Deprecated(since=NOW - 9 * DAY), retired={"prod/chat": NOW - 9 * DAY}),
    ], deprecated_days=0)
    assert plan["llama@1.0.0"] == ("keep", "previous stable on prod/chat (rollback target): stable until 5.0 days ago, kept at least 7 days")
    assert plan["llama@1.1.0"][1].startswith("previous stable on prod/batch (rollback target)")
    assert plan["llama@0.9.0"][0] == "delete", "an older retiree of prod/chat is no rollback target"
