"""AdapterRollout on Temporal's time-skipping server, its activities stubbed under the real names.

The stubs keep a tiny model of the replicas (which served names each holds) and of the adapter's
route rule, and record every call in order; gate values are scripted per canary weight.
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.worker import Worker

from temporalio.exceptions import ApplicationError

from workflows.adapters.contract import (
    AdapterOnReplicasInput,
    AdapterReplicas,
    AdapterRouteInput,
    LoraModuleInput,
    ResolveAdapterInput,
    ResolvedAdapter,
)
from workflows.rollout.contract import MoveAdapterRulesInput
from workflows.adapters.types import AdapterAbortInput, AdapterRolloutInput
from workflows.adapters.workflow import AdapterRollout
from workflows.core.naming import DeploymentRef
from workflows.registry.contract import ListVersionsInput, RegistryStatusResult, SetRegistryStatusInput, VersionList
from workflows.core.versions import Stable
from workflows.registry.schema import VersionSummary
from workflows.rollout import gates as canary
from workflows.core.versions import (
    DeploymentState,
    VersionInfo,
    WeightFile,
)
from workflows.rollout.contract import (
    GateQueriesInput,
    GateQueriesResult,
    StagedWeights,
    StageWeightsInput,
)
from workflows.rollout.types import Outcome
from tests.workflows.rollout.test_rollout import STABLE, NEW, Fleet, rollout_input, run_rollout

PODS = ["llm/chat-v1-0-0-a", "llm/chat-v1-0-0-b"]
GOOD = {canary.REQUEST_COUNT: 600.0, canary.ERROR_RATE: 0.001, canary.P99_LATENCY: 1.0, canary.STABLE_P99_LATENCY: 1.0,
        canary.TTFT_P99: 0.3, canary.TPOT_P99: 0.04}
BAD = {**GOOD, canary.ERROR_RATE: 0.2}
T0 = "2026-12-01T00:00:00Z"


class Stubs:
    """The cluster, registry and Prometheus as the workflow sees them through its activities."""

    def __init__(self, stable: str | None, gate_values: dict[int, dict[str, float]], base: str = "1.0.0",
                 pin_fails: bool = False) -> None:
        self.loaded: dict[str, set[str]] = {pod: ({f"sql-lora-{stable}"} if stable else set()) for pod in PODS}
        self.pin_fails = pin_fails
        self.scale_up_at_check: int | None = None
        self.checks = 0
        self.lora_modules: dict[str, str] = {}
        self.stable, self.gate_values, self.base = stable, gate_values, base
        self.route: dict[str, int] = {f"sql-lora-{stable}": 100} if stable else {}
        self.calls: list[str] = []
        self.statuses: list[str] = []
        self.weight = 0

    def activities(self) -> list:
        @activity.defn(name="resolve_adapter")
        def resolve_adapter(req: ResolveAdapterInput) -> ResolvedAdapter:
            return ResolvedAdapter(files=[WeightFile(uri="s3://b/a/adapter_model.safetensors", sha256="ab" * 32)],
                                   base_model="llama", base_version="1.0.0")

        @activity.defn(name="describe_deployment")
        def describe_deployment(ref: DeploymentRef) -> DeploymentState:
            return DeploymentState(route_exists=True, versions=[
                VersionInfo(version=self.base, model="llama", replicas=2, ready_replicas=2, route_weight=100)])

        @activity.defn(name="list_registry_versions")
        def list_registry_versions(req: ListVersionsInput) -> VersionList:
            if self.stable is None:
                return VersionList(versions=[])
            return VersionList(versions=[VersionSummary(
                model="sql-lora", version=self.stable, revision=2, status=Stable(since=T0), weights_location="s3://b/a/",
                deployments={"llm/chat": Stable(since=T0)}, size_bytes=1, quantization="none", created_at=T0)])

        @activity.defn(name="stage_weights")
        def stage_weights(req: StageWeightsInput) -> StagedWeights:
            self.calls.append(f"stage {req.model}@{req.version}")
            return StagedWeights(path=f"/cache/{req.model}/{req.version}", size_bytes=1, seconds=0.1)

        @activity.defn(name="load_lora_adapter")
        def load_lora_adapter(req: AdapterOnReplicasInput) -> AdapterReplicas:
            self.calls.append(f"load {req.lora_name} from {req.lora_path}")
            for names in self.loaded.values():
                names.add(req.lora_name)
            return AdapterReplicas(pods=sorted(self.loaded))

        @activity.defn(name="set_lora_module")
        def set_lora_module(req: LoraModuleInput) -> None:
            self.calls.append(f"pin {req.adapter}@{req.version} from {req.lora_path} on {req.base_version}")
            if self.pin_fails:
                raise ApplicationError("Deployment llm/chat-v1-0-0 has no container 'server'", non_retryable=True)
            self.lora_modules = {f"{req.adapter}-{req.version}": req.lora_path}

        @activity.defn(name="unload_lora_adapter")
        def unload_lora_adapter(req: AdapterOnReplicasInput) -> AdapterReplicas:
            self.calls.append(f"unload {req.lora_name}")
            for names in self.loaded.values():
                names.discard(req.lora_name)
            return AdapterReplicas(pods=sorted(self.loaded))

        @activity.defn(name="set_adapter_route")
        def set_adapter_route(req: AdapterRouteInput) -> None:
            assert req.base_version == self.base
            self.route = req.weights
            self.weight = req.weights.get("sql-lora-1.1.0", 0)
            self.calls.append(f"route {sorted(req.weights.items())}")

        @activity.defn(name="query_gates")
        def query_gates(req: GateQueriesInput) -> GateQueriesResult:
            assert req.variables["model"] == "sql-lora" and req.variables["stable_version"] == (self.stable or "")
            self.checks += 1
            if self.checks == self.scale_up_at_check:
                self.scale_up("llm/chat-v1-0-0-c")
            return GateQueriesResult(values=self.gate_values[self.weight])

        @activity.defn(name="set_registry_status")
        def set_registry_status(req: SetRegistryStatusInput) -> RegistryStatusResult:
            self.statuses.append(req.status.state)
            return RegistryStatusResult(status=req.status)

        return [resolve_adapter, describe_deployment, list_registry_versions, stage_weights, load_lora_adapter,
                unload_lora_adapter, set_adapter_route, query_gates, set_registry_status, set_lora_module]

    def scale_up(self, pod: str) -> None:
        """A base replica started from the Deployment's template: it holds its --lora-modules only."""
        self.loaded[pod] = set(self.lora_modules)


