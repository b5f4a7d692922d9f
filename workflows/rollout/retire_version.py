"""RetireVersion: scale a version that no longer carries traffic to 0 after a delay, apart from
the rollout that took the traffic from it.

Why a workflow of its own: a promoted (or rolled-back) rollout's result is due when traffic has
moved, but the version it took the traffic from stays warm ``scale_down_delay_seconds`` (10 min
by default) for a fast way back. Kept inside the rollout, that delay kept ``rollout/<ns>/<name>``
open, so the next ``temporal workflow start --fail-existing`` failed "already running" although
the status said promoted (issue 16). The rollout starts this workflow from an activity
(``schedule_retire``, a top-level workflow, not a child) under ``retire_workflow_id(deployment,
version)`` = ``rollout/<ns>/<name>/retire/<version>`` and ends.

Not fighting the next rollout: a rollout of the version that waits here (a retry of a rolled-back
version, or going back to the previous stable) cancels this workflow before it starts that
version (``cancel_retire``); and just before scaling, this workflow reads the deployment again
and leaves a version alone that carries traffic again.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from workflows.core.naming import DeploymentRef
    from workflows.rollout.contract import RetireInput, RolloutActivities, ScaleVersionInput

WORKFLOW_TYPE = "RetireVersion"
# Scaling down is the way back to a clean cluster: it never gives up (30 s between attempts at most).
_ALWAYS = RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=["ValidationError"])
_KUBE_CALL = timedelta(seconds=60)


@workflow.defn(name=WORKFLOW_TYPE)
class RetireVersion:
    @workflow.run
    async def run(self, input: RetireInput) -> str:
        ref = DeploymentRef.from_name(input.deployment)
        workflow.set_current_details(
            f"{input.version} of {input.deployment} scales to 0 after {input.delay_seconds:.0f}s ({input.reason})"
        )
        await workflow.sleep(input.delay_seconds, summary=f"keep {input.version} warm for a fast way back")
        state = await workflow.execute_activity_method(
            RolloutActivities.describe_deployment,
            ref,
            start_to_close_timeout=_KUBE_CALL,
            retry_policy=_ALWAYS,
            summary=f"describe {input.deployment}: does {input.version} carry traffic again?",
        )
        current = next((v for v in state.versions if v.version == input.version), None)
        if current is None:
            return f"{input.version} is gone from {input.deployment}: nothing to scale down"
        if current.route_weight > 0:
            return f"{input.version} carries {current.route_weight} % of {input.deployment} again: left as it is"
        await workflow.execute_activity_method(
            RolloutActivities.scale_version,
            ScaleVersionInput(deployment=ref, version=input.version, replicas=0),
            start_to_close_timeout=_KUBE_CALL,
            retry_policy=_ALWAYS,
            summary=f"scale {input.version} to 0",
        )
        return f"{input.version} scaled to 0 ({input.reason})"
