"""Promote: re-point traffic, never reload weights. The new version at the promoted size first
(Ready), then 100 % of the route and the stable version's LoRA adapter rules moved to it, then the
registry says stable; the old version is left to retire. A first deploy (nothing stable) is
promoted right after warm-up."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.core.failures import cause
from workflows.core.versions import Stable
from workflows.rollout import registry_records
from workflows.rollout.actions import BACK, RollBack, act, checkpoint, read_live_total, route, scale, set_stage
from workflows.rollout.contract import MoveAdapterRulesInput, RolloutActivities, WaitReadyInput
from workflows.rollout.patches import LIVE_TOTAL_PATCH
from workflows.rollout.run_state import RunState
from workflows.rollout.types import Stage


async def first_deploy(state: RunState) -> None:
    """No stable version: the new one takes the whole route."""
    inp = state.input
    await route(state, {inp.version: 100}, f"first deploy: route 100 % to {inp.version}", release=True)
    set_stage(state, Stage.PROMOTED)
    await registry_records.set_status(state, Stable(since=workflow.now()), "first deploy")


async def over_stable(state: RunState) -> str:
    """Promote over the stable version; the version that no longer carries traffic."""
    inp, stable = state.input, state.stable
    assert stable is not None
    set_stage(state, Stage.PROMOTING)
    live = workflow.patched(LIVE_TOTAL_PATCH)
    if live:
        await read_live_total(state, "before promotion")
    if state.target_replicas != state.canary_replicas or live:  # the new version's Ready replicas carry the total
        if state.target_replicas != state.canary_replicas:
            await scale(state, inp.version, state.target_replicas, f"scale {inp.version} to stable size {state.target_replicas}")
        try:
            await act(
                state,
                RolloutActivities.wait_ready,
                WaitReadyInput(deployment=state.ref, version=inp.version, replicas=state.target_replicas),
                summary=f"wait for {state.target_replicas} replica(s) of {inp.version} to be Ready",
                schedule_to_close=inp.deadlines.step_ready_seconds,
                heartbeat=30,
            )
        except ActivityError as err:
            raise RollBack(f"new version not Ready at full size: {cause(err)}") from err
    await checkpoint(state)
    await route(state, {stable.version: 0, inp.version: 100}, f"promote: route 100 % to {inp.version}", release=True)
    if state.adapters is not None:
        await _move_adapter_rules(state, stable.version, inp.version if state.adapters else None)
    set_stage(state, Stage.PROMOTED)
    await registry_records.set_status(state, Stable(since=workflow.now()), f"promoted over {stable.version}")
    return stable.version


async def _move_adapter_rules(state: RunState, from_version: str, to_version: str | None) -> None:
    """The adapters' rules follow the base (None: removed); runs to its end, as a route change does."""
    await act(
        state,
        RolloutActivities.move_adapter_rules,
        MoveAdapterRulesInput(deployment=state.ref, from_version=from_version, to_version=to_version),
        summary=f"adapter rules: from {from_version} to {to_version or 'nothing (another model)'}",
        retry=BACK,
        interruptible=False,
    )
