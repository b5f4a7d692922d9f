"""What every step of ModelRollout does the same way: run one activity (interruptible by an abort,
or running to its end), stop for an abort or wait out a pause between actions, move the route,
scale a version, move to the next stage, show progress in the web UI, and record the rollout's
metrics. Each works on the run's ``RunState``; the steps (workflows/rollout/steps/) are made of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextlib import suppress
from datetime import timedelta
from typing import Any, Callable

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.workflow import ActivityCancellationType

from workflows.core.failures import cause
from workflows.core.notices import deliver
from workflows.core.search_attributes import CANARY_PERCENT, STAGE
from workflows.core.telemetry import (
    LEGACY_GATE_VERDICT,
    LEGACY_ROLLOUT,
    METER_PATCH,
    gate_verdict,
    rollout_finished,
    rollout_paused,
)
from workflows.core.waiting import wait_until
from workflows.rollout.contract import (
    NoticeInput,
    NoticeKind,
    NotifyActivities,
    RolloutActivities,
    RouteWeightsInput,
    ScaleVersionInput,
    WaitReadyInput,
)
from workflows.rollout.patches import NOTIFY_PATCH
from workflows.rollout.run_state import RunState
from workflows.rollout.types import RolloutResult, Stage, VerdictRecord

PAUSE_TICK = 3600.0  # seconds between wake-ups of a paused rollout

# Forward steps give up after a few attempts (the rollout then rolls back); the way back never does.
FORWARD = RetryPolicy(
    maximum_attempts=5, maximum_interval=timedelta(seconds=30), non_retryable_error_types=["ValidationError"]
)
BACK = RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=["ValidationError"])
# A gate measurement is retried briefly; after that it counts as a metric error, not a verdict.
GATES = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5), maximum_attempts=3)
# A lookup that no worker may implement (NotFoundError) says so instead of retrying.
LOOKUP = RetryPolicy(maximum_attempts=5, non_retryable_error_types=["NotFoundError", "ValidationError"])
KUBE_CALL = timedelta(seconds=60)
# Runs started before metrics moved onto the workflow metric meter replay the record_* activities
# they scheduled; those were best effort: a missing or failing recorder never held up a rollout.
BEST_EFFORT = RetryPolicy(maximum_attempts=3, non_retryable_error_types=["NotFoundError", "ValidationError"])


class Abort(Exception):
    """A human aborted: roll back."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RollBack(Exception):
    """``verdict``: the canary gate that failed; ``quality``: the golden set or the shadow
    comparison failed. Either says the version is wrong, not the attempt: it is deprecated."""

    def __init__(self, reason: str, verdict: VerdictRecord | None = None, quality: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.verdict = verdict
        self.quality = quality


async def act(
    state: RunState,
    method: Callable,
    arg: Any,
    *,
    summary: str,
    start_to_close: float | None = None,
    schedule_to_close: float | None = None,
    heartbeat: float | None = None,
    retry: RetryPolicy = FORWARD,
    interruptible: bool = True,
    read_only: bool = False,
) -> Any:
    """Run one activity.

    Interruptible (long waits, downloads, reads): an abort or a cancel cancels it and waits
    until it stopped (it heartbeats); a read-only one is abandoned instead. Not interruptible (short cluster
    changes): it runs to its end even when the workflow is cancelled, and a rollback waits for
    it first, so no forward change can land after the route went back to stable.
    """
    task = asyncio.ensure_future(
        workflow.execute_activity_method(
            method,
            arg,
            start_to_close_timeout=timedelta(seconds=start_to_close or schedule_to_close or KUBE_CALL.total_seconds()),
            schedule_to_close_timeout=timedelta(seconds=schedule_to_close) if schedule_to_close else None,
            heartbeat_timeout=timedelta(seconds=heartbeat) if heartbeat else None,
            retry_policy=retry,
            summary=summary,
            cancellation_type=(
                ActivityCancellationType.ABANDON if read_only else ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
            ),
        )
    )
    if not interruptible:
        state.in_flight = task
        return await asyncio.shield(task)
    try:
        await wait_until(lambda: task.done() or state.abort_reason is not None)
    except asyncio.CancelledError:
        await stop(task)
        raise
    if not task.done():
        await stop(task)
        raise Abort(state.abort_reason or "aborted")
    return task.result()


async def stop(task: asyncio.Future) -> None:
    """Cancel an activity and wait until it stopped (or was abandoned)."""
    task.cancel()
    with suppress(asyncio.CancelledError, ActivityError):
        await task


async def shielded(cleanup: Coroutine[Any, Any, RolloutResult]) -> RolloutResult:
    """Run a rollback to its end even when the workflow is cancelled meanwhile (then re-raise)."""
    task = asyncio.ensure_future(cleanup)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


async def next_gate_interval(state: RunState, why: str) -> None:
    """Wait one gate interval, or less when a human pauses, promotes or aborts, then act on what
    they sent (``checkpoint``): the beat of every analysis loop."""
    await wait_until(
        lambda: state.paused or state.promote is not None or state.abort_reason is not None,
        timedelta(seconds=state.input.gate_interval_seconds),
        why,
    )
    await checkpoint(state)


async def checkpoint(state: RunState) -> None:
    """Between actions: stop for an abort, wait out a pause (promote also ends a pause)."""
    if state.abort_reason is not None:
        raise Abort(state.abort_reason)
    if not state.paused:
        return
    before = state.stage
    set_stage(state, Stage.PAUSED)
    record_rollout(state, "paused", state.stage_label(state.weight))
    notify(state, NoticeKind.PAUSED, state.pause_reason or "paused")
    since = workflow.now()
    limit = state.input.deadlines.pause_seconds
    while state.paused and state.abort_reason is None and state.promote is None:
        paused_for = (workflow.now() - since).total_seconds()
        if limit is not None and paused_for >= limit:
            raise RollBack(f"paused longer than {limit:.0f}s ({state.pause_reason}); rolling back")
        # Wake hourly to show how long the pause lasts: a handful of events per hour, bounded.
        wait = PAUSE_TICK if limit is None else min(PAUSE_TICK, limit - paused_for)
        await wait_until(
            lambda: not state.paused or state.abort_reason is not None or state.promote is not None,
            timedelta(seconds=wait),
            "still paused",
        )
        show(state, f"paused for {(workflow.now() - since).total_seconds() / 3600:.1f} h")
    if state.abort_reason is not None:
        raise Abort(state.abort_reason)
    ended_by = "promote ended the pause" if state.paused else "resumed"
    state.paused = False
    record_rollout(state, "resumed", state.stage_label(state.weight))
    notify(state, NoticeKind.RESUMED, ended_by)
    set_stage(state, before)


async def route(
    state: RunState, weights: dict[str, int], summary: str, retry: RetryPolicy = FORWARD, release: bool = False
) -> None:
    """Set the route's weights as the route's owner (this workflow); ``release``: its last change."""
    await act(
        state,
        RolloutActivities.set_route_weights,
        RouteWeightsInput(
            deployment=state.ref,
            weights=weights,
            port=state.input.port,
            mirror=state.mirror_for(weights),
            owner=workflow.info().workflow_id,
            release=release,
            stable=stable_after(state, weights),
        ),
        summary=summary,
        retry=retry,
        interruptible=False,
    )
    state.weight = weights.get(state.input.version, 0)
    state.max_weight = max(state.max_weight, state.weight)
    workflow.upsert_search_attributes([CANARY_PERCENT.value_set(state.weight)])
    show(state)


async def read_live_total(state: RunState, why: str) -> None:
    """Re-read the stable's replicas (the scaling loop sizes it: the deployment's total) into the
    promoted size; a failed read keeps the last total and says so, it is no reason to roll back."""
    stable = state.stable
    assert stable is not None
    try:
        cluster = await act(
            state, RolloutActivities.describe_deployment, state.ref, summary=f"read {stable.version}'s live total {why}",
            read_only=True,
        )
    except ActivityError as err:
        show(state, f"live total unreadable, sizing from {state.target_replicas}: {cause(err)}")
        return
    live = next((v for v in cluster.versions if v.version == stable.version), None)
    state.follow_total(live.replicas if live is not None else None)


def stable_after(state: RunState, weights: dict[str, int]) -> str | None:
    """The version the route records as stable after ``weights``: the new version once it carries
    100 %, else the stable one this run started beside (None: nothing is stable yet)."""
    if weights.get(state.input.version, 0) >= 100:
        return state.input.version
    stable = state.stable.version if state.stable is not None else None
    return stable if stable is not None and weights.get(stable, 0) > 0 else None


async def scale(state: RunState, version: str, replicas: int, summary: str, retry: RetryPolicy = FORWARD) -> None:
    await act(
        state,
        RolloutActivities.scale_version,
        ScaleVersionInput(deployment=state.ref, version=version, replicas=replicas),
        summary=summary,
        retry=retry,
        interruptible=False,
    )
    if version == state.input.version:
        state.canary_replicas = replicas


async def scale_canary(state: RunState, replicas: int, why: str) -> None:
    """Scale the new version to ``replicas`` and wait until they are Ready (the step's deadline);
    a canary that does not become Ready rolls back (the attempt failed, not the version)."""
    version = state.input.version
    await scale(state, version, replicas, f"scale {version} to {replicas} replica(s) {why}")
    try:
        await act(
            state,
            RolloutActivities.wait_ready,
            WaitReadyInput(deployment=state.ref, version=version, replicas=replicas),
            summary=f"wait for {replicas} replica(s) of {version} to be Ready",
            schedule_to_close=state.input.deadlines.step_ready_seconds,
            heartbeat=30,
        )
    except ActivityError as err:
        raise RollBack(f"canary not Ready {why}: {cause(err)}") from err


def set_stage(state: RunState, stage: Stage) -> None:
    now = workflow.now()
    key = state.stage.value
    state.timings[key] = state.timings.get(key, 0.0) + (now - state.stage_since).total_seconds()
    state.stage, state.stage_since = stage, now
    workflow.upsert_search_attributes([STAGE.value_set(stage.value)])
    show(state)


def show(state: RunState, note: str = "") -> None:
    workflow.set_current_details(state.details(note))


def notify(state: RunState, kind: NoticeKind, message: str) -> None:
    """Tell people (a Kubernetes Event, the webhook) without waiting: the delivery runs beside the
    rollout and ``drain_notices`` awaits it before the run returns, so no task is left pending."""
    if not workflow.patched(NOTIFY_PATCH):
        return
    info = workflow.info()
    notice = NoticeInput(
        deployment=state.ref, version=state.input.version, kind=kind, message=message, weight=state.weight,
        workflow_id=info.workflow_id, run_id=info.run_id, namespace=info.namespace, seq=len(state.notices) + 1,
    )
    state.notices.append(asyncio.ensure_future(deliver(NotifyActivities.notify, notice, f"notify: {kind.value}")))


async def drain_notices(state: RunState) -> None:
    """Wait for every notice issued so far (each ends within a minute; failures are logged)."""
    await asyncio.gather(*state.notices)


def record_rollout(state: RunState, event: str, stage: str, rollback_seconds: float | None = None) -> None:
    """A rollout paused, resumed or ended (``event`` is then its outcome), on the workflow meter."""
    ref = state.ref
    if workflow.patched(METER_PATCH):
        if event in ("paused", "resumed"):
            rollout_paused(workflow.metric_meter(), ref.namespace, ref.name, event == "paused")
        else:
            rollout_finished(workflow.metric_meter(), ref.namespace, ref.name, event, stage, rollback_seconds)
        return
    _legacy_record(
        state,
        LEGACY_ROLLOUT,
        {"namespace": ref.namespace, "deployment": ref.name, "event": event, "stage": stage, "rollback_seconds": rollback_seconds},
        event,
    )


def record_verdict(state: RunState, verdict: str, failing_gate: str) -> None:
    """One observation window's gate verdict on the new version, on the workflow meter."""
    ref, version = state.ref, state.input.version
    if workflow.patched(METER_PATCH):
        gate_verdict(workflow.metric_meter(), ref.namespace, ref.name, version, verdict, failing_gate)
        return
    _legacy_record(
        state,
        LEGACY_GATE_VERDICT,
        {"namespace": ref.namespace, "deployment": ref.name, "version": version, "verdict": verdict, "failing_gate": failing_gate},
        f"gate {verdict}",
    )


def _legacy_record(state: RunState, activity_name: str, event: dict, what: str) -> None:
    """A run recorded before the meter replays the metrics activity it scheduled (drained at the end)."""
    state.telemetry.append(
        workflow.start_activity(
            activity_name,
            event,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=BEST_EFFORT,
            summary=f"metrics: {what}",
        )
    )