async def run(env, stubs: Stubs, **extra):
    queue = f"adapters-{uuid.uuid4().hex[:6]}"
    inp = AdapterRolloutInput(deployment="llm/chat", adapter="sql-lora", version="1.1.0", gate_interval_seconds=60,
                              steps=[{"weight": 10, "window_seconds": 120}, {"weight": 50, "window_seconds": 120},
                                     {"weight": 100, "window_seconds": 120}], **extra)
    async with Worker(env.client, task_queue=queue, workflows=[AdapterRollout], activities=stubs.activities(),
                      activity_executor=ThreadPoolExecutor(4)):
        return await env.client.execute_workflow(AdapterRollout.run, inp, id=f"adapter-rollout/{uuid.uuid4().hex[:6]}", task_queue=queue)


async def test_a_good_adapter_version_walks_the_ladder_and_the_old_one_is_unloaded(time_skipping_env):
    stubs = Stubs(stable="1.0.0", gate_values={10: GOOD, 50: GOOD})
    result = await run(time_skipping_env, stubs)
    assert result.outcome is Outcome.PROMOTED and result.previous_version == "1.0.0" and result.weight_reached == 100
    load = "load sql-lora-1.1.0 from /cache/sql-lora/1.1.0"
    assert [c for c in stubs.calls if c != load] == [
        "stage sql-lora@1.1.0",
        "route [('sql-lora-1.0.0', 90), ('sql-lora-1.1.0', 10)]",
        "route [('sql-lora-1.0.0', 50), ('sql-lora-1.1.0', 50)]",
        "route [('sql-lora-1.1.0', 100)]",
        "pin sql-lora@1.1.0 from /cache/sql-lora/1.1.0 on 1.0.0",
        "unload sql-lora-1.0.0",
    ], "the old version is unloaded only once no traffic goes to it, and replicas started later hold the new one"
    assert stubs.calls.count(load) == 1 + 4, "loaded, then re-loaded at each of the 2 + 2 gate checks"
    assert all(names == {"sql-lora-1.1.0"} for names in stubs.loaded.values())
    assert stubs.statuses == ["canary", "canary", "stable"]


