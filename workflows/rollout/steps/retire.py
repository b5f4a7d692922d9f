"""Retire: the version left without traffic (the old stable after a promotion, the canary after a
rollback) is scaled to 0 by a RetireVersion workflow of its own (workflows/rollout/retire_version.py)
after ``scale_down_delay_seconds``, so this run's result comes when traffic has moved and the next
rollout of the deployment can start at once; and a scale-down still pending for the version this
run starts is cancelled before it starts it."""

from __future__ import annotations

from temporalio import workflow

from workflows.core.versions import DeploymentState
from workflows.rollout.actions import BACK, act, scale
from workflows.rollout.contract import CancelRetireInput, RetireInput, RetireScheduling, retire_workflow_id
from workflows.rollout.patches import RETIRE_PATCH
from workflows.rollout.run_state import RunState


async def retire(state: RunState, version: str, reason: str, *, keep_warm: str, scale_down: str) -> str | None:
    """Leave ``version``'s delayed scale-down to a RetireVersion workflow that outlives this run; what
    happens to it. A run recorded before RETIRE_PATCH scales it down itself after the delay
    (``keep_warm``, ``scale_down``: its timer's and its scale's summaries) and says nothing (None)."""
    inp = state.input
    if not workflow.patched(RETIRE_PATCH):
        await workflow.sleep(inp.scale_down_delay_seconds, summary=keep_warm)
        await scale(state, version, 0, scale_down, retry=BACK)
        return None
    await act(
        state,
        RetireScheduling.schedule_retire,
        RetireInput(deployment=inp.deployment, version=version, delay_seconds=inp.scale_down_delay_seconds, reason=reason),
        summary=f"scale {version} to 0 in {inp.scale_down_delay_seconds:.0f}s, in a workflow of its own",
        retry=BACK,
        interruptible=False,
    )
    return f"{version} scales to 0 in {inp.scale_down_delay_seconds:.0f}s ({retire_workflow_id(inp.deployment, version)})"


async def cancel_pending(state: RunState, cluster: DeploymentState) -> None:
    """A pending scale-down of the version this rollout starts (its earlier rollback, or it was
    the stable before) must not land in the middle of this rollout: cancel it first. Only a
    version still running without traffic can have one pending."""
    inp = state.input
    warm = any(v.version == inp.version and v.replicas > 0 and v.route_weight == 0 for v in cluster.versions)
    if not warm or not workflow.patched(RETIRE_PATCH):
        return
    await act(
        state,
        RetireScheduling.cancel_retire,
        CancelRetireInput(deployment=inp.deployment, version=inp.version),
        summary=f"cancel a pending scale-down of {inp.version}",
        interruptible=False,
    )
