"""ModelRollout: stage weights, start the new version beside the stable one, warm it up, shift
traffic along a canary ladder gated by Prometheus, then promote, or roll back on its own.

API (stable; the README shows the CLI lines):
  workflow type ``ModelRollout``, task queue ``tideplane``, workflow ID
  ``naming.rollout_workflow_id(deployment)`` = ``rollout/<namespace>/<name>`` (one rollout per
  deployment: start it with ``client.start_rollout`` or ``temporal workflow start --fail-existing``);
  signals ``pause`` (PauseInput), ``resume`` (ResumeInput), ``abort`` (AbortInput), each acting
  on any payload (what it did not understand is named in the reason);
  update ``promote`` (PromoteInput, refused when there is nothing to promote);
  queries ``status`` -> RolloutStatus, ``result`` -> RolloutResult | None (None while running);
  result RolloutResult when promoted. A rolled-back or aborted run FAILS (the web UI shows it
  red, ``temporal workflow execute`` exits non-zero) with a non-retryable ApplicationError of type
  ``RolledBack`` or ``Aborted``, whose message is the verdict and whose details hold the full
  RolloutResult; ``rollout_result`` (client.py, with ``start_rollout``) reads either back. Both queries answer after the run closed
  (a worker replays its history).

This module is the runbook: the operator's controls and the order of the steps. Each step is a
module of workflows/rollout/steps/ working on the run's ``RunState`` (run_state.py); what every
step does the same way (an activity, a checkpoint, a route change) is actions.py; every patch for
old histories is listed in patches.py.

The result comes when traffic has moved: the version left without traffic (the old stable after a
promotion, the canary after a rollback) is scaled down by a RetireVersion workflow
``rollout/<ns>/<name>/retire/<version>`` (workflows/rollout/retire_version.py) that this run starts
and does not wait for, so the next rollout of the deployment can start at once.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    # Full dotted names: inside the sandbox ``from workflows import x`` would re-import x (the
    # sandboxed ``workflows`` package lacks it), giving pydantic classes that differ from the real ones.
    from workflows.core.failures import cause, understood, validated
    from workflows.core.naming import DEPLOYMENT_OWNED, MODEL_ROLLOUT_WORKFLOW
    from workflows.core.search_attributes import CANARY_PERCENT, DEPLOYMENT, MISSING_ERROR, MODEL, STAGE, VERSION, missing_message
    from workflows.core.transfer import DownloadProgress
    from workflows.rollout.contract import STAGING_PROGRESS, NoticeKind, RolloutActivities
    from workflows.rollout.patches import OUTCOME_PATCH, SEARCH_ATTRIBUTES_PATCH, STABLE_READ_PATCH
    from workflows.rollout.actions import Abort, RollBack, checkpoint, drain_notices, notify, record_rollout, set_stage, shielded, show
    from workflows.rollout.run_state import RunState
    from workflows.rollout.steps import canary, promote, retire, roll_back, shadow, stage, start, warm_up
    from workflows.rollout.types import (
        AbortInput,
        Outcome,
        PauseInput,
        PromoteAck,
        PromoteInput,
        ResumeInput,
        RolloutInput,
        RolloutResult,
        RolloutStatus,
        Stage,
        VerdictRecord,
    )


# The ApplicationError type a run that did not promote fails with (issue 35: a rollback is no success).
FAILED_OUTCOMES = {Outcome.ROLLED_BACK: "RolledBack", Outcome.ABORTED: "Aborted"}
OUTCOME_NOTICES = {Outcome.PROMOTED: NoticeKind.PROMOTED, Outcome.ROLLED_BACK: NoticeKind.ROLLED_BACK, Outcome.ABORTED: NoticeKind.ABORTED}


@workflow.defn(name=MODEL_ROLLOUT_WORKFLOW, failure_exception_types=[ValidationError])
class ModelRollout:
    """One rollout of one version to one logical deployment. ValidationError fails the run (a bad
    input is reported with its field at once instead of retrying the workflow task forever)."""

    @workflow.init
    def __init__(self, input: RolloutInput) -> None:
        self._state = RunState.start(input)
        self._result: RolloutResult | None = None

    @workflow.run
    async def run(self, input: RolloutInput) -> RolloutResult:
        s = self._state
        if workflow.patched(SEARCH_ATTRIBUTES_PATCH):
            # In a namespace without them the upsert below fails every workflow task, for ever.
            missing = await workflow.execute_activity_method(
                RolloutActivities.check_search_attributes,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=5),
            )
            if missing:
                raise ApplicationError(missing_message(missing, workflow.info().namespace), type=MISSING_ERROR, non_retryable=True)
        workflow.upsert_search_attributes(
            [
                DEPLOYMENT.value_set(input.deployment),
                MODEL.value_set(input.model),
                VERSION.value_set(input.version),
                STAGE.value_set(s.stage.value),
                CANARY_PERCENT.value_set(0),
            ]
        )
        show(s)
        try:
            result = await self._run()
        except ApplicationError:  # failed before any cluster change: what was told still arrives
            await drain_notices(s)
            raise
        record_rollout(s, result.outcome.value, s.ended_in or s.stage.value, result.route_reverted_seconds)
        notify(s, OUTCOME_NOTICES[result.outcome], result.reason)
        await asyncio.gather(*s.telemetry, return_exceptions=True)
        await drain_notices(s)  # before returning or failing: a replay (a query after close) ends the same way
        self._result = result
        if result.outcome is not Outcome.PROMOTED and workflow.patched(OUTCOME_PATCH):
            raise ApplicationError(
                result.reason, result, type=FAILED_OUTCOMES[result.outcome], non_retryable=True
            )
        return result

    async def _run(self) -> RolloutResult:
        s = self._state
        try:
            return await self._rollout()
        except Abort as abort:
            back = self._roll_back(Outcome.ABORTED, abort.reason)
        except RollBack as failed:
            back = self._roll_back(Outcome.ROLLED_BACK, failed.reason, failed.verdict, failed.quality)
        except ActivityError as err:
            owned_elsewhere = isinstance(err.cause, ApplicationError) and err.cause.type == DEPLOYMENT_OWNED
            if not s.cluster_changed or owned_elsewhere:  # nothing of ours is in the cluster to roll back
                raise ApplicationError(
                    f"{err.activity_type} failed before any cluster change: {cause(err)}",
                    type="RolloutFailed",
                    non_retryable=True,
                ) from err
            back = self._roll_back(Outcome.ROLLED_BACK, f"{err.activity_type} failed: {cause(err)}")
        except asyncio.CancelledError:
            if s.stage not in (Stage.PROMOTED, Stage.ROLLED_BACK):
                await shielded(self._roll_back(Outcome.ABORTED, "workflow cancelled"))
            raise
        return await shielded(back)

    # ---- operator controls -------------------------------------------------------------------

    # Signals take any payload (plain JSON) and act on it: the SDK drops a signal it cannot decode
    # with only a log line, so a strict model would let `abort {"message": "x"}` keep shifting
    # traffic (issue 33). What was not understood is named in the reason the status shows.

    @workflow.signal
    def pause(self, input: Any = None) -> None:
        s = self._state
        if s.finishing:
            workflow.logger.info("pause ignored: rollout is %s", s.stage.value)
            return
        s.paused = True
        s.pause_reason = _reason(PauseInput, input, "pause")
        show(s)

    @workflow.signal
    def resume(self, input: Any = None) -> None:
        _reason(ResumeInput, input, "resume")
        self._state.paused = False

    @workflow.signal
    def abort(self, input: Any = None) -> None:
        """Roll back now; ignored once traffic is fully on the new version or already going back."""
        s = self._state
        if s.finishing:
            workflow.logger.info("abort ignored: rollout is %s", s.stage.value)
        elif s.abort_reason is None:
            s.abort_reason = _reason(AbortInput, input, "abort")

    @workflow.signal(name=STAGING_PROGRESS)
    def staging_progress(self, input: Any = None) -> None:
        """stage_weights' download progress (sent at a bounded rate), for the status and the current
        details; one arriving after staging is dropped."""
        s = self._state
        try:
            progress = DownloadProgress.model_validate(input)
        except ValidationError as exc:
            workflow.logger.warning("staging_progress dropped: %s", exc)
            return
        if s.stage is Stage.STAGING:
            s.download = progress.model_copy(update={"reported_at": workflow.now()})
            show(s)

    # The input arrives as plain JSON and is validated here, so a bad field is refused naming it
    # (non-retryable), not as the converter's raw ValidationError marked retryable (issue 16).
    @workflow.update
    def promote(self, input: dict[str, Any] | None = None) -> PromoteAck:
        promote = validated(PromoteInput, input, "promote")
        self._state.promote = promote
        what = "skip to 100 %" if promote.full else "end the current step"
        return PromoteAck(accepted=f"promote accepted: {what}", weight=self._state.weight)

    @promote.validator
    def _promote_allowed(self, input: dict[str, Any] | None = None) -> None:
        s = self._state
        promote = validated(PromoteInput, input, "promote")
        if s.step is None or s.stage not in (Stage.CANARY, Stage.PAUSED):
            raise ValueError(f"nothing to promote: rollout is in stage {s.stage.value}, not in the canary ladder")
        if s.abort_reason is not None:
            raise ValueError("nothing to promote: the rollout is being aborted")
        if s.paused and not promote.force:  # a pause is a human's hold: promote must not clear it silently
            raise ApplicationError(
                f"force: the rollout is paused ({s.pause_reason}); promote with"
                ' {"force": true} to end the pause and promote, or signal resume',
                type="RolloutPaused",
                non_retryable=True,
            )
        if s.promote is not None and (s.promote.full or not promote.full):
            raise ValueError("a promote is already pending")

    @workflow.query
    def status(self) -> RolloutStatus:
        return self._state.status()

    @workflow.query
    def result(self) -> RolloutResult | None:
        """The run's result once it has one (promoted, rolled back or aborted); None before."""
        return self._result

    # ---- the runbook -------------------------------------------------------------------------

    async def _rollout(self) -> RolloutResult:
        s, inp = self._state, self._state.input
        files = await stage.into_model_cache(s)
        await checkpoint(s)
        prestaged = await stage.onto_node_caches(s, files)

        cluster = await start.describe(s)
        await checkpoint(s)
        await retire.cancel_pending(s, cluster)
        first = await start.start_version(s, files, prestaged)

        await warm_up.run(s, first)
        await shadow.start_mirror(s)
        await checkpoint(s)

        if s.stable is None:
            await promote.first_deploy(s)
            return s.result(Outcome.PROMOTED, "first deploy: no stable version, promoted after warm-up")

        set_stage(s, Stage.CANARY)
        if workflow.patched(STABLE_READ_PATCH):
            await canary.gates_read_the_stable(s)
        for index, step in enumerate(inp.steps):
            if step.weight == 100 or (s.promote is not None and s.promote.full):
                break
            s.step = index
            show(s)
            await canary.shift(s, step.weight)
            await canary.observe(s, step.weight, step.window_seconds, each_window=shadow.compare)
        await shadow.before_promotion(s)

        old = await promote.over_stable(s)
        retiring = await retire.retire(
            s, old, f"{inp.version} promoted over it",
            keep_warm=f"keep {old} warm before scaling it down", scale_down=f"scale the old version {old} to 0",
        )
        reason = f"{inp.version} is stable at 100 %"
        return s.result(Outcome.PROMOTED, f"{reason}; {retiring}" if retiring else reason)

    async def _roll_back(
        self, outcome: Outcome, reason: str, verdict: VerdictRecord | None = None, quality: bool = False
    ) -> RolloutResult:
        """Route back to stable first, then leave the new version to retire after the delay."""
        s = self._state
        reverted = await roll_back.route_back(s, reason, verdict, quality)
        if s.cluster_changed:
            version = s.input.version
            await retire.retire(
                s, version, f"rolled back: {reason}",
                keep_warm=f"keep {version} warm for a retry", scale_down=f"scale {version} to 0",
            )
        return roll_back.result(s, outcome, reason, verdict, reverted)


def _reason(model: type[PauseInput] | type[AbortInput] | type[ResumeInput], raw: Any, what: str) -> str:
    """The signal's reason, with what of its payload was not understood (logged as a warning too)."""
    taken, problem = understood(model, raw, what)
    if problem is not None:
        workflow.logger.warning("%s: acting on it anyway", problem)
    reason = getattr(taken, "reason", "")
    return f"{reason} ({problem})" if problem else reason