async def test_a_failed_gate_routes_back_to_stable_then_unloads_the_new_version(time_skipping_env):
    stubs = Stubs(stable="1.0.0", gate_values={10: GOOD, 50: BAD})
    result = await run(time_skipping_env, stubs)
    assert result.outcome is Outcome.ROLLED_BACK and result.weight_reached == 50
    assert result.failing_verdict is not None and [c.gate for c in result.failing_verdict.evaluation.failed] == [canary.ERROR_RATE]
    assert stubs.calls[-2:] == ["route [('sql-lora-1.0.0', 100)]", "unload sql-lora-1.1.0"], "traffic back first, then unload"
    assert result.unloaded_from == PODS and all(names == {"sql-lora-1.0.0"} for names in stubs.loaded.values())
    assert stubs.statuses == ["canary", "canary", "deprecated"], "a gate failure deprecates the version"


async def test_the_first_version_of_an_adapter_is_promoted_after_loading(time_skipping_env):
    stubs = Stubs(stable=None, gate_values={})
    result = await run(time_skipping_env, stubs)
    assert result.outcome is Outcome.PROMOTED and result.previous_version is None
    assert stubs.calls[-2:] == ["route [('sql-lora-1.1.0', 100)]", "pin sql-lora@1.1.0 from /cache/sql-lora/1.1.0 on 1.0.0"]
    assert stubs.statuses == ["stable"]


async def test_a_first_version_that_fails_after_its_route_was_set_removes_its_rule(time_skipping_env):
    stubs = Stubs(stable=None, gate_values={}, pin_fails=True)
    result = await run(time_skipping_env, stubs)
    assert result.outcome is Outcome.ROLLED_BACK and "no container" in result.reason
    assert stubs.calls[-3:] == ["pin sql-lora@1.1.0 from /cache/sql-lora/1.1.0 on 1.0.0", "route []", "unload sql-lora-1.1.0"]
    assert stubs.route == {}, "no rule left sending the adapter's name to a version no replica holds"


async def test_a_replica_that_starts_during_the_canary_gets_the_new_version_at_the_next_gate_check(time_skipping_env):
    stubs = Stubs(stable="1.0.0", gate_values={10: GOOD, 50: GOOD})
    stubs.lora_modules = {"sql-lora-1.0.0": "/cache/sql-lora/1.0.0"}
    stubs.scale_up_at_check = 1  # the base scales up right after the first gate check at 10 %
    result = await run(time_skipping_env, stubs)
    assert result.outcome is Outcome.PROMOTED
    new_pod = stubs.loaded["llm/chat-v1-0-0-c"]
    assert new_pod == {"sql-lora-1.1.0"}, "the new replica got the canary at a gate check, then lost only the old version"
    assert stubs.lora_modules == {"sql-lora-1.1.0": "/cache/sql-lora/1.1.0"}, "replicas started later hold the promoted version"


async def test_an_adapter_of_another_base_version_is_refused_before_anything_loads(time_skipping_env):
    stubs = Stubs(stable="1.0.0", gate_values={}, base="2.0.0")
    with pytest.raises(WorkflowFailureError) as failure:
        await run(time_skipping_env, stubs)
    assert "base_version: sql-lora@1.1.0 is an adapter of llama@1.0.0, but llm/chat serves llama@2.0.0" in str(failure.value.cause)
    assert stubs.calls == []


