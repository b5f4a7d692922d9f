"""What the canary step (steps/canary.py) does after each verdict: name its cause
(workflows/rollout/diagnosis.py) from what the cluster and the gateway say about the canary, and act
on it (issue 32, items 3 and 4):

- regression: the verdict is judged as before (a failure rolls back and deprecates the version); a
  canary pod OOM-killed or in a crash loop rolls back at once, whatever the gates said;
- overload: no verdict on the version; the canary is re-sized to carry its share at the stable's
  per-replica load and the step's evidence restarts (after ``MAX_RESIZES`` a human is asked);
- lost capacity: no verdict; the analysis clock is held, the route carries only what the live
  canary pods can (``live_weight``) until the lost pods are back, then the step's weight returns;
  past ``deadlines.lost_capacity_seconds`` the rollout pauses for a human with the reason.

A canary fleet that cannot be read leaves the verdict undiagnosed and judged as before.
"""

from __future__ import annotations

from enum import Enum

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.core.failures import cause
from workflows.rollout.actions import GATES, RollBack, act, checkpoint, next_gate_interval, route, scale_canary, show
from workflows.rollout.contract import CanaryFleetActivities, CanaryFleetInput
from workflows.rollout.diagnosis import CanaryFleet, Cause, Diagnosis, diagnose
from workflows.rollout.run_state import RunState
from workflows.rollout.types import VerdictRecord

MAX_RESIZES = 3  # overload re-sizes per step; one more pauses for a human (the load keeps outgrowing the canary)


class Next(str, Enum):
    """What the step does with the observation once its cause is known."""

    JUDGE = "judge"  # count the verdict as before
    RESTART = "restart"  # the canary was re-sized: the step's evidence and window start again
    HELD = "held"  # capacity was lost and is back: the observation is dropped, the clock did not run


async def act_on_cause(state: RunState, weight: int, record: VerdictRecord) -> Next:
    """Diagnose ``record`` (kept on it and in the status) and act on its cause."""
    fleet = await _read_fleet(state, weight)
    if fleet is None:
        return Next.JUDGE
    found = _diagnosed(state, record, fleet)
    if found.cause is Cause.REGRESSION and fleet.crashed:
        raise RollBack(f"canary regression at {weight} %: {found.reason}", record)
    if found.cause is Cause.OVERLOAD:
        await _resize(state, weight, found)
        return Next.RESTART
    if found.cause is Cause.LOST_CAPACITY:
        await _hold_for_capacity(state, weight, record, found)
        return Next.HELD
    return Next.JUDGE


def _diagnosed(state: RunState, record: VerdictRecord, fleet: CanaryFleet) -> Diagnosis:
    found = diagnose(record.evaluation, fleet)
    record.diagnosis = state.diagnosis = found
    return found


async def _read_fleet(state: RunState, weight: int) -> CanaryFleet | None:
    inp, stable = state.input, state.stable
    assert stable is not None
    try:
        return await act(
            state,
            CanaryFleetActivities.read_canary_fleet,
            CanaryFleetInput(
                deployment=state.ref,
                version=inp.version,
                stable_version=stable.version,
                weight=weight,
                canary_wanted=state.canary_replicas,
                queries=inp.fleet_queries.model_dump(),
                variables=state.query_variables(),
            ),
            summary=f"read the canary's pods and load at {weight} %",
            start_to_close=30,
            retry=GATES,
            read_only=True,
        )
    except ActivityError as err:
        show(state, f"canary fleet unreadable at {weight} % (verdict judged undiagnosed): {cause(err)}")
        return None


async def _resize(state: RunState, weight: int, found: Diagnosis) -> None:
    """Give the overloaded canary the replicas its traffic needs at the stable's per-replica load."""
    state.resizes += 1
    if state.resizes > MAX_RESIZES:
        state.paused = True
        state.pause_reason = f"overload at {weight} % after {MAX_RESIZES} re-sizes of the canary: {found.reason}"
        await checkpoint(state)
        state.resizes = 0
        return
    replicas = max(found.replicas or 0, state.canary_replicas + 1)
    state.holding = f"overload at {weight} %: {found.reason}; re-sizing {state.input.version} to {replicas} replica(s), the step's evidence restarts"
    show(state)
    await scale_canary(state, replicas, f"for its load at {weight} %")
    state.holding = None


async def _hold_for_capacity(state: RunState, weight: int, record: VerdictRecord, found: Diagnosis) -> None:
    """Route only what the live canary pods carry until the lost ones are Ready again (bounded)."""
    inp, stable = state.input, state.stable
    assert stable is not None
    since = workflow.now()
    limit = inp.deadlines.lost_capacity_seconds
    while True:
        live = found.live_weight if found.live_weight is not None else weight
        state.holding = f"lost capacity at {weight} %: {found.reason}; analysis clock held, {live} % on the live canary pods"
        if live != state.weight:
            await route(state, {stable.version: 100 - live, inp.version: live}, f"re-plan: {live} % onto the live {inp.version} pods")
        show(state)
        await next_gate_interval(state, f"wait for the canary's lost pods at {weight} %")
        if state.promote is not None:
            break
        if (workflow.now() - since).total_seconds() >= limit:
            state.paused = True
            state.pause_reason = f"lost capacity for over {limit:.0f}s at {weight} %: {found.reason}"
            await checkpoint(state)
            break
        fleet = await _read_fleet(state, weight)
        if fleet is None:
            continue
        found = _diagnosed(state, record, fleet)
        if found.cause is Cause.REGRESSION and fleet.crashed:
            raise RollBack(f"canary regression at {weight} %: {found.reason}", record)
        if fleet.canary_ready >= fleet.canary_wanted:
            break
    state.holding = None
    if state.weight != weight:
        await route(state, {stable.version: 100 - weight, inp.version: weight}, f"capacity back: route {weight} % to {inp.version}")
