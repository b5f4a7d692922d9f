"""Roll back: the route back to stable first (stable was kept at full size throughout), then the
registry says what the version is worth: deprecated after a failed gate or quality check (never
again), testing after an abort or a cluster error (it may be retried). The new version is left to
retire (scaled down after ``scale_down_delay_seconds``, warm for a retry)."""

from __future__ import annotations

from contextlib import suppress

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.core.versions import Deprecated, Testing
from workflows.rollout import registry_records
from workflows.rollout.actions import BACK, route, set_stage
from workflows.rollout.patches import QUALITY_DEPRECATES_PATCH
from workflows.rollout.run_state import RunState
from workflows.rollout.types import Outcome, RolloutResult, Stage, VerdictRecord


async def route_back(state: RunState, reason: str, verdict: VerdictRecord | None, quality: bool) -> float | None:
    """All traffic back on stable; seconds from the failing verdict to the route reverted (None: no verdict)."""
    inp = state.input
    reverted: float | None = None
    state.paused = False
    state.ended_in = state.stage_label(state.weight)
    if state.in_flight is not None and not state.in_flight.done():
        with suppress(ActivityError):
            await state.in_flight  # a forward cluster change still running: let it land first
    if not state.cluster_changed:
        set_stage(state, Stage.ROLLED_BACK)
        return None
    set_stage(state, Stage.ROLLING_BACK)
    if state.stable is not None:
        await route(
            state, {state.stable.version: 100, inp.version: 0}, f"roll back: route 100 % to {state.stable.version}", BACK, release=True
        )
        if verdict is not None:
            reverted = (workflow.now() - verdict.at).total_seconds()
    state.weight = 0
    set_stage(state, Stage.ROLLED_BACK)
    # a failed gate (a regression, when its cause is known) or quality check: never again; otherwise
    # (aborted, a cluster error) it may be retried
    regression = verdict is not None and (verdict.diagnosis is None or verdict.diagnosis.deprecates)
    wrong = regression or (quality and workflow.patched(QUALITY_DEPRECATES_PATCH))
    if state.canary_since is not None or wrong:
        status = Deprecated(since=workflow.now()) if wrong else Testing()
        await registry_records.set_status(state, status, f"rolled back: {reason}")
    return reverted


def result(state: RunState, outcome: Outcome, reason: str, verdict: VerdictRecord | None, reverted: float | None) -> RolloutResult:
    """The rolled-back run's result, with the failing verdict and its gates when a gate decided."""
    out = state.result(outcome, reason)
    if verdict is not None:
        out.failing_verdict = verdict
        out.failed_gates = verdict.evaluation.failed
        out.route_reverted_seconds = reverted
        out.cause = verdict.diagnosis.cause if verdict.diagnosis is not None else None
    return out
