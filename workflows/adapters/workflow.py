"""AdapterRollout: canary a LoRA adapter version on the replicas of its base model, by model name.

API: workflow type ``AdapterRollout``, task queue ``tideplane``, workflow ID
``adapter-rollout/<namespace>/<name>/<adapter>``; signals ``abort`` (AdapterAbortInput) and
``resume``; query ``status`` -> AdapterRolloutStatus; result AdapterRolloutResult.

The base model's replicas hold every loaded adapter version at once (vLLM's dynamic LoRA API), so a
canary moves no pods: the new version is loaded beside the stable one under its own served name
(``<adapter>-<version>``), and the HTTPRoute rule that takes the adapter's model name splits its
requests between the two (workflows/adapters/routing.py). The ladder, the gates and the verdict
rules are the model rollout's (workflows/rollout/gates.py, its ``query_gates`` activity), on
queries per served name. Promotion unloads the old version; rollback — a failed gate, an abort,
an error — routes everything back to stable first (or removes the adapter's rule when there is no
stable version), then unloads the new version, each unload ``drain_seconds`` after its version's
traffic left (the gateway applies a route change late).

Replicas that start after the load (scale-up, restart, spot replacement) would not hold it: every
gate tick re-runs the idempotent load, so a replica that became Ready during the canary gets the
new version within one ``gate_interval_seconds``, and a promoted version is written into the base
Deployment's ``--lora-modules`` (vLLM loads those at start), so every replica started afterwards
holds it. That edit changes the pod template: the base rolls its pods as its Deployment strategy
says, each new pod starting with the adapter.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.adapters.contract import (
        AdapterActivities,
        AdapterOnReplicasInput,
        AdapterRouteInput,
        LoraModuleInput,
        ResolveAdapterInput,
    )
    from workflows.adapters.routing import served_name
    from workflows.adapters.types import (
        AdapterAbortInput,
        AdapterRolloutInput,
        AdapterRolloutResult,
        AdapterRolloutStatus,
    )
    from workflows.registry.contract import ListVersionsInput, RegistryActivities, SetRegistryStatusInput
    from workflows.core.versions import Canary, Deprecated, Stable, Testing
    from workflows.rollout.contract import GateQueriesInput, RolloutActivities, StageWeightsInput
    from workflows.rollout.gates import Decision, StepAnalysis, evaluate, required_passes
    from workflows.rollout.patches import METRIC_MISSING_PATCH
    from workflows.core.engine_metrics import metric_names
    from workflows.rollout.types import Outcome, Stage, VerdictRecord
    from workflows.core.failures import cause, understood
    from workflows.core.waiting import wait_until

WORKFLOW_TYPE = "AdapterRollout"
_FORWARD = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=30))
_BACK = RetryPolicy(maximum_interval=timedelta(seconds=30))  # a rollback keeps trying
_GATES = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5), maximum_attempts=3)
_CALL = timedelta(seconds=120)


def adapter_rollout_workflow_id(deployment: str, adapter: str) -> str:
    """One adapter rollout per adapter and deployment."""
    return f"adapter-rollout/{deployment}/{adapter}"


class _RollBack(Exception):
    def __init__(self, reason: str, verdict: VerdictRecord | None = None, outcome: Outcome = Outcome.ROLLED_BACK) -> None:
        super().__init__(reason)
        self.reason, self.verdict, self.outcome = reason, verdict, outcome


@workflow.defn(name=WORKFLOW_TYPE)
class AdapterRollout:
    @workflow.init
    def __init__(self, input: AdapterRolloutInput) -> None:
        self._in = input
        self._stage = Stage.RESOLVING
        self._weight = self._max_weight = 0
        self._stable: str | None = None
        self._base: str | None = None
        self._abort: str | None = None
        self._paused = False
        self._pause_reason: str | None = None
        self._verdict: VerdictRecord | None = None
        self._loaded: list[str] = []
        self._path: str | None = None
        self._routed = False
        self._canary_since = None

    @workflow.run
    async def run(self, input: AdapterRolloutInput) -> AdapterRolloutResult:
        try:
            return await self._rollout()
        except _RollBack as back:
            return await self._roll_back(back)
        except ActivityError as err:
            if self._loaded:
                return await self._roll_back(_RollBack(f"failed: {cause(err)}"))
            raise

    @workflow.signal
    def abort(self, input: Any = None) -> None:
        """Any payload aborts (the SDK would drop one it cannot decode): what was not understood is named in the reason."""
        taken, problem = understood(AdapterAbortInput, input, "abort")
        if problem is not None:
            workflow.logger.warning("%s: acting on it anyway", problem)
        self._abort = f"{taken.reason} ({problem})" if problem else taken.reason

    @workflow.signal
    def resume(self) -> None:
        self._paused = False

    @workflow.query
    def status(self) -> AdapterRolloutStatus:
        inp = self._in
        return AdapterRolloutStatus(
            deployment=inp.deployment, adapter=inp.adapter, version=inp.version, stable_version=self._stable,
            base_version=self._base, stage=Stage.PAUSED if self._paused else self._stage, weight=self._weight,
            paused=self._paused, pause_reason=self._pause_reason, last_verdict=self._verdict, loaded_on=self._loaded,
        )

    # ---- forward --------------------------------------------------------------------------------

    async def _rollout(self) -> AdapterRolloutResult:
        inp = self._in
        adapter = await self._act(
            AdapterActivities.resolve_adapter, ResolveAdapterInput(adapter=inp.adapter, version=inp.version),
            f"resolve {inp.adapter}@{inp.version} in the registry",
        )
        state = await self._act(RolloutActivities.describe_deployment, inp.ref, f"describe {inp.deployment}")
        serving = state.stable
        if serving is None or (serving.model, serving.version) != (adapter.base_model, adapter.base_version):
            where = f"{serving.model}@{serving.version}" if serving else "nothing"
            raise ApplicationError(
                f"base_version: {inp.adapter}@{inp.version} is an adapter of {adapter.base_model}@{adapter.base_version},"
                f" but {inp.deployment} serves {where}",
                type="BaseMismatch", non_retryable=True,
            )
        self._base = serving.version
        self._stable = await self._stable_adapter_version()
        if self._stable == inp.version:
            raise ApplicationError(f"{inp.adapter} {inp.version} is already stable on {inp.deployment}",
                                   type="NothingToRollOut", non_retryable=True)
        self._stage = Stage.STAGING
        staged = await self._act(
            RolloutActivities.stage_weights,
            StageWeightsInput(model=inp.adapter, version=inp.version, files=adapter.files),
            f"stage {len(adapter.files)} adapter file(s) of {inp.adapter} {inp.version}, verifying SHA-256",
            timeout=timedelta(hours=1),
        )
        self._stage = Stage.STARTING
        self._check_abort()
        self._path = staged.path
        await self._load(f"load {served_name(inp.adapter, inp.version)} on the Ready replicas of {self._base}")
        if self._stable is None:
            await self._route({inp.version: 100}, f"first version of {inp.adapter}: route 100 %")
            await self._pin(_FORWARD)
            await self._registry(Stable(since=workflow.now()), "first version of the adapter")
            self._stage = Stage.PROMOTED
            return self._result(Outcome.PROMOTED, "first version of the adapter: no stable version, promoted")
        self._stage = Stage.CANARY
        for step in inp.steps:
            if step.weight == 100:
                break
            self._check_abort()
            await self._route({self._stable: 100 - step.weight, inp.version: step.weight}, f"route {step.weight} % to {inp.version}")
            self._canary_since = self._canary_since or workflow.now()
            await self._registry(Canary(percent=step.weight, since=self._canary_since), f"canary at {step.weight} %")
            await self._observe(step.weight, step.window_seconds)
        return await self._promote()

    async def _observe(self, weight: int, window_seconds: float) -> None:
        """The model rollout's gate loop: every interval a verdict; a failure rolls back, too many
        inconclusive or unmeasurable ones pause (never promoting blind)."""
        inp = self._in
        analysis = StepAnalysis()
        started = workflow.now()
        need = required_passes(window_seconds, inp.gate_interval_seconds)
        while True:
            await wait_until(lambda: self._abort is not None, timedelta(seconds=inp.gate_interval_seconds),
                             f"next gate check at {weight} %")
            self._check_abort()
            await self._load(f"load {served_name(inp.adapter, inp.version)} on replicas Ready since the last check")
            record = await self._measure(weight)
            decision = analysis.record(record.evaluation, inp.analysis)
            if record.evaluation.metric_missing and decision is Decision.CONTINUE and workflow.patched(METRIC_MISSING_PATCH):
                decision = Decision.PAUSE_METRIC_MISSING  # waiting cannot bring a metric nobody exports
            if decision is Decision.ROLLBACK:
                raise _RollBack(f"gate failed at {weight} %: {record.evaluation.describe()}", record)
            if decision is not Decision.CONTINUE:
                self._paused = True
                why = f"metric missing: {', '.join(record.evaluation.metric_missing)}" if decision is Decision.PAUSE_METRIC_MISSING else decision.value
                self._pause_reason = f"{why} at {weight} %: {record.evaluation.describe()}"
                await wait_until(lambda: not self._paused or self._abort is not None)
                self._check_abort()
                self._pause_reason = None
                analysis.resumed()
                continue
            if analysis.complete((workflow.now() - started).total_seconds(), window_seconds, need):
                return

    async def _measure(self, weight: int) -> VerdictRecord:
        inp = self._in
        variables = {
            "namespace": inp.ref.namespace, "deployment": inp.ref.name, "model": inp.adapter,
            "version": inp.version, "stable_version": self._stable or "", "window": inp.query_window,
        }
        try:
            result = await workflow.execute_activity_method(
                RolloutActivities.query_gates, GateQueriesInput(queries=inp.queries.by_gate(), variables=variables),
                start_to_close_timeout=timedelta(seconds=30), retry_policy=_GATES, summary=f"gate queries at {weight} %",
            )
            queries = inp.queries.by_gate()
            no_series = {gate: metric_names(queries[gate]) for gate in result.no_series if gate in queries}
            evaluation = evaluate(result.values, inp.gates, no_series=no_series)
        except ActivityError as err:
            evaluation = evaluate(None, inp.gates, error=f"gate queries failed: {cause(err)}")
        self._verdict = VerdictRecord(at=workflow.now(), weight=weight, evaluation=evaluation)
        return self._verdict

    async def _promote(self) -> AdapterRolloutResult:
        inp = self._in
        assert self._stable is not None
        self._stage = Stage.PROMOTING
        await self._route({inp.version: 100}, f"promote: route 100 % to {inp.version}")
        await self._registry(Stable(since=workflow.now()), f"promoted over {self._stable}")
        await workflow.sleep(inp.drain_seconds, summary=f"drain {self._stable} before unloading it")
        await self._pin(_BACK)
        old = await self._act(
            AdapterActivities.unload_lora_adapter, self._on_replicas(self._stable),
            f"unload the old version {served_name(inp.adapter, self._stable)}", retry=_BACK,
        )
        self._stage = Stage.PROMOTED
        result = self._result(Outcome.PROMOTED, f"{inp.version} is stable at 100 %")
        result.unloaded_from = old.pods
        return result

    # ---- back -----------------------------------------------------------------------------------

    async def _roll_back(self, back: _RollBack) -> AdapterRolloutResult:
        """Traffic back to stable first (or the adapter's rule removed with nothing stable), then unload."""
        inp = self._in
        self._stage = Stage.ROLLING_BACK
        self._paused = False
        if self._stable is not None:
            await self._route({self._stable: 100}, f"roll back: route 100 % to {self._stable}", retry=_BACK)
            await workflow.sleep(inp.drain_seconds, summary=f"drain {inp.version} before unloading it")
        else:  # idempotent: also when the route's write landed but its answer did not
            routed = self._routed
            await self._route({}, f"roll back: remove the rule of {inp.adapter} (no stable version)", retry=_BACK)
            if routed:
                await workflow.sleep(inp.drain_seconds, summary=f"drain {inp.version} before unloading it")
        unloaded = await self._act(
            AdapterActivities.unload_lora_adapter, self._on_replicas(inp.version),
            f"unload {served_name(inp.adapter, inp.version)}", retry=_BACK,
        )
        if self._canary_since is not None:
            status = Deprecated(since=workflow.now()) if back.verdict is not None else Testing()
            await self._registry(status, f"rolled back: {back.reason}")
        self._weight = 0
        self._stage = Stage.ROLLED_BACK
        result = self._result(back.outcome, back.reason)
        result.failing_verdict = back.verdict
        result.unloaded_from = unloaded.pods
        return result

    def _check_abort(self) -> None:
        if self._abort is not None:
            raise _RollBack(f"aborted: {self._abort}", outcome=Outcome.ABORTED)

    # ---- helpers --------------------------------------------------------------------------------

    async def _act(self, method, arg, summary: str, retry: RetryPolicy = _FORWARD, timeout: timedelta = _CALL):
        return await workflow.execute_activity_method(
            method, arg, start_to_close_timeout=timeout, retry_policy=retry, summary=summary,
        )

    async def _load(self, summary: str) -> None:
        """Load the new version on every Ready replica of the base (idempotent: replicas holding it answer success)."""
        loaded = await self._act(
            AdapterActivities.load_lora_adapter, self._on_replicas(self._in.version, self._path), summary,
        )
        self._loaded = sorted(set(self._loaded) | set(loaded.pods))

    async def _pin(self, retry: RetryPolicy) -> None:
        """The promoted version into the base Deployment's ``--lora-modules``: replicas started later hold it."""
        inp = self._in
        assert self._base is not None and self._path is not None
        await self._act(
            AdapterActivities.set_lora_module,
            LoraModuleInput(deployment=inp.ref, base_version=self._base, adapter=inp.adapter, version=inp.version,
                            lora_path=self._path),
            f"--lora-modules of {inp.ref.versioned(self._base)}: {served_name(inp.adapter, inp.version)}", retry=retry,
        )

    def _on_replicas(self, version: str, path: str | None = None) -> AdapterOnReplicasInput:
        assert self._base is not None
        return AdapterOnReplicasInput(
            deployment=self._in.ref, base_version=self._base, lora_name=served_name(self._in.adapter, version), lora_path=path
        )

    async def _route(self, weights: dict[str, int], summary: str, retry: RetryPolicy = _FORWARD) -> None:
        inp = self._in
        assert self._base is not None
        await self._act(
            AdapterActivities.set_adapter_route,
            AdapterRouteInput(
                deployment=inp.ref, adapter=inp.adapter, base_version=self._base, port=inp.port,
                weights={served_name(inp.adapter, v): w for v, w in weights.items()},
            ),
            summary, retry=retry,
        )
        self._routed = bool(weights)
        self._weight = weights.get(inp.version, 0)
        self._max_weight = max(self._max_weight, self._weight)

    async def _stable_adapter_version(self) -> str | None:
        """The adapter version the registry records as stable on this deployment."""
        inp = self._in
        found = await self._act(
            RegistryActivities.list_registry_versions, ListVersionsInput(models=[inp.adapter]),
            f"the versions of {inp.adapter} in the registry",
        )
        stable = [v.version for v in found.versions if getattr(v.deployments.get(inp.deployment), "state", None) == "stable"]
        return stable[-1] if stable else None

    async def _registry(self, status, reason: str) -> None:
        inp = self._in
        if inp.registry_status:
            await self._act(
                RegistryActivities.set_registry_status,
                SetRegistryStatusInput(model=inp.adapter, version=inp.version, status=status, reason=reason,
                                       at=workflow.now(), deployment=inp.deployment),
                f"registry: {inp.adapter}@{inp.version} {status.state}", retry=_BACK,
            )

    def _result(self, outcome: Outcome, reason: str) -> AdapterRolloutResult:
        inp = self._in
        return AdapterRolloutResult(
            deployment=inp.deployment, adapter=inp.adapter, version=inp.version, previous_version=self._stable,
            outcome=outcome, reason=reason, weight_reached=self._max_weight,
        )
