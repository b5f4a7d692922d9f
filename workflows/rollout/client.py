"""The client side of ModelRollout: start one as the CLI and the demo do (one rollout per
deployment, its search attributes and the web UI's summary and details set at start), and read
its RolloutResult back whether it promoted or failed with a rollback or an abort."""

from __future__ import annotations

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError

from workflows.core.naming import TASK_QUEUE, rollout_workflow_id
from workflows.core.search_attributes import DEPLOYMENT, MODEL, VERSION
from workflows.rollout.types import RolloutInput, RolloutResult
from workflows.rollout.workflow import FAILED_OUTCOMES, ModelRollout


async def start_rollout(client: Client, input: RolloutInput, *, task_queue: str = TASK_QUEUE) -> WorkflowHandle:
    """Start a rollout; raises WorkflowAlreadyStartedError while one runs for the same deployment."""
    return await client.start_workflow(
        ModelRollout.run,
        input,
        id=rollout_workflow_id(input.deployment),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(DEPLOYMENT, input.deployment),
                SearchAttributePair(MODEL, input.model),
                SearchAttributePair(VERSION, input.version),
            ]
        ),
        static_summary=static_summary(input),
        static_details=static_details(input),
    )


async def rollout_result(handle: WorkflowHandle) -> RolloutResult:
    """Wait for a rollout's end and return its RolloutResult, promoted or not: a rolled-back or
    aborted run fails with its result in the error's details (runs from before the
    ``outcome-in-status`` patch completed with it). Any other failure is raised."""
    try:
        value = await closed_result(handle)
    except WorkflowFailureError as err:
        if (found := result_of_failure(err)) is None:
            raise
        return found
    return value if isinstance(value, RolloutResult) else RolloutResult.model_validate(value)


async def closed_result(handle: WorkflowHandle):
    """``handle.result()``, polling again when a history long poll ends before the run does."""
    while True:
        try:
            return await handle.result()
        except RuntimeError as err:
            if str(err) != NO_CLOSE_EVENT:
                raise


# What the SDK raises when a history long poll ends without the close event and without a next
# page token, as Temporal's time-skipping test server answers a poll that timed out (the real
# server sends a token; temporalio/sdk-dotnet#63 fixed the same in .NET's SDK).
NO_CLOSE_EVENT = "No completion event found"


def result_of_failure(err: WorkflowFailureError) -> RolloutResult | None:
    """The RolloutResult a rolled-back or aborted run failed with; None for any other failure."""
    failure = err.cause
    if isinstance(failure, ApplicationError) and failure.type in FAILED_OUTCOMES.values() and failure.details:
        detail = failure.details[0]
        return detail if isinstance(detail, RolloutResult) else RolloutResult.model_validate(detail)
    return None


def static_summary(input: RolloutInput) -> str:
    """The line the web UI's workflow list shows for a rollout (``--static-summary`` of the CLI)."""
    return f"Roll out {input.model} {input.version} to {input.deployment}"


def static_details(input: RolloutInput) -> str:
    """What a rollout was asked to do, shown above its current details (``--static-details``)."""
    ladder = " → ".join(f"{s.weight} %" + (f" ({s.window_seconds:.0f}s)" if s.weight < 100 else "") for s in input.steps)
    source = input.weights_uri or "the model registry"
    return (
        f"model {input.model}, version {input.version}, deployment {input.deployment}\n\n"
        f"ladder {ladder}, gate every {input.gate_interval_seconds:.0f}s\n\n"
        f"image {input.image}, weights from {source}"
    )
