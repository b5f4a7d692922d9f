"""Start: describe what the deployment runs, refuse what must not be rolled out (the stable version
again, another model without ``replace_model``), then start the new version beside the stable one
at its first canary share (carrying the stable's LoRA adapters when it is the same model) and add
it to the route at 0 %."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from workflows.core.lora import lora_modules, with_lora_modules
from workflows.core.versions import DeploymentState, WeightFile
from workflows.rollout.actions import act, route, set_stage
from workflows.rollout.contract import EnsureVersionInput, RolloutActivities
from workflows.rollout.patches import ADAPTERS_PATCH
from workflows.rollout.run_state import RunState
from workflows.rollout.types import Stage


async def describe(state: RunState) -> DeploymentState:
    """What the deployment runs now; the stable version and the promoted size follow from it."""
    inp = state.input
    set_stage(state, Stage.STARTING)
    cluster = await act(
        state, RolloutActivities.describe_deployment, state.ref, summary=f"describe {inp.deployment}", read_only=True
    )
    state.stable = stable = cluster.stable
    if stable is not None and stable.version == inp.version:
        raise ApplicationError(
            f"version {inp.version} is already the stable version of {inp.deployment}",
            type="NothingToRollOut",
            non_retryable=True,
        )
    if stable is not None and stable.model not in ("", inp.model) and not inp.replace_model:
        raise ApplicationError(
            f"replace_model: {inp.deployment} serves model {stable.model} ({stable.version}), not"
            f" {inp.model}; set replace_model: true to replace it",
            type="ModelReplaced",
            non_retryable=True,
        )
    state.target_replicas = inp.replicas or (stable.replicas if stable else 1)
    return cluster


async def start_version(state: RunState, files: list[WeightFile], prestaged: bool) -> int:
    """The new version's Deployment and Service, and its place in the route; its replicas."""
    inp, stable = state.input, state.stable
    ladder = [s for s in inp.steps if s.weight < 100]
    first = state.target_replicas if stable is None or not ladder else state.share(ladder[0].weight)
    args = _carry_adapters(state)
    state.cluster_changed = True
    await act(
        state,
        RolloutActivities.ensure_version,
        EnsureVersionInput(
            deployment=state.ref,
            model=inp.model,
            version=inp.version,
            image=inp.image,
            gpus_per_replica=inp.gpus_per_replica,
            gpu_memory_utilization=inp.gpu_memory_utilization,
            replicas=first,
            weights_path=state.staged.path,
            port=inp.port,
            args=args,
            env=inp.env,
            priority_class=inp.priority_class,
            owner=workflow.info().workflow_id,
            node_cache_files=files if prestaged else [],
        ),
        summary=f"start {inp.version} beside {stable.version if stable else 'nothing'}: {first} replica(s)",
        interruptible=False,
    )
    state.canary_replicas = first
    if stable is not None:
        await route(state, {stable.version: 100, inp.version: 0}, "add the new version to the route at 0 %")
    return first


def _carry_adapters(state: RunState) -> list[str]:
    """The new version's args: with the LoRA adapters the stable version's pods load at start
    (its ``--lora-modules``) when it is the same model, so promotion can move their rules to it;
    another model takes none (its adapters' rules are removed at promotion)."""
    inp, stable = state.input, state.stable
    if stable is None or not stable.lora_modules or not workflow.patched(ADAPTERS_PATCH):
        return inp.args
    if stable.model not in ("", inp.model):
        state.adapters = {}
        return inp.args
    state.adapters = {**stable.lora_modules, **lora_modules(inp.args)}
    if "--enable-lora" not in inp.args:
        raise ApplicationError(
            f"args: {inp.deployment} {stable.version} serves LoRA adapters ({', '.join(sorted(stable.lora_modules))}):"
            f" add --enable-lora to carry them to {inp.version}",
            type="LoraNotEnabled", non_retryable=True,
        )
    return with_lora_modules(inp.args, state.adapters)