@pytest.mark.parametrize("payload", [AdapterAbortInput(reason="wrong adapter"), "wrong adapter"])  # a bare string aborts too
async def test_an_abort_routes_back_and_unloads_without_deprecating(time_skipping_env, payload):
    stubs = Stubs(stable="1.0.0", gate_values={10: GOOD})
    queue = f"adapters-{uuid.uuid4().hex[:6]}"
    inp = AdapterRolloutInput(deployment="llm/chat", adapter="sql-lora", version="1.1.0", gate_interval_seconds=600)
    async with Worker(time_skipping_env.client, task_queue=queue, workflows=[AdapterRollout], activities=stubs.activities(),
                      activity_executor=ThreadPoolExecutor(4)):
        handle = await time_skipping_env.client.start_workflow(
            AdapterRollout.run, inp, id=f"adapter-rollout/{uuid.uuid4().hex[:6]}", task_queue=queue)
        for _ in range(100):  # queries do not skip time: the first gate check is 10 minutes away
            if (await handle.query(AdapterRollout.status)).weight == 10:
                break
            await asyncio.sleep(0.05)
        await handle.signal("abort", payload)
        result = await handle.result()
    assert result.outcome is Outcome.ABORTED and result.reason == "aborted: wrong adapter" and result.weight_reached == 10
    assert stubs.calls[-2:] == ["route [('sql-lora-1.0.0', 100)]", "unload sql-lora-1.1.0"]
    assert stubs.statuses == ["canary", "testing"], "an abort leaves the version for another try"


# ---- a base-model rollout carries the adapters its stable version's pods load at start ----------

class LoraFleet(Fleet):
    """ModelRollout's stubs, the stable version's pods started with ``--lora-modules``."""

    def __init__(self, client, modules: dict[str, str]) -> None:
        super().__init__(client)
        self.modules = modules

    def activities(self) -> list:
        return [*super().activities(), self.move_adapter_rules]

    @activity.defn(name="describe_deployment")
    async def describe_deployment(self, input: DeploymentRef) -> DeploymentState:
        await self._record("describe_deployment", input)
        return DeploymentState(route_exists=True, versions=[
            VersionInfo(version=v, model="llama", replicas=n, ready_replicas=n, route_weight=self.route.get(v, 0),
                        lora_modules=self.modules if v == STABLE else {}) for v, n in self.replicas.items()])

    @activity.defn(name="move_adapter_rules")
    async def move_adapter_rules(self, input: MoveAdapterRulesInput) -> list[str]:
        await self._record("move_adapter_rules", input)
        return ["sql-lora"]


SQL = {"sql-lora-1.0.0": "/cache/sql-lora/1.0.0"}


async def test_a_base_rollout_starts_the_new_version_with_the_adapters_and_moves_their_rules_at_promotion(time_skipping_env):
    fleet = LoraFleet(time_skipping_env.client, SQL)
    result = await run_rollout(fleet, rollout_input(args=["--enable-lora"]))
    assert result.outcome is Outcome.PROMOTED
    ensure = next(arg for name, arg in fleet.calls if name == "ensure_version")
    assert ensure.args == ["--enable-lora", "--lora-modules", "sql-lora-1.0.0=/cache/sql-lora/1.0.0"]
    names = fleet.names()
    moved = names.index("move_adapter_rules")
    assert names[moved - 1] == "set_route_weights" and fleet.routes()[-1] == {STABLE: 0, NEW: 100}, \
        "the adapters' rules follow the base once it carries all traffic"
    assert (fleet.calls[moved][1].from_version, fleet.calls[moved][1].to_version) == (STABLE, NEW)


async def test_a_base_rollout_without_enable_lora_is_refused_and_another_model_drops_the_adapter_rules(time_skipping_env):
    fleet = LoraFleet(time_skipping_env.client, SQL)
    with pytest.raises(WorkflowFailureError) as failure:
        await run_rollout(fleet, rollout_input())
    assert "add --enable-lora to carry them" in str(failure.value.cause) and "ensure_version" not in fleet.names()

    fleet = LoraFleet(time_skipping_env.client, SQL)
    result = await run_rollout(fleet, rollout_input(model="mistral", replace_model=True))
    assert result.outcome is Outcome.PROMOTED
    assert next(arg for name, arg in fleet.calls if name == "ensure_version").args == []
    assert next(arg for name, arg in fleet.calls if name == "move_adapter_rules").to_version is None, \
        "another model cannot load them: their rules are removed with the old base"

