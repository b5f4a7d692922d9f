"""ModelRollout: stage weights, start the new version beside the stable one, warm it up, shift
traffic along a canary ladder gated by Prometheus, then promote, or roll back on its own.

API (stable; the README shows the CLI lines):
  workflow type ``ModelRollout``, task queue ``tideplane``, workflow ID
  ``naming.rollout_workflow_id(deployment)`` = ``rollout/<namespace>/<name>`` (one rollout per
  deployment: start it with ``start_rollout`` or ``temporal workflow start --fail-existing``);
  signals ``pause`` (PauseInput), ``resume`` (ResumeInput), ``abort`` (AbortInput);
  update ``promote`` (PromoteInput, refused when there is nothing to promote);
  query ``status`` -> RolloutStatus; result RolloutResult.

Order inside a canary step: scale the canary up to carry its share and wait until it is Ready,
*then* move the route weight, so traffic never lands on capacity that is not there yet. On the
way back the route moves first (stable was kept at full size throughout), and the canary is
scaled down only after ``scale_down_delay_seconds``, warm for a retry.

The result comes when traffic has moved: the version left without traffic (the old stable after a
promotion, the canary after a rollback) is scaled down by a RetireVersion workflow
``rollout/<ns>/<name>/retire/<version>`` (workflows/rollout/retire.py) that this run starts and
does not wait for, so the next rollout of the deployment can start at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any, Callable

from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import (
    RetryPolicy,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    # Full dotted names: inside the sandbox ``from workflows import x`` would re-import x (the
    # sandboxed ``workflows`` package lacks it), giving pydantic classes that differ from the real ones.
    from workflows.rollout.gates import Decision, StepAnalysis, Verdict, canary_replicas, evaluate, required_passes
    from workflows.core.naming import MODEL_ROLLOUT_WORKFLOW, TASK_QUEUE, rollout_workflow_id
    from workflows.registry.schema import BenchmarkResult
    from workflows.core.versions import Canary, Deprecated, Stable, Testing
    from workflows.quality.contract import GoldenSetInput, QualityActivities
    from workflows.registry.contract import (
        RecordRegistryBenchmarkInput,
        RegistryActivities,
        RegistryWeightsInput,
        SetRegistryStatusInput,
    )
    from workflows.rollout.batching import SweepChoice, choose_setting
    from workflows.core.batching_settings import SweepRecord
    from workflows.core.naming import DEPLOYMENT_OWNED
    from workflows.rollout.contract import (
        BatchingActivities,
        Benchmark,
        CancelRetireInput,
        EngineArgsInput,
        EnsureVersionInput,
        GateQueriesInput,
        RetireInput,
        RetireScheduling,
        RolloutActivities,
        MoveAdapterRulesInput,
        RouteMirror,
        RouteWeightsInput,
        ScaleVersionInput,
        StagedWeights,
        StageWeightsInput,
        SweepBatchingInput,
        WaitReadyInput,
        WarmUpInput,
        retire_workflow_id,
    )
    from workflows.core.versions import (
        DeploymentState,
        VersionInfo,
        WeightFile,
    )
    from workflows.quality.contract import (
        GoldenRunInput,
        ShadowPairsInput,
    )
    from workflows.core.verdicts import GoldenVerdict
    from workflows.quality.shadow import (
        ShadowPair,
        ShadowVerdict,
        describe_pair,
        shadow_verdict,
    )
    from workflows.quality.golden_set import golden_verdict
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
    from workflows.node_cache.contract import NodeCacheProgress, NodeCacheActivities, StartNodeCacheInput

    from workflows.core.lora import lora_modules, with_lora_modules
    from workflows.core.search_attributes import CANARY_PERCENT, DEPLOYMENT, MODEL, STAGE, VERSION
    from workflows.core.failures import cause, validated
    from workflows.core.waiting import wait_until
    from workflows.core.telemetry import (
        LEGACY_GATE_VERDICT,
        LEGACY_ROLLOUT,
        METER_PATCH,
        gate_verdict,
        rollout_finished,
        rollout_paused,
    )

# Runs from before this patch kept the rollout open for the scale-down delay; newer ones end when
# traffic has moved and leave the delayed scale-down to a RetireVersion workflow (rollout/retire.py).
RETIRE_PATCH = "retire-after-promotion"
# Runs from before the quality gates (issue 21) never read a golden set at warm-up.
GOLDEN_PATCH = "golden-gate"
# Runs from before batching was tuned at warm-up (issue 19) never swept; asked only when a run has `batching`.
BATCHING_PATCH = "batching-sweep"
# Runs from before pre-staging (issue 18) never staged onto nodes.
PRESTAGE_PATCH = "prestage-nodes"
# Runs from before LoRA adapters followed the base (issue 18) never carried --lora-modules nor moved
# adapter rules; asked only when the stable version's pods load adapters at start.
ADAPTERS_PATCH = "carry-lora-adapters"
# Runs from before this patch left a version whose golden set or shadow comparison failed in
# `testing` (a warm-up failure) or `testing` again (a shadow drift), free to be rolled out again.
QUALITY_DEPRECATES_PATCH = "quality-failure-deprecates"
SHADOW_KEEP = 2000  # mirrored pairs kept in memory for one window's comparison
VERDICT_HISTORY = 50  # kept in memory for the status query, not in history
PAUSE_TICK = 3600.0  # seconds between wake-ups of a paused rollout

# Forward steps give up after a few attempts (the rollout then rolls back); the way back never does.
_FORWARD = RetryPolicy(
    maximum_attempts=5, maximum_interval=timedelta(seconds=30), non_retryable_error_types=["ValidationError"]
)
_BACK = RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=["ValidationError"])
# A gate measurement is retried briefly; after that it counts as a metric error, not a verdict.
_GATES = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5), maximum_attempts=3)
_KUBE_CALL = timedelta(seconds=60)
# Runs started before metrics moved onto the workflow metric meter replay the record_* activities
# they scheduled; those were best effort: a missing or failing recorder never held up a rollout.
_BEST_EFFORT = RetryPolicy(maximum_attempts=3, non_retryable_error_types=["NotFoundError", "ValidationError"])


_FINISHING = (Stage.PROMOTED, Stage.ROLLING_BACK, Stage.ROLLED_BACK)


class _Abort(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _RollBack(Exception):
    """``verdict``: the canary gate that failed; ``quality``: the golden set or the shadow
    comparison failed. Either says the version is wrong, not the attempt: it is deprecated."""

    def __init__(self, reason: str, verdict: VerdictRecord | None = None, quality: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.verdict = verdict
        self.quality = quality


async def _shielded(cleanup: Coroutine[Any, Any, RolloutResult]) -> RolloutResult:
    """Run a rollback to its end even when the workflow is cancelled meanwhile (then re-raise)."""
    task = asyncio.ensure_future(cleanup)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def _owned_elsewhere(err: ActivityError) -> bool:
    """Another rollout owns the deployment: nothing of ours is in the cluster to roll back."""
    return isinstance(err.cause, ApplicationError) and err.cause.type == DEPLOYMENT_OWNED


async def _stop(task: asyncio.Future) -> None:
    """Cancel an activity and wait until it stopped (or was abandoned)."""
    task.cancel()
    with suppress(asyncio.CancelledError, ActivityError):
        await task


@workflow.defn(name=MODEL_ROLLOUT_WORKFLOW, failure_exception_types=[ValidationError])
class ModelRollout:
    """One rollout of one version to one logical deployment. ValidationError fails the run (a bad
    input is reported with its field at once instead of retrying the workflow task forever)."""

    @workflow.init
    def __init__(self, input: RolloutInput) -> None:
        self._in = input
        self._ref = input.ref
        self._stage = Stage.RESOLVING if input.weights_uri is None else Stage.STAGING
        self._stage_since = workflow.now()
        self._weight = 0
        self._max_weight = 0
        self._step: int | None = None
        self._stable: VersionInfo | None = None
        self._target_replicas = input.replicas or 1
        self._canary_replicas = 0
        self._paused = False
        self._pause_reason: str | None = None
        self._abort_reason: str | None = None
        self._promote: PromoteInput | None = None
        self._analysis = StepAnalysis()
        self._verdicts: list[VerdictRecord] = []
        self._verdict_count = 0  # all observations, the bounded list keeps the latest
        self._timings: dict[str, float] = {}
        self._cluster_changed = False
        self._in_flight: asyncio.Future | None = None
        self._staged: StagedWeights | None = None
        self._benchmark: Benchmark | None = None
        self._cold_start: float | None = None
        self._registry = input.weights_uri is None  # weights came from the registry: keep its status current
        self._canary_since: datetime | None = None
        self._telemetry: list[asyncio.Future] = []
        self._ended_in: str | None = None  # stage label where a rollback started
        self._golden: GoldenVerdict | None = None
        self._shadow: ShadowVerdict | None = None
        self._batching: SweepChoice | None = None
        self._sweep: SweepRecord | None = None
        self._mirror: RouteMirror | None = None  # set once the shadow comparison starts
        self._shadow_after = 0  # last mirrored pair read
        self._shadow_pairs: list[ShadowPair] = []  # the current window's pairs
        self._shadow_passed = False  # some window's comparison passed
        self._nodes: list[NodeCacheProgress] = []  # pre-staging progress per node
        self._adapters: dict[str, str] | None = None  # None: no adapter to carry; else those carried to this version

    @workflow.run
    async def run(self, input: RolloutInput) -> RolloutResult:
        workflow.upsert_search_attributes(
            [
                DEPLOYMENT.value_set(input.deployment),
                MODEL.value_set(input.model),
                VERSION.value_set(input.version),
                STAGE.value_set(self._stage.value),
                CANARY_PERCENT.value_set(0),
            ]
        )
        self._show()
        result = await self._run()
        self._record_rollout(result.outcome.value, self._ended_in or self._stage.value, result.route_reverted_seconds)
        await asyncio.gather(*self._telemetry, return_exceptions=True)
        return result

    async def _run(self) -> RolloutResult:
        try:
            return await self._rollout()
        except _Abort as abort:
            back = self._roll_back(Outcome.ABORTED, abort.reason)
        except _RollBack as failed:
            back = self._roll_back(Outcome.ROLLED_BACK, failed.reason, failed.verdict, failed.quality)
        except ActivityError as err:
            if not self._cluster_changed or _owned_elsewhere(err):
                raise ApplicationError(
                    f"{err.activity_type} failed before any cluster change: {cause(err)}",
                    type="RolloutFailed",
                    non_retryable=True,
                ) from err
            back = self._roll_back(Outcome.ROLLED_BACK, f"{err.activity_type} failed: {cause(err)}")
        except asyncio.CancelledError:
            if self._stage not in (Stage.PROMOTED, Stage.ROLLED_BACK):
                await _shielded(self._roll_back(Outcome.ABORTED, "workflow cancelled"))
            raise
        return await _shielded(back)

    # ---- operator controls -------------------------------------------------------------------

    @workflow.signal
    def pause(self, input: PauseInput | None = None) -> None:
        if self._stage in _FINISHING:
            workflow.logger.info("pause ignored: rollout is %s", self._stage.value)
            return
        self._paused = True
        self._pause_reason = (input or PauseInput()).reason
        self._show()

    @workflow.signal
    def resume(self, input: ResumeInput | None = None) -> None:
        self._paused = False

    @workflow.signal
    def abort(self, input: AbortInput | None = None) -> None:
        """Roll back now; ignored once traffic is fully on the new version or already going back."""
        if self._stage in _FINISHING:
            workflow.logger.info("abort ignored: rollout is %s", self._stage.value)
        elif self._abort_reason is None:
            self._abort_reason = (input or AbortInput()).reason

    # The input arrives as plain JSON and is validated here, so a bad field is refused naming it
    # (non-retryable), not as the converter's raw ValidationError marked retryable (issue 16).
    @workflow.update
    def promote(self, input: dict[str, Any] | None = None) -> PromoteAck:
        promote = validated(PromoteInput, input, "promote")
        self._promote = promote
        what = "skip to 100 %" if promote.full else "end the current step"
        return PromoteAck(accepted=f"promote accepted: {what}", weight=self._weight)

    @promote.validator
    def _promote_allowed(self, input: dict[str, Any] | None = None) -> None:
        promote = validated(PromoteInput, input, "promote")
        if self._step is None or self._stage not in (Stage.CANARY, Stage.PAUSED):
            raise ValueError(f"nothing to promote: rollout is in stage {self._stage.value}, not in the canary ladder")
        if self._abort_reason is not None:
            raise ValueError("nothing to promote: the rollout is being aborted")
        if self._paused and not promote.force:  # a pause is a human's hold: promote must not clear it silently
            raise ApplicationError(
                f"force: the rollout is paused ({self._pause_reason}); promote with"
                ' {"force": true} to end the pause and promote, or signal resume',
                type="RolloutPaused",
                non_retryable=True,
            )
        if self._promote is not None and (self._promote.full or not promote.full):
            raise ValueError("a promote is already pending")

    @workflow.query
    def status(self) -> RolloutStatus:
        return RolloutStatus(
            deployment=self._in.deployment,
            version=self._in.version,
            stable_version=self._stable.version if self._stable else None,
            stage=self._stage,
            weight=self._weight,
            step=self._step,
            steps=[s.weight for s in self._in.steps],
            paused=self._paused,
            pause_reason=self._pause_reason if self._paused else None,
            analysis=self._analysis,
            last_verdict=self._verdicts[-1] if self._verdicts else None,
            verdicts=self._verdicts,
            timings=self._all_timings(),
            golden=self._golden,
            shadow=self._shadow,
            batching=self._batching,
            nodes=self._nodes,
        )

    # ---- the stages --------------------------------------------------------------------------

    async def _rollout(self) -> RolloutResult:
        inp = self._in
        files = await self._weight_files()
        self._set_stage(Stage.STAGING)
        self._staged = await self._act(
            RolloutActivities.stage_weights,
            StageWeightsInput(model=inp.model, version=inp.version, files=files, image=inp.image),
            summary=f"stage {len(files)} weight file(s) of {inp.model} {inp.version} from S3, verifying SHA-256",
            schedule_to_close=inp.deadlines.stage_weights_seconds,
            heartbeat=60,
        )
        await self._checkpoint()
        prestaged = inp.prestage is not None and workflow.patched(PRESTAGE_PATCH)
        if prestaged:
            await self._prestage(files)
            await self._checkpoint()

        self._set_stage(Stage.STARTING)
        state = await self._act(
            RolloutActivities.describe_deployment, self._ref, summary=f"describe {inp.deployment}", read_only=True
        )
        self._stable = state.stable
        if self._stable is not None and self._stable.version == inp.version:
            raise ApplicationError(
                f"version {inp.version} is already the stable version of {inp.deployment}",
                type="NothingToRollOut",
                non_retryable=True,
            )
        if self._stable is not None and self._stable.model not in ("", inp.model) and not inp.replace_model:
            raise ApplicationError(
                f"replace_model: {inp.deployment} serves model {self._stable.model} ({self._stable.version}), not"
                f" {inp.model}; set replace_model: true to replace it",
                type="ModelReplaced",
                non_retryable=True,
            )
        self._target_replicas = inp.replicas or (self._stable.replicas if self._stable else 1)
        ladder = [s for s in inp.steps if s.weight < 100]
        first = self._target_replicas if self._stable is None or not ladder else self._share(ladder[0].weight)
        await self._checkpoint()
        await self._cancel_pending_retire(state)
        args = self._carry_adapters()
        self._cluster_changed = True
        await self._act(
            RolloutActivities.ensure_version,
            EnsureVersionInput(
                deployment=self._ref,
                model=inp.model,
                version=inp.version,
                image=inp.image,
                gpus_per_replica=inp.gpus_per_replica,
                gpu_memory_utilization=inp.gpu_memory_utilization,
                replicas=first,
                weights_path=self._staged.path,
                port=inp.port,
                args=args,
                env=inp.env,
                priority_class=inp.priority_class,
                owner=workflow.info().workflow_id,
                node_cache_files=files if prestaged else [],
            ),
            summary=f"start {inp.version} beside {self._stable.version if self._stable else 'nothing'}: {first} replica(s)",
            interruptible=False,
        )
        self._canary_replicas = first
        if self._stable is not None:
            await self._route({self._stable.version: 100, inp.version: 0}, "add the new version to the route at 0 %")

        self._set_stage(Stage.WARMING_UP)
        await self._warm_up(first)
        await self._tune_batching()
        if self._registry and self._benchmark is not None:
            await self._registry_write(
                RegistryActivities.record_registry_benchmark,
                RecordRegistryBenchmarkInput(
                    model=inp.model,
                    version=inp.version,
                    benchmark=BenchmarkResult(
                        tokens_per_second=self._benchmark.tokens_per_second,
                        p50_latency_seconds=self._benchmark.p50_latency_seconds,
                        p99_latency_seconds=self._benchmark.p99_latency_seconds,
                        dataset="warm-up",
                        measured_at=workflow.now(),
                        requests=self._benchmark.requests,
                        errors=self._benchmark.errors,
                        image=inp.image,
                        deployment=inp.deployment,
                        batching=self._sweep,
                    ),
                ),
                "record the warm-up benchmark in the registry",
            )
        await self._quality_gates_at_warm_up()
        await self._checkpoint()

        if self._stable is None:
            await self._route({inp.version: 100}, f"first deploy: route 100 % to {inp.version}", release=True)
            self._set_stage(Stage.PROMOTED)
            await self._registry_status(Stable(since=workflow.now()), "first deploy")
            return self._result(Outcome.PROMOTED, "first deploy: no stable version, promoted after warm-up")

        self._set_stage(Stage.CANARY)
        for index, step in enumerate(inp.steps):
            if step.weight == 100 or (self._promote is not None and self._promote.full):
                break
            self._step = index
            self._show()
            await self._shift(step.weight)
            await self._observe(step.weight, step.window_seconds)
        await self._shadow_before_promotion()
        return await self._promote_new()

    def _carry_adapters(self) -> list[str]:
        """The new version's args: with the LoRA adapters the stable version's pods load at start
        (its ``--lora-modules``) when it is the same model, so promotion can move their rules to it;
        another model takes none (its adapters' rules are removed at promotion)."""
        inp, stable = self._in, self._stable
        if stable is None or not stable.lora_modules or not workflow.patched(ADAPTERS_PATCH):
            return inp.args
        if stable.model not in ("", inp.model):
            self._adapters = {}
            return inp.args
        self._adapters = {**stable.lora_modules, **lora_modules(inp.args)}
        if "--enable-lora" not in inp.args:
            raise ApplicationError(
                f"args: {inp.deployment} {stable.version} serves LoRA adapters ({', '.join(sorted(stable.lora_modules))}):"
                f" add --enable-lora to carry them to {inp.version}",
                type="LoraNotEnabled", non_retryable=True,
            )
        return with_lora_modules(inp.args, self._adapters)

    async def _move_adapter_rules(self, from_version: str, to_version: str | None) -> None:
        """The adapters' rules follow the base (None: removed); runs to its end, as a route change does."""
        await self._act(
            RolloutActivities.move_adapter_rules,
            MoveAdapterRulesInput(deployment=self._ref, from_version=from_version, to_version=to_version),
            summary=f"adapter rules: from {from_version} to {to_version or 'nothing (another model)'}",
            retry=_BACK,
            interruptible=False,
        )

    async def _weight_files(self) -> list[WeightFile]:
        inp = self._in
        if inp.weights_uri is not None and inp.sha256 is not None:
            return [WeightFile(uri=inp.weights_uri, sha256=inp.sha256)]
        resolved = await self._act(
            RegistryActivities.resolve_registry_weights,
            RegistryWeightsInput(model=inp.model, version=inp.version),
            summary=f"look up {inp.model} {inp.version} in the model registry",
            # NotFoundError: no worker implements the registry lookup; say so instead of retrying
            retry=RetryPolicy(maximum_attempts=5, non_retryable_error_types=["NotFoundError", "ValidationError"]),
            read_only=True,
        )
        return resolved.files

    async def _warm_up(self, replicas: int) -> None:
        """Wait for Ready and send warm-up requests, both inside the warm-up deadline."""
        inp = self._in
        deadline = workflow.now() + timedelta(seconds=inp.warm_up.deadline_seconds)
        try:
            ready = await self._act(
                RolloutActivities.wait_ready,
                WaitReadyInput(deployment=self._ref, version=inp.version, replicas=replicas),
                summary=f"wait for {replicas} replica(s) of {inp.version} to be Ready (cold start)",
                schedule_to_close=(deadline - workflow.now()).total_seconds(),
                heartbeat=30,
            )
            self._cold_start = ready.seconds
            self._benchmark = await self._act(
                RolloutActivities.warm_up,
                WarmUpInput(
                    deployment=self._ref,
                    version=inp.version,
                    model=inp.model,
                    requests=inp.warm_up.requests,
                    max_tokens=inp.warm_up.max_tokens,
                    prompt=inp.warm_up.prompt,
                    max_error_rate=inp.warm_up.max_error_rate,
                ),
                summary=f"warm up {inp.version} with {inp.warm_up.requests} requests and benchmark it",
                schedule_to_close=max(1.0, (deadline - workflow.now()).total_seconds()),
                heartbeat=30,
            )
        except ActivityError as err:
            raise _RollBack(
                f"warm-up did not finish within {inp.warm_up.deadline_seconds:.0f}s: {cause(err)}"
            ) from err
        if self._benchmark.errors >= self._benchmark.requests:
            raise _RollBack(f"warm-up: all {self._benchmark.requests} requests to {inp.version} failed")

    async def _tune_batching(self) -> None:
        """Measure each batching setting on the new replicas before they see users, keep the
        highest throughput within the TTFT/TPOT SLO (workflows/rollout/batching.py) in the
        Deployment's engine args; the sweep goes to the registry with the warm-up benchmark."""
        inp = self._in
        sweep_in = inp.batching
        if sweep_in is None or not workflow.patched(BATCHING_PATCH):
            return
        try:
            sweep = await self._act(
                BatchingActivities.sweep_batching,
                SweepBatchingInput(
                    deployment=self._ref,
                    version=inp.version,
                    model=inp.model,
                    candidates=sweep_in.candidates,
                    requests=sweep_in.requests,
                    concurrency=sweep_in.concurrency,
                    prompt_tokens=sweep_in.prompt_tokens,
                    output_tokens=sweep_in.output_tokens,
                ),
                summary=f"batching sweep of {inp.version}: {len(sweep_in.candidates)} settings, {sweep_in.requests} requests each",
                schedule_to_close=sweep_in.deadline_seconds,
                heartbeat=120,
            )
            choice = choose_setting(sweep.points, sweep_in.ttft_slo_seconds, sweep_in.tpot_slo_seconds)
            await self._act(
                BatchingActivities.set_engine_args,
                EngineArgsInput(deployment=self._ref, version=inp.version, setting=choice.setting),
                summary=f"keep {choice.setting.label()} in {inp.version}'s engine args",
                schedule_to_close=inp.deadlines.step_ready_seconds,
                heartbeat=60,
            )
        except ActivityError as err:
            raise _RollBack(f"batching sweep failed: {cause(err)}") from err
        self._batching = choice
        self._sweep = SweepRecord(
            ttft_slo_seconds=sweep_in.ttft_slo_seconds,
            tpot_slo_seconds=sweep_in.tpot_slo_seconds,
            prompt_tokens=sweep.prompt_tokens,
            output_tokens=sweep.output_tokens,
            points=sweep.points,
            chosen=choice.setting,
            reason=choice.reason,
        )
        self._show(f"batching: {choice.reason}")

    async def _shift(self, weight: int) -> None:
        """Scale the canary to carry ``weight`` %, wait until Ready, then move the route."""
        inp = self._in
        stable = self._stable
        assert stable is not None
        replicas = self._share(weight)
        if replicas != self._canary_replicas:
            await self._scale(inp.version, replicas, f"scale {inp.version} to {replicas} replica(s) for {weight} %")
            try:
                await self._act(
                    RolloutActivities.wait_ready,
                    WaitReadyInput(deployment=self._ref, version=inp.version, replicas=replicas),
                    summary=f"wait for {replicas} replica(s) of {inp.version} to be Ready",
                    schedule_to_close=inp.deadlines.step_ready_seconds,
                    heartbeat=30,
                )
            except ActivityError as err:
                raise _RollBack(f"canary not Ready for {weight} %: {cause(err)}") from err
        await self._route({stable.version: 100 - weight, inp.version: weight}, f"route {weight} % to {inp.version}")
        self._canary_since = self._canary_since or workflow.now()
        await self._registry_status(Canary(percent=weight, since=self._canary_since), f"canary at {weight} %")

    async def _observe(self, weight: int, window_seconds: float) -> None:
        """Gate the current step until its window passes (or a human or a verdict ends it)."""
        inp = self._in
        self._analysis = StepAnalysis()
        started = workflow.now()
        need = required_passes(window_seconds, inp.gate_interval_seconds)
        while True:
            await wait_until(
                lambda: self._paused or self._promote is not None or self._abort_reason is not None,
                timedelta(seconds=inp.gate_interval_seconds),
                f"next gate check at {weight} %",
            )
            await self._checkpoint()
            if self._promote is not None:
                if not self._promote.full:
                    self._promote = None
                return
            record = await self._measure(weight)
            await self._shadow_gate(weight)
            decision = self._analysis.record(record.evaluation, inp.analysis)
            self._show()  # every verdict, with its numbers and counts, in the UI's current details
            if record.evaluation.verdict is not Verdict.ERROR:  # errors are counted by the query activity
                self._record_verdict(record.evaluation.verdict.value, record.evaluation.deciding_gate)
            if decision is Decision.ROLLBACK:
                raise _RollBack(f"gate failed at {weight} %: {record.evaluation.describe()}", record)
            if decision is not Decision.CONTINUE:
                why = "too few samples" if decision is Decision.PAUSE_INCONCLUSIVE else "metrics unavailable"
                self._paused = True
                self._pause_reason = f"{why} at {weight} % (never promoting blind): {record.evaluation.describe()}"
                await self._checkpoint()
                self._analysis.resumed()
                continue
            elapsed = (workflow.now() - started).total_seconds()
            if self._analysis.complete(elapsed, window_seconds, need):
                return

    async def _measure(self, weight: int) -> VerdictRecord:
        inp = self._in
        assert self._stable is not None
        variables = {
            "namespace": self._ref.namespace,
            "deployment": self._ref.name,
            "model": inp.model,
            "version": inp.version,
            "stable_version": self._stable.version,
            "window": inp.query_window,
        }
        try:
            result = await self._act(
                RolloutActivities.query_gates,
                GateQueriesInput(queries=inp.queries.by_gate(), variables=variables),
                summary=f"gate queries at {weight} %",
                start_to_close=30,
                retry=_GATES,
                read_only=True,
            )
            evaluation = evaluate(result.values, inp.gates)
        except ActivityError as err:
            evaluation = evaluate(None, inp.gates, error=f"gate queries failed: {cause(err)}")
        record = VerdictRecord(at=workflow.now(), weight=weight, evaluation=evaluation)
        self._verdicts = [*self._verdicts[-(VERDICT_HISTORY - 1) :], record]
        self._verdict_count += 1
        return record

    async def _promote_new(self) -> RolloutResult:
        """Re-point traffic (never reload weights): new at full size first, then 100 %, old later."""
        inp = self._in
        stable = self._stable
        assert stable is not None
        self._set_stage(Stage.PROMOTING)
        if self._target_replicas != self._canary_replicas:
            await self._scale(
                inp.version, self._target_replicas, f"scale {inp.version} to stable size {self._target_replicas}"
            )
            try:
                await self._act(
                    RolloutActivities.wait_ready,
                    WaitReadyInput(deployment=self._ref, version=inp.version, replicas=self._target_replicas),
                    summary=f"wait for {self._target_replicas} replica(s) of {inp.version} to be Ready",
                    schedule_to_close=inp.deadlines.step_ready_seconds,
                    heartbeat=30,
                )
            except ActivityError as err:
                raise _RollBack(f"new version not Ready at full size: {cause(err)}") from err
        await self._checkpoint()
        await self._route({stable.version: 0, inp.version: 100}, f"promote: route 100 % to {inp.version}", release=True)
        if self._adapters is not None:
            await self._move_adapter_rules(stable.version, inp.version if self._adapters else None)
        self._set_stage(Stage.PROMOTED)
        await self._registry_status(Stable(since=workflow.now()), f"promoted over {stable.version}")
        if workflow.patched(RETIRE_PATCH):
            retiring = await self._retire(stable.version, f"{inp.version} promoted over it")
            return self._result(Outcome.PROMOTED, f"{inp.version} is stable at 100 %; {retiring}")
        await workflow.sleep(inp.scale_down_delay_seconds, summary=f"keep {stable.version} warm before scaling it down")
        await self._scale(stable.version, 0, f"scale the old version {stable.version} to 0", retry=_BACK)
        return self._result(Outcome.PROMOTED, f"{inp.version} is stable at 100 %")

    async def _roll_back(
        self, outcome: Outcome, reason: str, verdict: VerdictRecord | None = None, quality: bool = False
    ) -> RolloutResult:
        """Route back to stable first, then scale the new version down after the delay."""
        inp = self._in
        reverted: float | None = None
        self._paused = False
        self._ended_in = self._stage_label(self._weight)
        if self._in_flight is not None and not self._in_flight.done():
            with suppress(ActivityError):
                await self._in_flight  # a forward cluster change still running: let it land first
        if self._cluster_changed:
            self._set_stage(Stage.ROLLING_BACK)
            if self._stable is not None:
                await self._route(
                    {self._stable.version: 100, inp.version: 0},
                    f"roll back: route 100 % to {self._stable.version}",
                    _BACK,
                    release=True,
                )
                if verdict is not None:
                    reverted = (workflow.now() - verdict.at).total_seconds()
            self._weight = 0
            self._set_stage(Stage.ROLLED_BACK)
            # a failed gate or quality check: never again; otherwise (aborted, a cluster error) it may be retried
            wrong = verdict is not None or (quality and workflow.patched(QUALITY_DEPRECATES_PATCH))
            if self._canary_since is not None or wrong:
                status = Deprecated(since=workflow.now()) if wrong else Testing()
                await self._registry_status(status, f"rolled back: {reason}")
            if workflow.patched(RETIRE_PATCH):
                await self._retire(inp.version, f"rolled back: {reason}")
            else:
                await workflow.sleep(inp.scale_down_delay_seconds, summary=f"keep {inp.version} warm for a retry")
                await self._scale(inp.version, 0, f"scale {inp.version} to 0", retry=_BACK)
        else:
            self._set_stage(Stage.ROLLED_BACK)
        result = self._result(outcome, reason)
        if verdict is not None:
            result.failing_verdict = verdict
            result.failed_gates = verdict.evaluation.failed
            result.route_reverted_seconds = reverted
        return result

    # ---- quality gates (issue 21; verdicts in workflows/quality/golden_set.py) ------------------------

    async def _quality_gates_at_warm_up(self) -> None:
        """Before any traffic moves: the model's golden set against the new version and stable
        (recorded in the registry with the warm-up benchmark); then, when asked, start mirroring
        live requests to the new version for the shadow comparison."""
        inp = self._in
        if not workflow.patched(GOLDEN_PATCH):
            return
        found = await self._act(
            QualityActivities.read_golden_set,
            GoldenSetInput(model=inp.model),
            summary=f"look up the golden set of {inp.model} in the registry",
            retry=RetryPolicy(maximum_attempts=5, non_retryable_error_types=["NotFoundError", "ValidationError"]),
            read_only=True,
        )
        if found.current is not None:
            golden = found.current.golden
            stable = self._stable.version if self._stable else None
            run = await self._act(
                QualityActivities.run_golden_set,
                GoldenRunInput(deployment=self._ref, model=inp.model, version=inp.version, stable_version=stable, golden=golden),
                summary=f"golden set r{found.current.revision} ({len(golden.cases)} cases) against {inp.version}"
                + (f" and {stable}" if stable else ""),
                schedule_to_close=max(60.0, inp.warm_up.deadline_seconds),
                heartbeat=60,
            )
            self._golden = golden_verdict(golden, run.new, run.stable, found.current.revision)
            self._show()
            if self._registry and self._benchmark is not None:
                b = self._benchmark
                await self._registry_write(
                    RegistryActivities.record_registry_benchmark,
                    RecordRegistryBenchmarkInput(
                        model=inp.model,
                        version=inp.version,
                        benchmark=BenchmarkResult(
                            tokens_per_second=b.tokens_per_second,
                            p50_latency_seconds=b.p50_latency_seconds,
                            p99_latency_seconds=b.p99_latency_seconds,
                            dataset=f"golden set r{found.current.revision}",
                            measured_at=workflow.now(),
                            requests=len(golden.cases),
                            errors=sum(1 for r in run.new if any(f.startswith("request failed") for f in r.failures)),
                            image=inp.image,
                            deployment=inp.deployment,
                            golden=self._golden,
                        ),
                    ),
                    "record the golden-set verdict in the registry",
                )
            if not self._golden.passed:
                raise _RollBack(f"golden set failed at warm-up: {'; '.join(self._golden.reasons)}", quality=True)
        if inp.shadow is not None and self._stable is not None:
            self._mirror = RouteMirror(version=inp.version, percent=inp.shadow.percent)
            await self._route(
                {self._stable.version: 100, inp.version: 0},
                f"mirror {inp.shadow.percent} % of requests to {inp.version} (shadow comparison)",
            )

    async def _shadow_gate(self, weight: int) -> None:
        """Compare the answers mirrored to the canary since the last verdict with stable's; a drift
        past its threshold rolls back with examples, too few pairs keeps collecting."""
        inp = self._in
        if self._mirror is None or inp.shadow is None or self._stable is None:
            return
        try:
            read = await self._act(
                QualityActivities.read_shadow_pairs,
                ShadowPairsInput(
                    deployment=self._ref, version=inp.version, stable_version=self._stable.version, after=self._shadow_after
                ),
                summary=f"shadow pairs of {inp.version} at {weight} %",
                start_to_close=30,
                retry=_GATES,
                read_only=True,
            )
        except ActivityError as err:
            raise _RollBack(f"shadow comparison at {weight} %: {cause(err)}") from err
        self._shadow_after = read.last
        self._shadow_pairs = [*self._shadow_pairs, *read.pairs][-SHADOW_KEEP:]
        verdict = shadow_verdict(self._shadow_pairs, inp.shadow)
        self._shadow = verdict
        self._show()
        if verdict.verdict == "fail":
            examples = "; ".join(describe_pair(p) for p in verdict.examples)
            raise _RollBack(f"shadow comparison failed at {weight} %: {'; '.join(verdict.failed)}; e.g. {examples}", quality=True)
        if verdict.verdict == "pass":
            self._shadow_passed = True
            self._shadow_pairs = []  # the next window is judged on its own pairs

    async def _shadow_before_promotion(self) -> None:
        """Never promote on no shadow evidence: if the comparison never passed (too few mirrored
        pairs in every window), pause for a human — resume promotes without it, abort rolls back.
        A full promote by an operator has decided already."""
        if self._mirror is None or self._shadow_passed or (self._promote is not None and self._promote.full):
            return
        seen = self._shadow.describe() if self._shadow else "no mirrored pairs read"
        self._paused = True
        self._pause_reason = f"shadow comparison never conclusive before promotion ({seen}); resume promotes without it"
        await self._checkpoint()

    def _mirror_for(self, weights: dict[str, int]) -> RouteMirror | None:
        """Mirror only while the new version is a canary: not once promoted, never on the way back."""
        if self._mirror is None or weights.get(self._in.version, 0) >= 100 or self._stage in _FINISHING:
            return None
        return self._mirror

    # ---- helpers -----------------------------------------------------------------------------

    async def _prestage(self, files: list[WeightFile]) -> None:
        """Stage onto every node of the pool (one Job each, peers sharing chunks) and go on once
        ``min_nodes`` hold the version; the others finish behind. Fewer by the deadline, or too many
        failed to reach it, fails the rollout before the cluster's serving objects change."""
        inp, spec = self._in, self._in.prestage
        req = StartNodeCacheInput(
            namespace=self._ref.namespace,
            model=inp.model, version=inp.version, files=files, pool=spec.pool, run_id=workflow.info().run_id,
            image=inp.image,
        )
        status = await self._act(
            NodeCacheActivities.start_node_staging,
            req,
            summary=f"start staging {inp.model} {inp.version} onto the nodes of {spec.pool or 'the GPU pools'}",
        )
        deadline = workflow.now() + timedelta(seconds=spec.timeout_seconds)
        while True:
            self._nodes = status.nodes
            wanted = min(spec.min_nodes, len(status.nodes))
            staged, failed = status.count("staged"), status.count("failed")
            self._show(f"pre-staging: {staged} of {len(status.nodes)} node(s) staged, {wanted} needed")
            if staged >= wanted:
                return
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
            status = await self._act(
                NodeCacheActivities.node_staging_status, req, summary="read the nodes' staging", read_only=True
            )

    async def _checkpoint(self) -> None:
        """Between actions: stop for an abort, wait out a pause (promote also ends a pause)."""
        if self._abort_reason is not None:
            raise _Abort(self._abort_reason)
        if not self._paused:
            return
        before = self._stage
        self._set_stage(Stage.PAUSED)
        self._record_rollout("paused", self._stage_label(self._weight))
        since = workflow.now()
        limit = self._in.deadlines.pause_seconds
        while self._paused and self._abort_reason is None and self._promote is None:
            paused_for = (workflow.now() - since).total_seconds()
            if limit is not None and paused_for >= limit:
                raise _RollBack(f"paused longer than {limit:.0f}s ({self._pause_reason}); rolling back")
            # Wake hourly to show how long the pause lasts: a handful of events per hour, bounded.
            wait = PAUSE_TICK if limit is None else min(PAUSE_TICK, limit - paused_for)
            await wait_until(
                lambda: not self._paused or self._abort_reason is not None or self._promote is not None,
                timedelta(seconds=wait),
                "still paused",
            )
            self._show(f"paused for {(workflow.now() - since).total_seconds() / 3600:.1f} h")
        if self._abort_reason is not None:
            raise _Abort(self._abort_reason)
        self._paused = False
        self._record_rollout("resumed", self._stage_label(self._weight))
        self._set_stage(before)

    async def _act(
        self,
        method: Callable,
        arg: Any,
        *,
        summary: str,
        start_to_close: float | None = None,
        schedule_to_close: float | None = None,
        heartbeat: float | None = None,
        retry: RetryPolicy = _FORWARD,
        interruptible: bool = True,
        read_only: bool = False,
    ) -> Any:
        """Run one activity.

        Interruptible (long waits, downloads, reads): an abort or a cancel cancels it and waits
        until it stopped (it heartbeats); a read-only one is abandoned instead. Not interruptible (short cluster
        changes): it runs to its end even when the workflow is cancelled, and a rollback waits for
        it first, so no forward change can land after the route went back to stable.
        """
        task = asyncio.ensure_future(
            workflow.execute_activity_method(
                method,
                arg,
                start_to_close_timeout=timedelta(
                    seconds=start_to_close or schedule_to_close or _KUBE_CALL.total_seconds()
                ),
                schedule_to_close_timeout=timedelta(seconds=schedule_to_close) if schedule_to_close else None,
                heartbeat_timeout=timedelta(seconds=heartbeat) if heartbeat else None,
                retry_policy=retry,
                summary=summary,
                cancellation_type=(
                    ActivityCancellationType.ABANDON
                    if read_only
                    else ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
                ),
            )
        )
        if not interruptible:
            self._in_flight = task
            return await asyncio.shield(task)
        try:
            await wait_until(lambda: task.done() or self._abort_reason is not None)
        except asyncio.CancelledError:
            await _stop(task)
            raise
        if not task.done():
            await _stop(task)
            raise _Abort(self._abort_reason or "aborted")
        return task.result()

    async def _retire(self, version: str, reason: str) -> str:
        """Leave ``version``'s delayed scale-down to a RetireVersion workflow that outlives this run,
        so the rollout's result comes when traffic has moved and the next rollout can start."""
        inp = self._in
        await self._act(
            RetireScheduling.schedule_retire,
            RetireInput(
                deployment=inp.deployment, version=version, delay_seconds=inp.scale_down_delay_seconds, reason=reason
            ),
            summary=f"scale {version} to 0 in {inp.scale_down_delay_seconds:.0f}s, in a workflow of its own",
            retry=_BACK,
            interruptible=False,
        )
        return f"{version} scales to 0 in {inp.scale_down_delay_seconds:.0f}s ({retire_workflow_id(inp.deployment, version)})"

    async def _cancel_pending_retire(self, state: DeploymentState) -> None:
        """A pending scale-down of the version this rollout starts (its earlier rollback, or it was
        the stable before) must not land in the middle of this rollout: cancel it first. Only a
        version still running without traffic can have one pending."""
        warm = any(v.version == self._in.version and v.replicas > 0 and v.route_weight == 0 for v in state.versions)
        if not warm or not workflow.patched(RETIRE_PATCH):
            return
        await self._act(
            RetireScheduling.cancel_retire,
            CancelRetireInput(deployment=self._in.deployment, version=self._in.version),
            summary=f"cancel a pending scale-down of {self._in.version}",
            interruptible=False,
        )

    async def _route(
        self, weights: dict[str, int], summary: str, retry: RetryPolicy = _FORWARD, release: bool = False
    ) -> None:
        """Set the route's weights as the route's owner (this workflow); ``release``: its last change."""
        await self._act(
            RolloutActivities.set_route_weights,
            RouteWeightsInput(
                deployment=self._ref,
                weights=weights,
                port=self._in.port,
                mirror=self._mirror_for(weights),
                owner=workflow.info().workflow_id,
                release=release,
            ),
            summary=summary,
            retry=retry,
            interruptible=False,
        )
        self._weight = weights.get(self._in.version, 0)
        self._max_weight = max(self._max_weight, self._weight)
        workflow.upsert_search_attributes([CANARY_PERCENT.value_set(self._weight)])
        self._show()

    async def _scale(self, version: str, replicas: int, summary: str, retry: RetryPolicy = _FORWARD) -> None:
        await self._act(
            RolloutActivities.scale_version,
            ScaleVersionInput(deployment=self._ref, version=version, replicas=replicas),
            summary=summary,
            retry=retry,
            interruptible=False,
        )
        if version == self._in.version:
            self._canary_replicas = replicas

    async def _registry_status(self, status: Testing | Canary | Stable | Deprecated, reason: str) -> None:
        if self._registry:
            await self._registry_write(
                RegistryActivities.set_registry_status,
                SetRegistryStatusInput(
                    model=self._in.model,
                    version=self._in.version,
                    status=status,
                    reason=reason,
                    at=workflow.now(),
                    deployment=self._in.deployment,
                ),
                f"registry: {self._in.model} {self._in.version} -> {status.state}",
            )

    async def _registry_write(self, method: Callable, arg: Any, summary: str) -> None:
        """Registry bookkeeping must not decide a rollout: a failure is logged, the rollout goes on."""
        try:
            await self._act(method, arg, summary=summary, interruptible=False)
        except ActivityError as err:
            workflow.logger.warning("%s failed: %s", method.__name__, cause(err))

    def _record_rollout(self, event: str, stage: str, rollback_seconds: float | None = None) -> None:
        """A rollout paused, resumed or ended (``event`` is then its outcome), on the workflow meter."""
        ref = self._ref
        if workflow.patched(METER_PATCH):
            if event in ("paused", "resumed"):
                rollout_paused(workflow.metric_meter(), ref.namespace, ref.name, event == "paused")
            else:
                rollout_finished(workflow.metric_meter(), ref.namespace, ref.name, event, stage, rollback_seconds)
            return
        self._legacy_record(
            LEGACY_ROLLOUT,
            {"namespace": ref.namespace, "deployment": ref.name, "event": event, "stage": stage, "rollback_seconds": rollback_seconds},
            event,
        )

    def _record_verdict(self, verdict: str, failing_gate: str) -> None:
        """One observation window's gate verdict on the new version, on the workflow meter."""
        ref, version = self._ref, self._in.version
        if workflow.patched(METER_PATCH):
            gate_verdict(workflow.metric_meter(), ref.namespace, ref.name, version, verdict, failing_gate)
            return
        self._legacy_record(
            LEGACY_GATE_VERDICT,
            {"namespace": ref.namespace, "deployment": ref.name, "version": version, "verdict": verdict, "failing_gate": failing_gate},
            f"gate {verdict}",
        )

    def _legacy_record(self, activity_name: str, event: dict, what: str) -> None:
        """A run recorded before the meter replays the metrics activity it scheduled (drained at the end)."""
        self._telemetry.append(
            workflow.start_activity(
                activity_name,
                event,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=_BEST_EFFORT,
                summary=f"metrics: {what}",
            )
        )

    def _stage_label(self, weight: int) -> str:
        """Stage as the metrics name it: ``canary-5`` inside the ladder, else the stage."""
        in_ladder = self._step is not None and self._stage in (Stage.CANARY, Stage.PAUSED)
        return f"canary-{weight}" if in_ladder else self._stage.value

    def _share(self, weight: int) -> int:
        return canary_replicas(self._target_replicas, weight)

    def _set_stage(self, stage: Stage) -> None:
        now = workflow.now()
        key = self._stage.value
        self._timings[key] = self._timings.get(key, 0.0) + (now - self._stage_since).total_seconds()
        self._stage, self._stage_since = stage, now
        workflow.upsert_search_attributes([STAGE.value_set(stage.value)])
        self._show()

    def _all_timings(self) -> dict[str, float]:
        timings = dict(self._timings)
        if self._cold_start is not None:
            timings["cold_start"] = self._cold_start
        return timings

    def _show(self, note: str = "") -> None:
        """Current details in the UI: stage, weight, the last verdict with its numbers."""
        inp = self._in
        head = f"**{self._stage.value}** · {inp.model} {inp.version} → {inp.deployment} · **{self._weight} %**"
        if self._step is not None:
            head += f" (step {self._step + 1}: {' → '.join(str(s.weight) for s in inp.steps)})"
        lines = [head]
        if self._stable is not None:
            lines.append(f"stable: {self._stable.version} ({self._target_replicas} replicas)")
        if self._paused:
            lines.append(f"⏸ paused: {self._pause_reason} — signal `resume` / `abort`, or update `promote`")
        if note:
            lines.append(note)
        lines += [v.describe() for v in (self._golden, self._shadow) if v is not None]
        if self._nodes:
            lines.append("nodes: " + ", ".join(n.describe() for n in self._nodes))
        if self._verdicts:
            last = self._verdicts[-1]
            lines.append(
                f"verdict {self._verdict_count} at {last.weight} % ({last.at:%Y-%m-%d %H:%M:%S} UTC):"
                f" {last.evaluation.describe()}"
            )
            a = self._analysis
            lines.append(
                f"step: {a.passes} pass, {a.failures} fail, {a.inconclusives} inconclusive, {a.errors} metric errors"
            )
        workflow.set_current_details("\n\n".join(lines))

    def _result(self, outcome: Outcome, reason: str) -> RolloutResult:
        return RolloutResult(
            deployment=self._in.deployment,
            version=self._in.version,
            previous_version=self._stable.version if self._stable else None,
            outcome=outcome,
            reason=reason,
            weight_reached=self._max_weight,
            cold_start_seconds=self._cold_start,
            benchmark=self._benchmark,
            staged=self._staged,
            timings=self._all_timings(),
            golden=self._golden,
            shadow=self._shadow,
            batching=self._batching,
        )


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
