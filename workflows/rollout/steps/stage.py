"""Stage: the version's weights into the model cache that serving pods mount (downloaded and
verified against their SHA-256, resumably) and, when the input asks (``prestage``), onto every
node cache of the pool, peer to peer, before the version starts. Composes the node cache."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from workflows.core.versions import WeightFile
from workflows.node_cache.contract import NodeCacheActivities, StartNodeCacheInput
from workflows.rollout import registry_records
from workflows.rollout.actions import act, checkpoint, set_stage, show
from workflows.rollout.contract import RolloutActivities, StageWeightsInput
from workflows.rollout.patches import PRESTAGE_PATCH
from workflows.rollout.run_state import RunState
from workflows.rollout.types import Stage


async def into_model_cache(state: RunState) -> list[WeightFile]:
    """Stage the weights (named by the input, or resolved in the registry); the files staged."""
    inp = state.input
    files = await registry_records.weight_files(state)
    set_stage(state, Stage.STAGING)
    state.staged = await act(
        state,
        RolloutActivities.stage_weights,
        StageWeightsInput(model=inp.model, version=inp.version, files=files, image=inp.image, report_progress=True),
        summary=staging_summary(inp.model, inp.version, files),
        schedule_to_close=inp.deadlines.stage_weights_seconds,
        heartbeat=60,
    )
    return files


def staging_summary(model: str, version: str, files: list[WeightFile]) -> str:
    """The activity's summary in the web UI: what is staged from where (bytes, rate and ETA follow
    in the current details and the heartbeat)."""
    folders = {f.uri.rsplit("/", 1)[0] for f in files}
    where = folders.pop() if len(folders) == 1 else "S3"
    return f"stage {model} {version}: {len(files)} weight file(s) from {where}, verifying SHA-256 (progress in the current details)"


async def onto_node_caches(state: RunState, files: list[WeightFile]) -> bool:
    """When asked: stage onto every node of the pool (one Job each, peers sharing chunks) and go on
    once ``min_nodes`` hold the version; the others finish behind. Fewer by the deadline, or too many
    failed to reach it, fails the rollout before the cluster's serving objects change. True when
    the version was staged onto the nodes (its pods then read it from their node's cache)."""
    inp, spec = state.input, state.input.prestage
    if spec is None or not workflow.patched(PRESTAGE_PATCH):
        return False
    req = StartNodeCacheInput(
        namespace=state.ref.namespace,
        model=inp.model, version=inp.version, files=files, pool=spec.pool, run_id=workflow.info().run_id,
        image=inp.image,
    )
    status = await act(
        state,
        NodeCacheActivities.start_node_staging,
        req,
        summary=f"start staging {inp.model} {inp.version} onto the nodes of {spec.pool or 'the GPU pools'}",
    )
    deadline = workflow.now() + timedelta(seconds=spec.timeout_seconds)
    while True:
        state.nodes = status.nodes
        wanted = min(spec.min_nodes, len(status.nodes))
        staged, failed = status.count("staged"), status.count("failed")
        show(state, f"pre-staging: {staged} of {len(status.nodes)} node(s) staged, {wanted} needed")
        if staged >= wanted:
            break
        if len(status.nodes) - failed < wanted:
            raise ApplicationError(
                f"pre-staging: {failed} of {len(status.nodes)} node(s) failed, {wanted} needed: "
                + "; ".join(f"{n.node}: {n.message}" for n in status.nodes if n.state == "failed"),
                type="PrestageFailed",
                non_retryable=True,
            )
        if workflow.now() >= deadline:
            raise ApplicationError(
                f"pre-staging: {staged} of {wanted} node(s) staged after {spec.timeout_seconds:.0f}s",
                type="PrestageFailed",
                non_retryable=True,
            )
        await workflow.sleep(spec.poll_seconds, summary="wait for the nodes' staging")
        status = await act(
            state, NodeCacheActivities.node_staging_status, req, summary="read the nodes' staging", read_only=True
        )
    await checkpoint(state)
    return True
