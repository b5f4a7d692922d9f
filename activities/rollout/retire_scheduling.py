"""``RetireScheduling``: starts and cancels the RetireVersion workflow that scales a version left
without traffic to 0 after the delay (workflows/rollout/retire_version.py)."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from workflows.rollout import contract
from workflows.rollout.contract import (
    CANCEL_RETIRE,
    SCHEDULE_RETIRE,
    CancelRetireInput,
    RetireInput,
    retire_workflow_id,
)
from workflows.rollout.retire_version import RetireVersion


class RetireScheduling(contract.RetireScheduling):
    """Starts and cancels RetireVersion workflows with the worker's Temporal client
    (``activity.client()``), on the worker's own task queue."""

    @activity.defn(name=SCHEDULE_RETIRE)
    async def schedule_retire(self, req: RetireInput) -> str:
        retire_id = retire_workflow_id(req.deployment, req.version)
        try:
            await activity.client().start_workflow(
                RetireVersion.run,
                req,
                id=retire_id,
                task_queue=activity.info().task_queue,
                static_summary=f"Scale {req.version} of {req.deployment} to 0 after {req.delay_seconds:.0f}s",
            )
        except WorkflowAlreadyStartedError:
            return f"{retire_id} already pending"  # an earlier start (or attempt) of the same scale-down
        return f"{retire_id} started"

    @activity.defn(name=CANCEL_RETIRE)
    async def cancel_retire(self, req: CancelRetireInput) -> str:
        retire_id = retire_workflow_id(req.deployment, req.version)
        handle = activity.client().get_workflow_handle(retire_id)
        try:
            await handle.cancel()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return f"{retire_id}: none pending"  # never started, or already ended
        # Wait until it ended, so no scale-down of this version lands after the caller goes on.
        try:
            await handle.result()
        except WorkflowFailureError:
            pass  # cancelled, as asked
        return f"{retire_id} cancelled"
