"""Shadow: mirror a share of live requests to the canary (an HTTPRoute RequestMirror, the answers
dropped by the gateway) and compare the canary's answers with stable's on the same requests after
every gate measurement (workflows/quality/shadow.py); a drift past its threshold rolls back with
examples, and a rollout never promotes on no shadow evidence. Composes quality."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.core.failures import cause
from workflows.quality.contract import QualityActivities, ShadowJudgeInput, ShadowPairsInput
from workflows.quality.shadow import ShadowTally, ShadowVerdict, describe_pair, shadow_verdict, verdict_of
from workflows.rollout.actions import GATES, RollBack, act, checkpoint, route, show
from workflows.rollout.contract import RouteMirror
from workflows.rollout.patches import GOLDEN_PATCH, SHADOW_TALLY_PATCH
from workflows.rollout.run_state import RunState

SHADOW_KEEP = 2000  # before shadow-tally: mirrored pairs kept in memory for one window's comparison


async def start_mirror(state: RunState) -> None:
    """At the end of warm-up, when asked and there is a stable version to compare with: start mirroring."""
    inp = state.input
    if not workflow.patched(GOLDEN_PATCH) or inp.shadow is None or state.stable is None:
        return
    state.mirror = RouteMirror(version=inp.version, percent=inp.shadow.percent)
    await route(
        state,
        {state.stable.version: 100, inp.version: 0},
        f"mirror {inp.shadow.percent} % of requests to {inp.version} (shadow comparison)",
    )


async def compare(state: RunState, weight: int) -> None:
    """Compare the answers mirrored to the canary since the last verdict with stable's; a drift
    past its threshold rolls back with examples, too few pairs keeps collecting."""
    inp = state.input
    if state.mirror is None or inp.shadow is None or state.stable is None:
        return
    if workflow.patched(SHADOW_TALLY_PATCH):
        verdict = await _judged(state, weight)
    else:
        verdict = await _read_and_judged(state, weight)
    state.shadow = verdict
    show(state)
    if verdict.verdict == "fail":
        examples = "; ".join(describe_pair(p) for p in verdict.examples)
        raise RollBack(f"shadow comparison failed at {weight} %: {'; '.join(verdict.failed)}; e.g. {examples}", quality=True)
    if verdict.verdict == "pass":
        state.shadow_passed = True
        state.shadow_pairs = []  # the next window is judged on its own pairs
        state.shadow_tally = ShadowTally()


async def _judged(state: RunState, weight: int) -> ShadowVerdict:
    """The pairs are read and counted in the activity; the window's counts add up here."""
    inp = state.input
    assert inp.shadow is not None and state.stable is not None
    try:
        judged = await act(
            state,
            QualityActivities.judge_shadow_pairs,
            ShadowJudgeInput(
                deployment=state.ref,
                version=inp.version,
                stable_version=state.stable.version,
                after=state.shadow_after,
                structured=inp.shadow.structured,
            ),
            summary=f"shadow comparison of {inp.version} at {weight} %",
            start_to_close=120,
            retry=GATES,
            read_only=True,
        )
    except ActivityError as err:
        raise RollBack(f"shadow comparison at {weight} %: {cause(err)}") from err
    state.shadow_after = judged.last
    state.shadow_tally = state.shadow_tally.merged(judged.tally)
    return verdict_of(state.shadow_tally, inp.shadow)


async def _read_and_judged(state: RunState, weight: int) -> ShadowVerdict:
    """Runs from before the shadow-tally patch: the pairs themselves came through history."""
    inp = state.input
    assert inp.shadow is not None and state.stable is not None
    try:
        read = await act(
            state,
            QualityActivities.read_shadow_pairs,
            ShadowPairsInput(
                deployment=state.ref, version=inp.version, stable_version=state.stable.version, after=state.shadow_after
            ),
            summary=f"shadow pairs of {inp.version} at {weight} %",
            start_to_close=30,
            retry=GATES,
            read_only=True,
        )
    except ActivityError as err:
        raise RollBack(f"shadow comparison at {weight} %: {cause(err)}") from err
    state.shadow_after = read.last
    state.shadow_pairs = [*state.shadow_pairs, *read.pairs][-SHADOW_KEEP:]
    return shadow_verdict(state.shadow_pairs, inp.shadow)


async def before_promotion(state: RunState) -> None:
    """Never promote on no shadow evidence: if the comparison never passed (too few mirrored
    pairs in every window), pause for a human — resume promotes without it, abort rolls back.
    A full promote by an operator has decided already."""
    if state.mirror is None or state.shadow_passed or (state.promote is not None and state.promote.full):
        return
    seen = state.shadow.describe() if state.shadow else "no mirrored pairs read"
    state.paused = True
    state.pause_reason = f"shadow comparison never conclusive before promotion ({seen}); resume promotes without it"
    await checkpoint(state)
