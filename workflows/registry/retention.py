"""Retention of model weights: which versions' weights to delete, which to keep, and why.

``plan_retention`` is pure (plain values in, decisions out) so the rules are unit-tested and the
workflow only adds I/O around it. ``RegistryRetention`` runs it daily from a Temporal Schedule
(see workers/cli/registry.py) and with ``dry_run`` reports the plan without deleting anything.

Rules, first match wins, for every version whose weights still exist:
1. referenced: a Deployment with replicas, a route backend with weight, or a running rollout
   (it may be staging them) -> keep (whatever the registry says); a 0-replica Deployment outside
   the route is not a reference (it cannot serve);
2. stable or canary -> keep;
3. the previous stable on a deployment (the latest version to stop being stable there),
   stable there until less than ``rollback_days`` ago -> keep (the rollback target);
4. deprecated more than ``deprecated_days`` ago -> delete;
5. anything else (testing, recently deprecated) -> keep.
A version planned for deletion whose weights location overlaps a kept version's is kept.

Running rollouts are listed through Temporal visibility (search attributes TideplaneModel and
TideplaneVersion) rather than read from a registry status marker: visibility sees every rollout of
the version, from its start and whether or not it resolved its weights through the registry,
while a status written by the rollout would exist only after that write (the default status,
testing, marks nothing). delete_registry_weights asks again just before it marks the manifest
(compare-and-swap), so a rollout started after the plan still stops the delete, and one started
after the mark fails at resolve_registry_weights (a marked version), before staging anything; the
window left is visibility's lag (milliseconds on SQL visibility, about a second on Elasticsearch).

A real run (not a dry run) counts the versions whose weights it deleted and kept, per model, in
``tideplane_registry_retention_actions_total`` (action ``deleted`` | ``kept``).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from workflows.core import telemetry
    from workflows.registry.contract import DeleteWeightsInput, ListReferencesInput, ListVersionsInput, RegistryActivities
    from workflows.registry.schema import ANY_DEPLOYMENT, VersionSummary

RETENTION_WORKFLOW = "RegistryRetention"
DELETE_HEARTBEAT = timedelta(minutes=1)  # delete_registry_weights heartbeats per batch of keys


class RetentionInput(BaseModel):
    dry_run: bool = Field(False, description="plan and report only; delete nothing")
    deprecated_days: float = Field(30, ge=0, description="delete weights deprecated longer than this")
    rollback_days: float = Field(7, ge=0, description="keep the previous stable at least this long")
    models: list[str] | None = Field(None, description="None: every model in the registry")


class RetentionDecision(BaseModel):
    model: str
    version: str
    action: Literal["delete", "keep"]
    reason: str
    size_bytes: int = 0


class RetentionResult(BaseModel):
    dry_run: bool
    at: datetime
    deleted: list[RetentionDecision] = Field(description="in a dry run: what would be deleted")
    kept: list[RetentionDecision]
    freed_bytes: int


def _days(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 86400:.1f} days"


def _overlap(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def plan_retention(
    versions: list[VersionSummary],
    now: datetime,
    referenced: dict[str, list[str]],
    deprecated_days: float = 30,
    rollback_days: float = 7,
) -> list[RetentionDecision]:
    """Decide per version (see the module docstring). ``referenced``: "model@version" -> what
    uses it ("Deployment ns/name (2 replicas)", ...). Versions whose weights are already deleted
    are left out."""
    live = [v for v in versions if v.weights_deleted_at is None]
    # (model, deployment) -> (when it stopped being stable there, the version): the rollback target.
    previous_stable: dict[tuple[str, str], tuple[datetime, VersionSummary]] = {}
    for v in live:
        # A version retired before per-deployment status has only its model-wide stable_until.
        retired = v.retired or ({ANY_DEPLOYMENT: v.stable_until} if v.stable_until else {})
        for deployment, until in retired.items():
            best = previous_stable.get((v.model, deployment))
            if deployment not in v.deployments and (best is None or until > best[0]):
                previous_stable[(v.model, deployment)] = (until, v)

    decisions: list[RetentionDecision] = []
    for v in live:
        ref = f"{v.model}@{v.version}"
        status = v.status

        def keep(reason: str) -> RetentionDecision:
            return RetentionDecision(model=v.model, version=v.version, action="keep", reason=reason, size_bytes=v.size_bytes)

        rollback = sorted(
            (until, deployment)
            for (model, deployment), (until, target) in previous_stable.items()
            if target is v and now - until < timedelta(days=rollback_days)
        )
        if ref in referenced:
            decision = keep(f"referenced by {', '.join(referenced[ref])}")
        elif status.state == "stable":
            decision = keep("stable")
        elif status.state == "canary":
            decision = keep(f"canary at {status.percent} %")
        elif rollback:
            until, deployment = rollback[-1]
            on = "" if deployment == ANY_DEPLOYMENT else f" on {deployment}"
            decision = keep(
                f"previous stable{on} (rollback target): stable until {_days(now - until)} ago, "
                f"kept at least {rollback_days:g} days"
            )
        elif status.state == "deprecated" and now - status.since > timedelta(days=deprecated_days):
            decision = RetentionDecision(
                model=v.model,
                version=v.version,
                action="delete",
                reason=f"deprecated {_days(now - status.since)} ago (> {deprecated_days:g} days)",
                size_bytes=v.size_bytes,
            )
        elif status.state == "deprecated":
            decision = keep(f"deprecated only {_days(now - status.since)} ago (<= {deprecated_days:g} days)")
        else:
            decision = keep(status.state)
        decisions.append(decision)

    kept_locations = {
        (d.model, d.version): v.weights_location for d, v in zip(decisions, live) if d.action == "keep"
    }
    for i, (d, v) in enumerate(zip(decisions, live)):
        if d.action == "delete":
            sharing = [f"{m}@{ver}" for (m, ver), loc in kept_locations.items() if _overlap(loc, v.weights_location)]
            if sharing:
                decisions[i] = d.model_copy(
                    update={"action": "keep", "reason": f"shares weights at {v.weights_location} with {', '.join(sharing)}"}
                )
    return decisions


def render_plan(decisions: list[RetentionDecision], dry_run: bool) -> str:
    """Markdown for the Temporal UI and the CLI."""
    verb = "would delete" if dry_run else "delete"
    lines = [f"**Registry retention{' (dry run)' if dry_run else ''}**", ""]
    for d in decisions:
        action = verb if d.action == "delete" else "keep"
        lines.append(f"- `{d.model}@{d.version}`: {action} — {d.reason}")
    return "\n".join(lines) if decisions else lines[0] + "\n\nnothing in the registry"


def _count_actions(deleted: list[RetentionDecision], kept: list[RetentionDecision]) -> None:
    """tideplane_registry_retention_actions_total per model: versions whose weights went or stayed."""
    counts = Counter((d.model, "deleted") for d in deleted) + Counter((d.model, "kept") for d in kept)
    meter = workflow.metric_meter()
    for (model, action), count in sorted(counts.items()):
        telemetry.retention_action(meter, model, action, count)


@workflow.defn(name=RETENTION_WORKFLOW)
class RegistryRetention:
    """Deletes old weights by the rules of ``plan_retention`` and reports every decision."""

    @workflow.run
    async def run(self, req: RetentionInput) -> RetentionResult:
        now = workflow.now()
        retry = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(minutes=1))
        versions = await workflow.execute_activity_method(
            RegistryActivities.list_registry_versions,
            ListVersionsInput(models=req.models),
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=retry,
            summary="read the registry indexes",
        )
        # Without the cluster's answer nothing is deleted: the workflow fails after the retries.
        referenced = await workflow.execute_activity_method(
            RegistryActivities.list_referenced_versions,
            ListReferencesInput(),
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=retry,
            summary="versions referenced by Deployments",
        )
        plan = plan_retention(versions.versions, now, referenced.where, req.deprecated_days, req.rollback_days)
        workflow.set_current_details(render_plan(plan, req.dry_run))

        deleted: list[RetentionDecision] = []
        kept = [d for d in plan if d.action == "keep"]
        for d in plan:
            if d.action != "delete":
                continue
            if not req.dry_run:
                done = await workflow.execute_activity_method(
                    RegistryActivities.delete_registry_weights,
                    DeleteWeightsInput(model=d.model, version=d.version, reason=d.reason, at=now),
                    start_to_close_timeout=timedelta(minutes=10),
                    heartbeat_timeout=DELETE_HEARTBEAT,  # a crashed worker's delete is retried within a minute
                    retry_policy=retry,
                    summary=f"delete weights of {d.model}@{d.version}",
                )
                if not done.deleted:
                    kept.append(d.model_copy(update={"action": "keep", "reason": done.reason}))
                    continue
            deleted.append(d)
        if not req.dry_run:
            _count_actions(deleted, kept)
        return RetentionResult(
            dry_run=req.dry_run,
            at=now,
            deleted=deleted,
            kept=kept,
            freed_bytes=sum(d.size_bytes for d in deleted),
        )
