"""``SpotWorkflowStarts``: signal-with-start the per-instance SpotReclaim and start ReturnToSpot,
through the activity's own Temporal client."""

from __future__ import annotations

from temporalio import activity
from temporalio.common import WorkflowIDConflictPolicy

from workflows.core import naming
from workflows.spot import contract
from workflows.spot.contract import ReturnToSpotInput, StartedWorkflow, StartReclaimInput
from workflows.spot.reclaim import SpotReclaim, SpotReclaimInput
from workflows.spot.return_to_spot import ReturnToSpot


class SpotWorkflowStarts(contract.SpotWorkflowStarts):
    """Starts the workflows a spot workflow hands on to, through the activity's Temporal client."""

    @activity.defn(name="start_spot_reclaim")
    async def start_spot_reclaim(self, req: StartReclaimInput) -> StartedWorkflow:
        """Signal-with-start: a running SpotReclaim for the instance gets the notice, else one starts."""
        workflow_id = naming.spot_reclaim_workflow_id(req.notice.instance_id)
        await activity.client().start_workflow(
            SpotReclaim.run,
            SpotReclaimInput(instance_id=req.notice.instance_id, policy=req.policy),
            id=workflow_id,
            task_queue=activity.info().task_queue,
            start_signal="notice",
            start_signal_args=[req.notice],
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"spot {req.notice.kind.value} for {req.notice.instance_id}",
        )
        return StartedWorkflow(workflow_id=workflow_id)

    @activity.defn(name="start_return_to_spot")
    async def start_return_to_spot(self, req: ReturnToSpotInput) -> StartedWorkflow:
        """Start the Deployment's ReturnToSpot unless one runs (it releases every claim on the fallback)."""
        workflow_id = naming.return_to_spot_workflow_id(req.deployment.namespace, req.deployment.name)
        await activity.client().start_workflow(
            ReturnToSpot.run,
            req,
            id=workflow_id,
            task_queue=activity.info().task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"return {req.deployment.namespace}/{req.deployment.name} to spot",
        )
        return StartedWorkflow(workflow_id=workflow_id)
