"""ModelRollout on Temporal's time-skipping server, with its activities stubbed under the real names.

Metrics the workflow records on its metric meter are read back from a MetricBuffer on the test
server's runtime. The stubs keep a tiny model of the cluster (route weights, replicas per version) and record every
call in order, so tests assert what the workflow did to the cluster and in which order; gate values
are scripted per canary weight. Operators' signals and updates are sent from inside the stubs at a
precise point of the run (time is virtual, so polling from outside could not hit a given stage).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError, CancelledError, WorkflowAlreadyStartedError
from temporalio.api.testservice.v1 import LockTimeSkippingRequest, UnlockTimeSkippingRequest
from temporalio.service import RPCError
from temporalio.runtime import BufferedMetricUpdate, MetricBuffer, Runtime, TelemetryConfig
from temporalio.worker import Replayer, Worker

from tests.servers import time_skipping
from workflows.core import telemetry
from workflows.rollout import gates as canary
from workflows.core import search_attributes as sa
from activities.rollout.retire_scheduling import RetireScheduling
from workflows.rollout.retire_version import RetireVersion
from workflows.rollout.workflow import ModelRollout
from workflows.rollout.client import closed_result, rollout_result, start_rollout
from workflows.core.naming import DeploymentRef
from workflows.quality.contract import (
    GoldenSetFound,
    GoldenSetInput,
)
from workflows.registry.contract import (
    RecordRegistryBenchmarkInput,
    RegistryStatusResult,
    RegistryWeights,
    RegistryWeightsInput,
    SetRegistryStatusInput,
)
from workflows.rollout.contract import (
    DESCRIBE_DEPLOYMENT,
    ENSURE_VERSION,
    NOTIFY,
    QUERY_GATES,
    READ_CANARY_FLEET,
    SCALE_VERSION,
    SET_ENGINE_ARGS,
    SET_ROUTE_WEIGHTS,
    STAGE_WEIGHTS,
    SWEEP_BATCHING,
    WAIT_READY,
    WARM_UP,
    Benchmark,
    CanaryFleetInput,
    EngineArgsInput,
    EnsureVersionInput,
    GateQueriesInput,
    GateQueriesResult,
    NoticeInput,
    NoticeKind,
    ReadyResult,
    RouteWeightsInput,
    ScaleVersionInput,
    StagedWeights,
    StageWeightsInput,
    SweepBatchingInput,
    SweepBatchingResult,
    WaitReadyInput,
    WarmUpInput,
    RetireInput,
    retire_workflow_id,
)
from workflows.core.versions import (
    DeploymentState,
    VersionInfo,
    WeightFile,
)
from workflows.rollout.batching import VLLM_DEFAULT
from workflows.rollout.diagnosis import CanaryFleet
from workflows.core.batching_settings import BatchingSetting, SweepPoint
from workflows.rollout.types import (
    DEFAULT_STEPS,
    AbortInput,
    Outcome,
    PauseInput,
    PromoteInput,
    ResumeInput,
    RolloutInput,
    Stage,
)

# The registry's activity names (RegistryActivities in workflows/registry/contract.py)
RESOLVE_REGISTRY_WEIGHTS, SET_REGISTRY_STATUS, RECORD_REGISTRY_BENCHMARK = (
    "resolve_registry_weights", "set_registry_status", "record_registry_benchmark",
)
METRICS = MetricBuffer(100_000)  # what the workflows of this module record on their metric meter
_SEEN: list[BufferedMetricUpdate] = []
STABLE, NEW = "1.2.0", "1.3.0"
SHA = "ab" * 32
CLUSTER_CHANGES = (ENSURE_VERSION, SCALE_VERSION, SET_ROUTE_WEIGHTS)
GOOD = {
    canary.REQUEST_COUNT: 600.0,
    canary.ERROR_RATE: 0.001,
    canary.GATEWAY_ERROR_RATE: 0.001,
    canary.P99_LATENCY: 1.05,
    canary.STABLE_P99_LATENCY: 1.0,
    canary.TTFT_P99: 0.3,
    canary.TPOT_P99: 0.04,
}
BAD = {
    canary.ERROR_RATE: 0.2,
    canary.P99_LATENCY: 1.5,
    canary.TTFT_P99: 3.0,
    canary.TPOT_P99: 0.25,
}
SHORT = [
    {"weight": 1, "window_seconds": 180},
    {"weight": 5, "window_seconds": 180},
    {"weight": 50, "window_seconds": 180},
]

# A hook runs inside a stub before it returns; returning True makes a long stub (staging, waits,
# warm-up) keep heartbeating until the workflow cancels it, as a real download or wait would.
Hook = Callable[["Fleet", str, Any], Awaitable[bool | None]]


class Fleet:
    """Stub activities over a tiny in-memory cluster; every call is recorded in order."""

    def __init__(
        self,
        client: Client,
        *,
        stable: str | None = STABLE,
        stable_replicas: int = 4,
        gates: Callable[[int, int], dict[str, float | None] | Exception] = lambda weight, n: GOOD,
        hook: Hook | None = None,
        checksum_ok: bool = True,
        warm_up_errors: int = 0,
        sweep: Callable[[BatchingSetting], SweepPoint] | None = None,
        canary_fleet: Callable[[CanaryFleetInput, int], CanaryFleet] | None = None,
        notify_fails: bool = False,
        stable_gates: Callable[[int], dict[str, float | None] | GateQueriesResult] = lambda n: GOOD,
    ) -> None:
        self.client = client
        self.workflow_id = ""
        self.deployment = ""  # the logical name, as the metrics label it
        self.route: dict[str, int] = {stable: 100} if stable else {}
        self.replicas: dict[str, int] = {stable: stable_replicas} if stable else {}
        self.gates = gates
        self.stable_gates = stable_gates  # what the gates read of the stable at its n-th asking, before the first shift
        self.stable_gate_queries = 0
        self.hook = hook
        self.checksum_ok = checksum_ok
        self.warm_up_errors = warm_up_errors
        self.sweep = sweep  # a batching sweep's point per setting (None: the sweep fails)
        # what read_canary_fleet finds at its n-th call (None: every pod the step sized Ready, 10 req/s on each)
        self.canary_fleet = canary_fleet
        self.fleet_reads = 0
        self.calls: list[tuple[str, Any]] = []
        self.times: list[datetime] = []
        self.gate_queries: dict[int, int] = {}
        self.cancelled: list[str] = []
        self.events: list[tuple[str, Any]] = []
        self.notify_fails = notify_fails  # every notice delivery fails, as an unreachable API server would
        self.notices: list[NoticeInput] = []  # delivered (or attempted) notices, apart from the cluster calls

    @property
    def handle(self) -> WorkflowHandle:
        return self.client.get_workflow_handle(self.workflow_id)

    async def _record(self, name: str, arg: Any) -> None:
        self.calls.append((name, arg))
        self.times.append(activity.info().current_attempt_scheduled_time)  # virtual time
        if self.hook is not None and await self.hook(self, name, arg):
            try:
                for _ in range(500):
                    activity.heartbeat()
                    await asyncio.sleep(0.02)
                raise AssertionError(f"{name} was never cancelled")
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def routes(self) -> list[dict[str, int]]:
        return [arg.weights for name, arg in self.calls if name == SET_ROUTE_WEIGHTS]

    def scales(self) -> list[tuple[str, int]]:
        return [(arg.version, arg.replicas) for name, arg in self.calls if name == SCALE_VERSION]

    def activities(self) -> list[Callable]:
        return [
            self.check_search_attributes,
            self.set_registry_status,
            self.record_registry_benchmark,
            self.read_golden_set,
            self.resolve_registry_weights,
            self.stage_weights,
            self.describe_deployment,
            self.ensure_version,
            self.scale_version,
            self.wait_ready,
            self.set_route_weights,
            self.warm_up,
            self.query_gates,
            self.sweep_batching,
            self.set_engine_args,
            self.read_canary_fleet,
            self.notify,
        ]

    # bookkeeping (registry, metrics): recorded apart from the cluster calls
    @activity.defn(name=SET_REGISTRY_STATUS)
    async def set_registry_status(self, input: SetRegistryStatusInput) -> RegistryStatusResult:
        self.events.append((SET_REGISTRY_STATUS, input))
        return RegistryStatusResult(status=input.status)

    @activity.defn(name=RECORD_REGISTRY_BENCHMARK)
    async def record_registry_benchmark(self, input: RecordRegistryBenchmarkInput) -> None:
        self.events.append((RECORD_REGISTRY_BENCHMARK, input))

    @activity.defn(name="read_golden_set")
    async def read_golden_set(self, input: GoldenSetInput) -> GoldenSetFound:
        return GoldenSetFound()  # no golden set: the quality gates have tests of their own

    def recorded(self, name: str) -> list[Any]:
        return [arg for n, arg in self.events if n == name]

    def metric(self, metric: telemetry.Metric) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of every recording of ``metric`` for this fleet's deployment, in order."""
        _SEEN.extend(METRICS.retrieve_updates())
        return [
            (dict(u.attributes), u.value)
            for u in _SEEN
            if u.metric.name == metric.name and u.attributes.get("deployment") == self.deployment
        ]

    def outcomes(self) -> list[tuple[str, str]]:
        """(outcome, stage) of every rollout this fleet saw end."""
        return [(labels["outcome"], labels["stage"]) for labels, _ in self.metric(telemetry.ROLLOUTS)]

    def verdicts(self) -> list[dict[str, str]]:
        return [labels for labels, _ in self.metric(telemetry.GATE_VERDICTS)]

    @activity.defn(name=RESOLVE_REGISTRY_WEIGHTS)
    async def resolve_registry_weights(self, input: RegistryWeightsInput) -> RegistryWeights:
        await self._record(RESOLVE_REGISTRY_WEIGHTS, input)
        return RegistryWeights(
            files=[WeightFile(uri=f"s3://models/{input.model}/{input.version}/w.safetensors", sha256=SHA)]
        )

    @activity.defn(name=STAGE_WEIGHTS)
    async def stage_weights(self, input: StageWeightsInput) -> StagedWeights:
        await self._record(STAGE_WEIGHTS, input)
        if not self.checksum_ok:
            raise ApplicationError(
                f"checksum mismatch for {input.files[0].uri}: expected {input.files[0].sha256}, actual {'cd' * 32}",
                type="ChecksumMismatch",
                non_retryable=True,
            )
        return StagedWeights(path=f"/models/{input.model}/{input.version}", size_bytes=10, seconds=1.0)

    @activity.defn(name="check_search_attributes")
    async def check_search_attributes(self) -> list[str]:
        return []  # the time-skipping server has them (tests/servers.py); not a cluster call, not recorded

    @activity.defn(name=DESCRIBE_DEPLOYMENT)
    async def describe_deployment(self, input: DeploymentRef) -> DeploymentState:
        await self._record(DESCRIBE_DEPLOYMENT, input)
        versions = [
            VersionInfo(version=v, model="llama", replicas=n, ready_replicas=n, route_weight=self.route.get(v, 0))
            for v, n in self.replicas.items()
        ]
        return DeploymentState(route_exists=bool(self.route), versions=versions)

    @activity.defn(name=ENSURE_VERSION)
    async def ensure_version(self, input: EnsureVersionInput) -> None:
        await self._record(ENSURE_VERSION, input)
        self.replicas[input.version] = input.replicas

    @activity.defn(name=SCALE_VERSION)
    async def scale_version(self, input: ScaleVersionInput) -> None:
        await self._record(SCALE_VERSION, input)
        self.replicas[input.version] = input.replicas

    @activity.defn(name=WAIT_READY)
    async def wait_ready(self, input: WaitReadyInput) -> ReadyResult:
        await self._record(WAIT_READY, input)
        return ReadyResult(ready_replicas=input.replicas, seconds=42.0)

    @activity.defn(name=SET_ROUTE_WEIGHTS)
    async def set_route_weights(self, input: RouteWeightsInput) -> None:
        await self._record(SET_ROUTE_WEIGHTS, input)
        assert sum(input.weights.values()) == 100
        self.route = dict(input.weights)

    @activity.defn(name=WARM_UP)
    async def warm_up(self, input: WarmUpInput) -> Benchmark:
        await self._record(WARM_UP, input)
        return Benchmark(
            requests=input.requests,
            errors=self.warm_up_errors,
            tokens_per_second=850.0,
            p50_latency_seconds=0.4,
            p99_latency_seconds=0.9,
        )

    @activity.defn(name=SWEEP_BATCHING)
    async def sweep_batching(self, input: SweepBatchingInput) -> SweepBatchingResult:
        await self._record(SWEEP_BATCHING, input)
        if self.sweep is None:
            raise ApplicationError("warm-up: 64 of 64 requests failed", non_retryable=True)
        return SweepBatchingResult(points=[self.sweep(s) for s in input.candidates], prompt_tokens=500, output_tokens=100)

    @activity.defn(name=SET_ENGINE_ARGS)
    async def set_engine_args(self, input: EngineArgsInput) -> None:
        await self._record(SET_ENGINE_ARGS, input)

    @activity.defn(name=READ_CANARY_FLEET)
    async def read_canary_fleet(self, input: CanaryFleetInput) -> CanaryFleet:
        """A read, not a cluster change: kept with the bookkeeping, not in ``calls``."""
        self.fleet_reads += 1
        self.events.append((READ_CANARY_FLEET, input))
        if self.canary_fleet is not None:
            return self.canary_fleet(input, self.fleet_reads)
        stable = next((n for v, n in self.replicas.items() if v != input.version), 0)
        return CanaryFleet(weight=input.weight, canary_wanted=input.canary_wanted, canary_ready=input.canary_wanted,
                           stable_ready=stable, canary_rps=10.0 * input.canary_wanted, stable_rps=10.0 * stable)
    @activity.defn(name=NOTIFY)
    async def notify(self, input: NoticeInput) -> None:
        self.notices.append(input)
        if self.notify_fails:
            raise ApplicationError("events are forbidden")

    @activity.defn(name=QUERY_GATES)
    async def query_gates(self, input: GateQueriesInput) -> GateQueriesResult:
        if input.variables["version"] == input.variables["stable_version"]:  # the gates asked about the stable
            self.stable_gate_queries += 1
            self.events.append((QUERY_GATES, input))
            values = self.stable_gates(self.stable_gate_queries)
        else:
            weight = self.route.get(input.variables["version"], 0)
            n = self.gate_queries[weight] = self.gate_queries.get(weight, 0) + 1
            await self._record(QUERY_GATES, input)
            values = self.gates(weight, n)
        if isinstance(values, Exception):
            raise values
        if isinstance(values, GateQueriesResult):
            return values
        return GateQueriesResult(values={gate: v for gate, v in values.items() if gate in input.queries})  # as Prometheus answers


@functools.cache
def metered_runtime() -> Runtime:
    """The one runtime whose metrics go to METRICS (a metric buffer belongs to one runtime)."""
    return Runtime(telemetry=TelemetryConfig(metrics=METRICS))


@pytest.fixture
async def metered_env():
    """A time-skipping server per test (see tests/workflows/conftest.py), its runtime's metrics
    going to METRICS."""
    async with time_skipping(metered_runtime()) as env:
        yield env


@pytest.fixture
async def client(metered_env) -> Client:
    return metered_env.client


def rollout_input(**overrides: Any) -> RolloutInput:
    fields = {
        "deployment": f"llm-serving/chat-{uuid.uuid4().hex[:8]}",
        "model": "llama",
        "version": NEW,
        "image": "vllm/vllm-openai:v0.6.3",
        "weights_uri": "s3://tideplane-models/llama/1.3.0/model.safetensors",
        "sha256": SHA,
        "steps": SHORT,
    }
    return RolloutInput.model_validate({**fields, **overrides})


def worker(fleet: Fleet, queue: str) -> Worker:
    return Worker(
        fleet.client,
        task_queue=queue,
        workflows=[ModelRollout, RetireVersion],
        activities=[*fleet.activities(), RetireScheduling().schedule_retire, RetireScheduling().cancel_retire],
        max_heartbeat_throttle_interval=timedelta(milliseconds=50),  # cancellation reaches stubs at once
        graceful_shutdown_timeout=timedelta(seconds=1),
    )


async def run_rollout(fleet: Fleet, inp: RolloutInput, until: Callable[[WorkflowHandle], Awaitable[Any]] | None = None):
    """Start the rollout with a worker running the stubs; return the result, promoted or not (a
    rolled-back or aborted run fails with it), or raise any other failure."""
    queue = f"rollout-test-{uuid.uuid4().hex[:8]}"
    async with worker(fleet, queue):
        handle = await start_rollout(fleet.client, inp, task_queue=queue)
        fleet.workflow_id = handle.id
        fleet.deployment = inp.deployment.split("/")[1]
        try:
            if until is not None:
                result = asyncio.ensure_future(rollout_result(handle))  # lets virtual time run meanwhile
                await until(handle)
                return await result
            return await rollout_result(handle)
        finally:
            await _terminate_if_running(handle)
            await retired(fleet, inp.deployment)


async def retired(fleet: Fleet, deployment: str) -> list[str]:
    """The delayed scale-downs the rollout left (RetireVersion workflows), run to their end."""
    results = []
    for version in (STABLE, NEW):
        handle = fleet.client.get_workflow_handle(retire_workflow_id(deployment, version))
        try:
            status = (await handle.describe()).status
        except RPCError:
            continue  # none for this version
        if status is not None and status.name == "CANCELED":
            continue  # a later rollout of this version took it back
        async with time_running(fleet.client):
            results.append(await closed_result(handle))
    return results



@asynccontextmanager
async def time_running(client: Client) -> AsyncIterator[None]:
    """Let virtual time run while awaiting a workflow the test did not start itself (the test
    environment unlocks time skipping only for the handles its own start_workflow returned)."""
    await client.test_service.unlock_time_skipping(UnlockTimeSkippingRequest())
    try:
        yield
    finally:
        await client.test_service.lock_time_skipping(LockTimeSkippingRequest())


async def _terminate_if_running(handle: WorkflowHandle) -> None:
    desc = await handle.describe()
    if desc.status is not None and desc.status.name == "RUNNING":
        await handle.terminate("test over")


async def wait_status(handle: WorkflowHandle, predicate: Callable[[Any], bool], timeout: float = 10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        status = await handle.query(ModelRollout.status)
        if predicate(status):
            return status
        assert asyncio.get_running_loop().time() < deadline, f"status never matched: {status}"
        await asyncio.sleep(0.05)


def assert_rolled_back_route_first(fleet: Fleet, canary_weight: int) -> None:
    """The route went back to stable, then (last) the canary was scaled down; stable never scaled."""
    names = fleet.names()
    revert = len(names) - 1 - names[::-1].index(SET_ROUTE_WEIGHTS)
    assert fleet.calls[revert][1].weights == {STABLE: 100, NEW: 0} and fleet.calls[revert][1].stable == STABLE
    after = [(n, a) for n, a in fleet.calls[revert + 1 :] if n != DESCRIBE_DEPLOYMENT]  # RetireVersion's read
    assert [(n, a.version, a.replicas) for n, a in after] == [(SCALE_VERSION, NEW, 0)]
    assert fleet.scales().count((NEW, 0)) == 1
    assert fleet.times[-1] - fleet.times[revert] >= timedelta(seconds=600), "canary kept warm for the delay"
    assert all(v != STABLE for v, _ in fleet.scales()), "stable must stay at full size"
    assert max(r.get(NEW, 0) for r in fleet.routes()) == canary_weight
    assert fleet.route == {STABLE: 100, NEW: 0}


# ---- happy paths ------------------------------------------------------------------------------


async def test_happy_path_default_ladder_promotes(client):
    fleet = Fleet(client, stable_replicas=4)
    inp = rollout_input(steps=[s.model_dump() for s in DEFAULT_STEPS])
    result = await run_rollout(fleet, inp)

    assert result.outcome is Outcome.PROMOTED and result.previous_version == STABLE
    assert fleet.routes() == [
        {STABLE: 100, NEW: 0},
        {STABLE: 99, NEW: 1},
        {STABLE: 95, NEW: 5},
        {STABLE: 50, NEW: 50},
        {STABLE: 0, NEW: 100},
    ]
    # which version is stable is the rollout's record on the route (issue 32), never a sort order
    assert [arg.stable for name, arg in fleet.calls if name == SET_ROUTE_WEIGHTS] == [STABLE] * 4 + [NEW]
    # canary sized for its share of 4 replicas, full size before 100 %, old version down last
    assert fleet.calls[fleet.names().index(ENSURE_VERSION)][1].replicas == 1
    assert fleet.scales() == [(NEW, 2), (NEW, 4), (STABLE, 0)]
    promoted_at = fleet.times[len(fleet.names()) - 1 - fleet.names()[::-1].index(SET_ROUTE_WEIGHTS)]
    assert fleet.times[-1] - promoted_at >= timedelta(seconds=600), "old version kept warm for the delay"
    assert fleet.names().index(SET_ROUTE_WEIGHTS, fleet.names().index(WARM_UP)) > fleet.names().index(WARM_UP)
    # default windows 10/30/30 min at one gate per minute
    assert fleet.gate_queries == {1: 10, 5: 30, 50: 30}
    assert result.cold_start_seconds == 42.0 and result.benchmark.tokens_per_second == 850.0
    assert result.weight_reached == 100 and result.staged.path == "/models/llama/1.3.0"
    assert result.timings["canary"] >= 70 * 60

    handle = client.get_workflow_handle(fleet.workflow_id)
    desc = await handle.describe()
    attrs = desc.typed_search_attributes
    assert attrs.get(sa.STAGE) == Stage.PROMOTED.value and attrs.get(sa.CANARY_PERCENT) == 100
    assert attrs.get(sa.DEPLOYMENT) == inp.deployment and attrs.get(sa.VERSION) == NEW
    # the variables handed to the gate queries
    gate_input = next(arg for name, arg in fleet.calls if name == QUERY_GATES)
    assert gate_input.variables["stable_version"] == STABLE and gate_input.variables["window"] == "60s"
    assert set(gate_input.queries) == set(canary.GATE_NAMES)
    # control-plane metrics; no registry writes for weights given by URI
    assert fleet.outcomes() == [("promoted", "promoted")]
    assert {v["verdict"] for v in fleet.verdicts()} == {"pass"}
    assert len(fleet.verdicts()) == 70
    assert not fleet.recorded(SET_REGISTRY_STATUS)
    # and the code replays its own history (no non-determinism)
    replayer = Replayer(workflows=[ModelRollout], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(await handle.fetch_history())


async def test_first_deploy_skips_the_ladder(client):
    fleet = Fleet(client, stable=None)
    result = await run_rollout(fleet, rollout_input(replicas=3))
    assert result.outcome is Outcome.PROMOTED and result.previous_version is None
    assert fleet.names() == [STAGE_WEIGHTS, DESCRIBE_DEPLOYMENT, ENSURE_VERSION, WAIT_READY, WARM_UP, SET_ROUTE_WEIGHTS]
    assert fleet.calls[2][1].replicas == 3
    assert fleet.routes() == [{NEW: 100}]


TUNED = BatchingSetting(max_num_seqs=256, max_num_batched_tokens=2048)
SWEEP = {"candidates": [VLLM_DEFAULT.model_dump(), TUNED.model_dump()], "ttft_slo_seconds": 2, "tpot_slo_seconds": 0.1}


async def test_batching_sweep_keeps_the_best_setting_within_the_slo_and_records_it(client):
    measured = {VLLM_DEFAULT: (900.0, 3.1), TUNED: (800.0, 1.2)}  # (tokens/s, TTFT p99): the defaults miss the TTFT SLO
    fleet = Fleet(client, stable=None, sweep=lambda s: SweepPoint(
        setting=s, tokens_per_second=measured[s][0], ttft_p99_seconds=measured[s][1], tpot_p99_seconds=0.05, requests=64, errors=0))
    result = await run_rollout(fleet, rollout_input(weights_uri=None, sha256=None, batching=SWEEP))
    assert result.outcome is Outcome.PROMOTED and result.batching.setting == TUNED
    assert fleet.names()[-5:] == [WAIT_READY, WARM_UP, SWEEP_BATCHING, SET_ENGINE_ARGS, SET_ROUTE_WEIGHTS]  # before any traffic
    assert [arg.setting for name, arg in fleet.calls if name == SET_ENGINE_ARGS] == [TUNED]
    [bench] = fleet.recorded(RECORD_REGISTRY_BENCHMARK)
    assert bench.benchmark.batching.chosen == TUNED and len(bench.benchmark.batching.points) == 2
    replayer = Replayer(workflows=[ModelRollout], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(await fleet.handle.fetch_history())


async def test_a_failed_batching_sweep_rolls_back_before_traffic(client):
    fleet = Fleet(client, sweep=None)
    result = await run_rollout(fleet, rollout_input(batching=SWEEP))
    assert result.outcome is Outcome.ROLLED_BACK and "batching sweep failed: warm-up: 64 of 64" in result.reason
    assert SET_ENGINE_ARGS not in fleet.names() and fleet.route.get(NEW, 0) == 0


async def test_registry_version_resolved_tracked_and_benchmarked(client):
    fleet = Fleet(client)
    result = await run_rollout(fleet, rollout_input(weights_uri=None, sha256=None))
    assert result.outcome is Outcome.PROMOTED
    assert fleet.names()[:2] == [RESOLVE_REGISTRY_WEIGHTS, STAGE_WEIGHTS]
    assert fleet.calls[1][1].files[0].uri == "s3://models/llama/1.3.0/w.safetensors"
    [bench] = fleet.recorded(RECORD_REGISTRY_BENCHMARK)
    assert bench.benchmark.dataset == "warm-up" and bench.benchmark.tokens_per_second == 850.0
    assert bench.benchmark.image == "vllm/vllm-openai:v0.6.3"
    statuses = fleet.recorded(SET_REGISTRY_STATUS)
    assert [(s.status.state, getattr(s.status, "percent", None)) for s in statuses] == [
        ("canary", 1),
        ("canary", 5),
        ("canary", 50),
        ("stable", None),
    ]
    assert statuses[0].status.since == statuses[2].status.since  # canary since the first step
    assert statuses[-1].demote_previous


async def test_registry_marks_a_failed_canary_deprecated_and_an_aborted_one_testing(client):
    bad = Fleet(client, gates=lambda w, n: {**GOOD, canary.ERROR_RATE: 0.3} if w == 5 else GOOD)
    await run_rollout(bad, rollout_input(weights_uri=None, sha256=None))
    assert [s.status.state for s in bad.recorded(SET_REGISTRY_STATUS)] == ["canary", "canary", "deprecated"]
    assert bad.outcomes() == [("rolled_back", "canary-5")]
    assert len(bad.metric(telemetry.ROLLBACK_SECONDS)) == 1  # the rollback's duration was measured
    fail = [v for v in bad.verdicts() if v["verdict"] == "fail"]
    assert [v["gate"] for v in fail] == [canary.ERROR_RATE]

    aborted = Fleet(client, hook=_abort_when(QUERY_GATES, 1))
    await run_rollout(aborted, rollout_input(weights_uri=None, sha256=None))
    assert [s.status.state for s in aborted.recorded(SET_REGISTRY_STATUS)] == ["canary", "testing"]


async def test_current_details_show_every_fresh_verdict_and_the_list_reads_without_opening(client):
    """Issue 16 item 8: at 5 % the details still said "last verdict at 1 %"."""
    seen: list[str] = []

    async def read_details(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5 and fleet.gate_queries[5] == 3:
            meta = await fleet.handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
            seen.append(meta.current_details)

    fleet = Fleet(client, hook=read_details)
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.PROMOTED
    [details] = seen
    # two verdicts at 5 % were taken before the third query: the details show the second, with numbers
    assert "verdict 5 at 5 %" in details and "pass: requests 600" in details and "error_rate 0.001" in details
    assert "step: 2 pass, 0 fail" in details and "at 1 %" not in details

    desc = await fleet.handle.describe()
    assert await desc.static_summary() == f"Roll out llama {NEW} to llm-serving/{fleet.deployment}"
    static = await desc.static_details()
    assert f"deployment llm-serving/{fleet.deployment}" in static and "model llama" in static
    assert "ladder 1 % (180s) → 5 % (180s) → 50 % (180s) → 100 %" in static


# ---- gates ------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight", [1, 5, 50])
@pytest.mark.parametrize("gate", [canary.ERROR_RATE, canary.P99_LATENCY, canary.TTFT_P99, canary.TPOT_P99])
async def test_failing_gate_rolls_back_route_first(client, gate, weight):
    fleet = Fleet(client, gates=lambda w, n: {**GOOD, gate: BAD[gate]} if w == weight and n == 2 else GOOD)
    result = await run_rollout(fleet, rollout_input())

    assert result.outcome is Outcome.ROLLED_BACK
    assert [c.gate for c in result.failed_gates] == [gate]
    assert result.failed_gates[0].value == BAD[gate]
    assert result.failing_verdict.weight == weight and gate in result.reason
    assert 0 <= result.route_reverted_seconds < 60
    assert fleet.gate_queries[weight] == 2
    assert_rolled_back_route_first(fleet, weight)


async def test_failure_limit_tolerates_configured_failures(client):
    fleet = Fleet(client, gates=lambda w, n: {**GOOD, canary.ERROR_RATE: 0.5} if w == 5 and n == 1 else GOOD)
    result = await run_rollout(fleet, rollout_input(analysis={"failure_limit": 1}))
    assert result.outcome is Outcome.PROMOTED
    assert fleet.gate_queries[5] == 4  # the failed observation does not count as a pass


async def test_inconclusive_waits_longer_then_pauses_never_promotes(client):
    few = {**GOOD, canary.REQUEST_COUNT: 7.0}
    fleet = Fleet(client, gates=lambda w, n: few if w == 5 else GOOD)

    async def operator(handle: WorkflowHandle) -> None:
        status = await wait_status(handle, lambda s: s.paused)
        assert status.stage is Stage.PAUSED and status.weight == 5
        assert "too few samples" in status.pause_reason and "7 requests" in status.pause_reason
        assert status.analysis.inconclusives == 3 and status.last_verdict.evaluation.verdict.value == "inconclusive"
        await asyncio.sleep(0.3)  # virtual time runs: a paused rollout measures nothing more
        assert fleet.gate_queries[5] == 3
        await handle.signal(ModelRollout.abort, AbortInput(reason="not enough traffic to judge"))

    result = await run_rollout(fleet, rollout_input(analysis={"inconclusive_limit": 2}), until=operator)
    assert result.outcome is Outcome.ABORTED and result.reason == "not enough traffic to judge"
    assert max(r[NEW] for r in fleet.routes()) == 5
    assert_rolled_back_route_first(fleet, 5)


async def test_a_gate_metric_without_any_series_pauses_at_once_naming_it(client):
    """Issue 30: on a vLLM that no longer exports the TPOT histogram a gate reads, every observation
    was "inconclusive" until the limit; now the first one with requests flowing pauses and says which."""
    no_tpot = GateQueriesResult(values={**GOOD, canary.TPOT_P99: None}, no_series=[canary.TPOT_P99])
    fleet = Fleet(client, gates=lambda w, n: no_tpot if w == 1 else GOOD)

    async def operator(handle: WorkflowHandle) -> None:
        status = await wait_status(handle, lambda s: s.paused)
        assert status.weight == 1 and fleet.gate_queries[1] == 1  # the first observation, not the tenth
        assert status.pause_reason.startswith("metric missing: vllm:request_time_per_output_token_seconds_bucket at 1 %")
        assert "tpot_p99" in status.pause_reason and "requests flowed" in status.pause_reason
        assert status.last_verdict.evaluation.metric_missing == ["vllm:request_time_per_output_token_seconds_bucket"]
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "paused: metric missing: vllm:request_time_per_output_token_seconds_bucket" in meta.current_details
        await handle.signal(ModelRollout.abort, AbortInput(reason="fix the scrape"))

    result = await run_rollout(fleet, rollout_input(), until=operator)
    assert result.outcome is Outcome.ABORTED
    assert max(r[NEW] for r in fleet.routes()) == 1


async def test_a_gate_that_reads_nothing_of_the_stable_pauses_before_any_traffic_moves(client):
    """A gateway without per-backend counters (or an unscraped metric) reads nothing of the version
    already serving: the rollout says so before the first shift, not after 1 % went to the canary; a
    resume asks the gates again and goes on once they read the stable."""
    no_gateway = GateQueriesResult(values={**GOOD, canary.GATEWAY_ERROR_RATE: None}, no_series=[canary.GATEWAY_ERROR_RATE])
    fleet = Fleet(client, stable_gates=lambda n: no_gateway if n == 1 else GOOD)

    async def operator(handle: WorkflowHandle) -> None:
        status = await wait_status(handle, lambda s: s.stage is Stage.PAUSED)
        assert status.pause_reason.startswith("metric missing: envoy_cluster_upstream_cx_none_healthy, envoy_cluster_upstream_rq_total,")
        assert f"on the stable {STABLE} before any traffic moved" in status.pause_reason
        assert all(r.get(NEW, 0) == 0 for r in fleet.routes()) and fleet.gate_queries == {}  # nothing on the canary, no canary verdict
        await handle.signal(ModelRollout.resume, ResumeInput())

    result = await run_rollout(fleet, rollout_input(), until=operator)
    assert result.outcome is Outcome.PROMOTED
    assert fleet.stable_gate_queries == 2
    assert [n.kind for n in fleet.notices][:2] == [NoticeKind.PAUSED, NoticeKind.RESUMED]


async def test_a_quiet_stable_proves_nothing_and_the_canary_starts(client):
    """Below min_requests on the stable no series is no evidence (a quiet hour): no pause at start."""
    quiet = GateQueriesResult(values={canary.REQUEST_COUNT: 3.0}, no_series=[canary.TTFT_P99, canary.TPOT_P99])
    fleet = Fleet(client, stable_gates=lambda n: quiet)
    result = await run_rollout(fleet, rollout_input(), until=None)
    assert result.outcome is Outcome.PROMOTED and fleet.stable_gate_queries == 1


async def test_metrics_unavailable_pauses_and_resume_continues(client):
    prometheus_up = False

    def gates(weight: int, n: int):
        if weight == 50 and not prometheus_up:
            return ApplicationError("connection refused: prometheus:9090", type="PrometheusUnavailable")
        return GOOD

    fleet = Fleet(client, gates=gates)

    async def operator(handle: WorkflowHandle) -> None:
        nonlocal prometheus_up
        status = await wait_status(handle, lambda s: s.paused)
        assert status.weight == 50 and "metrics unavailable" in status.pause_reason
        assert "connection refused" in status.pause_reason
        assert status.analysis.errors == 3 and status.analysis.consecutive_errors == 3
        assert NEW not in fleet.route or fleet.route[NEW] == 50  # never promoted blind
        prometheus_up = True
        await handle.signal(ModelRollout.resume, ResumeInput())

    result = await run_rollout(fleet, rollout_input(analysis={"metric_error_limit": 2}), until=operator)
    assert result.outcome is Outcome.PROMOTED
    assert fleet.gate_queries[50] == 3 * 3 + 3  # three retried measurements, then three good ones


async def test_pause_resume(client):
    async def pause_at_second_gate(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.gate_queries.get(1) == 2 and fleet.route.get(NEW) == 1:
            await fleet.handle.signal(ModelRollout.pause, PauseInput(reason="looking at dashboards"))

    fleet = Fleet(client, hook=pause_at_second_gate)

    async def operator(handle: WorkflowHandle) -> None:
        # the signal sets ``paused`` at once; the rollout holds (stage paused) at its next checkpoint
        status = await wait_status(handle, lambda s: s.stage is Stage.PAUSED)
        assert status.paused and status.pause_reason == "looking at dashboards"
        await asyncio.sleep(0.3)
        assert fleet.gate_queries == {1: 2} and fleet.route == {STABLE: 99, NEW: 1}
        await handle.signal(ModelRollout.resume, ResumeInput())

    result = await run_rollout(fleet, rollout_input(), until=operator)
    assert result.outcome is Outcome.PROMOTED
    assert fleet.gate_queries == {1: 3, 5: 3, 50: 3}
    # paused, resumed, then cleared as the rollout ended promoted
    assert [value for _, value in fleet.metric(telemetry.ROLLOUT_PAUSED)] == [1, 0, 0]
    assert fleet.outcomes() == [("promoted", "promoted")]


async def test_pause_longer_than_its_deadline_rolls_back(client):
    async def pause_at_5(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5:
            await fleet.handle.signal(ModelRollout.pause, PauseInput(reason="gone to lunch"))

    fleet = Fleet(client, hook=pause_at_5)
    result = await run_rollout(fleet, rollout_input(deadlines={"pause_seconds": 5400}))
    assert result.outcome is Outcome.ROLLED_BACK
    assert "paused longer than 5400s" in result.reason and "gone to lunch" in result.reason
    assert fleet.gate_queries == {1: 3, 5: 1}
    assert_rolled_back_route_first(fleet, 5)


async def test_new_version_that_cannot_serve_is_rolled_back_after_warm_up(client):
    fleet = Fleet(client, warm_up_errors=20)
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.ROLLED_BACK and "all 20 requests" in result.reason
    assert QUERY_GATES not in fleet.names()
    assert_rolled_back_route_first(fleet, 0)


# ---- abort, cancel, promote -------------------------------------------------------------------


def _abort_when(stage_call: str, weight: int | None = None) -> Hook:
    async def hook(fleet: Fleet, name: str, arg: Any) -> None:
        if name == stage_call and (weight is None or fleet.route.get(NEW) == weight):
            await fleet.handle.signal(ModelRollout.abort, AbortInput(reason=f"abort at {stage_call}"))
            return stage_call in (STAGE_WEIGHTS, WAIT_READY, WARM_UP)
        return False

    return hook


async def test_abort_while_staging_touches_nothing(client):
    fleet = Fleet(client, hook=_abort_when(STAGE_WEIGHTS))
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.ABORTED and result.reason == f"abort at {STAGE_WEIGHTS}"
    assert not set(fleet.names()) & set(CLUSTER_CHANGES)
    assert fleet.cancelled == [STAGE_WEIGHTS]


@pytest.mark.parametrize(
    "stage_call, weight", [(WAIT_READY, None), (WARM_UP, None), (QUERY_GATES, 1), (QUERY_GATES, 50)]
)
async def test_abort_after_the_new_version_started_rolls_back(client, stage_call, weight):
    fleet = Fleet(client, hook=_abort_when(stage_call, weight))
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.ABORTED and result.reason == f"abort at {stage_call}"
    assert_rolled_back_route_first(fleet, weight or 0)
    if stage_call != QUERY_GATES:
        assert fleet.cancelled == [stage_call]  # the long activity was cancelled, not waited out


async def test_an_abort_with_a_payload_it_does_not_understand_still_aborts(client):
    """``abort --input '{"message":"x"}'``: abort is abort; the reason says what was not understood."""

    async def abort_at_1(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 1:
            await fleet.handle.signal("abort", {"message": "x"})

    fleet = Fleet(client, hook=abort_at_1)
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.ABORTED
    assert result.reason.startswith("aborted by operator (abort payload not understood: message: Extra inputs are not permitted")
    assert_rolled_back_route_first(fleet, 1)


@pytest.mark.parametrize("payload, reason", [("gone to lunch", "gone to lunch"), ({"reason": 5}, "paused by operator (pause payload")])
async def test_a_pause_with_a_payload_it_does_not_understand_still_pauses(client, payload, reason):
    async def pause_at_5(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5 and fleet.gate_queries.get(5) == 1:
            await fleet.handle.signal("pause", payload)

    fleet = Fleet(client, hook=pause_at_5)

    async def operator(handle: WorkflowHandle) -> None:
        status = await wait_status(handle, lambda s: s.paused)
        assert status.pause_reason.startswith(reason), status.pause_reason
        await handle.signal("resume", ["anything"])

    result = await run_rollout(fleet, rollout_input(), until=operator)
    assert result.outcome is Outcome.PROMOTED


async def test_abort_while_paused(client):
    async def pause_early(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5:
            await fleet.handle.signal(ModelRollout.pause, PauseInput())

    fleet = Fleet(client, hook=pause_early)

    async def operator(handle: WorkflowHandle) -> None:
        await wait_status(handle, lambda s: s.paused)
        await handle.signal(ModelRollout.abort, AbortInput(reason="bad vibes"))

    result = await run_rollout(fleet, rollout_input(), until=operator)
    assert result.outcome is Outcome.ABORTED and result.reason == "bad vibes"
    assert_rolled_back_route_first(fleet, 5)


@pytest.mark.parametrize("how, error_type, outcome", [("gate", "RolledBack", Outcome.ROLLED_BACK), ("abort", "Aborted", Outcome.ABORTED)])
async def test_a_rollout_that_does_not_promote_fails_and_its_result_stays_queryable(client, how, error_type, outcome):
    """Issue 35: a rollback is no success. The run fails (red in the web UI, non-zero from
    `temporal workflow execute`) with a typed, non-retryable error whose message is the verdict;
    the whole result is in its details and answers the `result` query after the run closed."""
    failing = {**GOOD, canary.ERROR_RATE: BAD[canary.ERROR_RATE]}
    if how == "gate":
        fleet = Fleet(client, gates=lambda w, n: failing if w == 5 else GOOD)
    else:
        fleet = Fleet(client, hook=_abort_when(QUERY_GATES, 5))
    inp = rollout_input()
    queue = f"rollout-test-{uuid.uuid4().hex[:8]}"
    async with worker(fleet, queue):
        handle = await start_rollout(client, inp, task_queue=queue)
        fleet.workflow_id = handle.id
        with pytest.raises(WorkflowFailureError) as info:
            await handle.result()
        error = info.value.cause
        assert isinstance(error, ApplicationError) and error.type == error_type and error.non_retryable
        assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
        # queried after close: the worker replays the history and answers
        result = await handle.query(ModelRollout.result)
        assert result.outcome is outcome and result.reason == error.message
        assert (await handle.query(ModelRollout.status)).stage is Stage.ROLLED_BACK
        assert await rollout_result(handle) == result
        if how == "gate":
            assert canary.ERROR_RATE in error.message and [g.gate for g in result.failed_gates] == [canary.ERROR_RATE]
        else:
            assert error.message == f"abort at {QUERY_GATES}"
        await Replayer(workflows=[ModelRollout], data_converter=pydantic_data_converter).replay_workflow(await handle.fetch_history())
        await retired(fleet, inp.deployment)  # the canary's delayed scale-down needs this worker to end


async def test_cancellation_rolls_back_like_abort(client):
    async def cancel_at_5(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5:
            await fleet.handle.cancel()

    fleet = Fleet(client, hook=cancel_at_5)
    with pytest.raises(WorkflowFailureError) as info:
        await run_rollout(fleet, rollout_input())
    assert isinstance(info.value.cause, CancelledError)
    assert_rolled_back_route_first(fleet, 5)


async def test_promote_ends_the_current_step(client):
    async def promote_at_1(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 1:
            ack = await fleet.handle.execute_update(ModelRollout.promote, PromoteInput())
            assert ack.weight == 1 and "current step" in ack.accepted

    fleet = Fleet(client, hook=promote_at_1)
    result = await run_rollout(
        fleet, rollout_input(steps=[{"weight": 1, "window_seconds": 3600}, {"weight": 5, "window_seconds": 120}])
    )
    assert result.outcome is Outcome.PROMOTED
    assert fleet.gate_queries == {1: 1, 5: 2}
    assert [r[NEW] for r in fleet.routes()] == [0, 1, 5, 100]


async def test_promote_full_skips_remaining_steps(client):
    async def promote_full_at_5(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5:
            await fleet.handle.execute_update(ModelRollout.promote, PromoteInput(full=True))

    fleet = Fleet(client, hook=promote_full_at_5, stable_replicas=10)
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.PROMOTED
    assert [r[NEW] for r in fleet.routes()] == [0, 1, 5, 100]
    assert fleet.gate_queries == {1: 3, 5: 1}
    # scaled to full size before the route moved to 100 %, the old version after
    assert fleet.scales() == [(NEW, 10), (STABLE, 0)]
    assert fleet.names().index(SCALE_VERSION) < len(fleet.names()) - 1


async def test_the_canary_and_the_promoted_version_follow_the_live_total(client):
    """Issue 32: the rollout sized itself once, from the stable's replicas at start. Demand doubles
    during the 5 % step (the scaling loop grows the stable 4 -> 8): the 50 % step gives the canary
    its share of 8, promotion sizes the new version to 8 and waits until 8 are Ready before the route
    moves to 100 % (the old version retires only once the new one carries the load)."""

    async def loop_doubles_the_stable(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5:
            fleet.replicas[STABLE] = 8

    fleet = Fleet(client, hook=loop_doubles_the_stable, stable_replicas=4)
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.PROMOTED
    assert fleet.scales() == [(NEW, 4), (NEW, 8), (STABLE, 0)]  # 50 % of 8, then all of 8
    names = fleet.names()
    promoted = len(names) - 1 - names[::-1].index(SET_ROUTE_WEIGHTS)
    waited = [arg.replicas for name, arg in fleet.calls[:promoted] if name == WAIT_READY]
    assert waited[-1] == 8 and fleet.routes()[-1] == {STABLE: 0, NEW: 100}


async def test_promotion_waits_for_the_whole_load_even_at_the_canarys_size(client):
    """One replica: the canary has the promoted size from its start, so nothing is scaled at
    promotion; the promotion still waits, after the last gate, until the new version's Ready
    replicas carry the live total before the route moves to 100 %."""
    fleet = Fleet(client, stable_replicas=1)
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.PROMOTED
    assert fleet.scales() == [(STABLE, 0)]
    names = fleet.names()
    promoted = len(names) - 1 - names[::-1].index(SET_ROUTE_WEIGHTS)
    last_gate = len(names) - 1 - names[::-1].index(QUERY_GATES)
    assert [(n, a.replicas) for n, a in fleet.calls[last_gate:promoted] if n == WAIT_READY] == [(WAIT_READY, 1)]


async def test_promote_refused_when_nothing_to_promote(client):
    refusals: list[str] = []

    async def try_promote(fleet: Fleet, name: str, arg: Any) -> None:
        # the rollout ends once traffic has moved: the last moment to ask is the move to 100 %
        promoting = name == SET_ROUTE_WEIGHTS and arg.weights.get(NEW) == 100
        if name == WARM_UP or promoting:
            with pytest.raises(WorkflowUpdateFailedError) as info:
                await fleet.handle.execute_update(ModelRollout.promote, PromoteInput(full=True))
            refusals.append(str(info.value.cause))

    fleet = Fleet(client, hook=try_promote)
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.PROMOTED
    assert len(refusals) == 2
    assert "nothing to promote" in refusals[0] and "warming_up" in refusals[0]
    assert "nothing to promote" in refusals[1] and "promoting" in refusals[1]


async def test_promote_does_not_silently_clear_a_pause(client):
    """Issue 16 item 14: promote used to end a pause without a word; now it needs force."""
    async def pause_at_5(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5 and fleet.gate_queries[5] == 1:
            await fleet.handle.signal(ModelRollout.pause, PauseInput(reason="looking at dashboards"))

    fleet = Fleet(client, hook=pause_at_5)

    async def operator(handle: WorkflowHandle) -> None:
        await wait_status(handle, lambda s: s.stage is Stage.PAUSED)
        with pytest.raises(WorkflowUpdateFailedError) as info:
            await handle.execute_update(ModelRollout.promote, PromoteInput(full=True))
        refusal = info.value.cause
        assert isinstance(refusal, ApplicationError) and refusal.non_retryable and refusal.type == "RolloutPaused"
        assert "looking at dashboards" in refusal.message and '"force": true' in refusal.message
        assert (await handle.query(ModelRollout.status)).paused  # still held
        ack = await handle.execute_update(ModelRollout.promote, PromoteInput(full=True, force=True))
        assert ack.weight == 5

    result = await run_rollout(fleet, rollout_input(), until=operator)
    assert result.outcome is Outcome.PROMOTED
    assert [r[NEW] for r in fleet.routes()] == [0, 1, 5, 100]


async def test_invalid_promote_input_is_refused_naming_the_field(client):
    """Issue 16 item 13: it came out as raw pydantic text with 'retryable: true'."""
    refusals: list[BaseException] = []

    async def bad_promote(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 1 and not refusals:
            with pytest.raises(WorkflowUpdateFailedError) as info:
                await fleet.handle.execute_update("promote", {"full": "yes please", "fast": True})
            refusals.append(info.value.cause)

    fleet = Fleet(client, hook=bad_promote)
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.PROMOTED  # the refused update changed nothing
    [refusal] = refusals
    assert isinstance(refusal, ApplicationError) and refusal.non_retryable and refusal.type == "InvalidInput"
    assert refusal.message.startswith("invalid promote input: full: Input should be a valid boolean")
    assert "fast: Extra inputs are not permitted" in str(refusal)


# ---- failures before the cluster changes, start rules -----------------------------------------


async def test_another_model_replaces_the_stable_only_when_asked(client):
    """Issue 20: mistral was promoted silently over llama; now it takes replace_model: true."""
    fleet = Fleet(client)
    with pytest.raises(WorkflowFailureError) as info:
        await run_rollout(fleet, rollout_input(model="mistral"))
    message = str(info.value.cause)
    assert "replace_model" in message and "serves model llama" in message and "not mistral" in message
    assert info.value.cause.non_retryable and fleet.names() == [STAGE_WEIGHTS, DESCRIBE_DEPLOYMENT]

    result = await run_rollout(Fleet(client), rollout_input(model="mistral", replace_model=True))
    assert result.outcome is Outcome.PROMOTED


async def test_a_deployment_owned_by_another_rollout_fails_at_once_without_rollback(client):
    """Issue 20: a second rollout under another workflow ID ran beside the first. ensure_version
    claims the route for this workflow's ID; refused, the run fails at once, naming the owner,
    and touches nothing (no rollback of what another rollout owns)."""

    async def owned(fleet: Fleet, name: str, arg: Any) -> bool:
        if name == ENSURE_VERSION:
            assert arg.owner == fleet.workflow_id
            raise ApplicationError(
                "HTTPRoute llm-serving/chat is owned by rollout/other (tideplane.io/owner)", type="DeploymentOwned", non_retryable=True
            )
        return False

    fleet = Fleet(client, hook=owned)
    with pytest.raises(WorkflowFailureError) as info:
        await run_rollout(fleet, rollout_input())
    message = str(info.value.cause)
    assert "ensure_version failed before any cluster change" in message and "owned by rollout/other" in message
    assert fleet.names() == [STAGE_WEIGHTS, DESCRIBE_DEPLOYMENT, ENSURE_VERSION]


async def test_checksum_mismatch_fails_before_any_cluster_change(client):
    fleet = Fleet(client, checksum_ok=False)
    with pytest.raises(WorkflowFailureError) as info:
        await run_rollout(fleet, rollout_input())
    message = str(info.value.cause)
    assert "checksum mismatch" in message and f"expected {SHA}" in message and "actual" in message
    assert fleet.names() == [STAGE_WEIGHTS]


# ---- the rollout's result vs the delayed scale-down (issue 16 item 3) ---------------------------


async def test_result_comes_at_promotion_and_the_next_rollout_starts_at_once(client):
    """The README's ``--fail-existing`` start of the next version must not find the promoted rollout
    still open for the 10-minute scale-down delay; the old version is scaled down later all the same."""
    fleet = Fleet(client, stable_replicas=2)
    inp = rollout_input()
    queue = f"rollout-test-{uuid.uuid4().hex[:8]}"
    async with worker(fleet, queue):
        first = await start_rollout(client, inp, task_queue=queue)
        fleet.workflow_id = first.id
        result = await first.result()
        assert result.outcome is Outcome.PROMOTED
        closed = (await first.describe()).close_time
        # virtual time runs on while result() waits: the retirement's timer may already have fired
        # by now, so the rollout's own last call is the last one scheduled before it closed
        name, promoted_at = [(name, t) for (name, _), t in zip(fleet.calls, fleet.times) if t <= closed][-1]
        assert name == SET_ROUTE_WEIGHTS and fleet.route == {STABLE: 0, NEW: 100}
        assert closed - promoted_at < timedelta(seconds=60), "result due when traffic has moved, not after the delay"
        retire = client.get_workflow_handle(retire_workflow_id(inp.deployment, STABLE))
        assert (await retire.describe()).start_time <= closed  # started by the rollout, before its result

        # start_rollout fails on a running workflow of the same ID, as --fail-existing does
        second = await start_rollout(client, inp.model_copy(update={"version": "1.4.0"}), task_queue=queue)
        assert second.id == first.id
        fleet.workflow_id = second.id
        assert (await second.result()).outcome is Outcome.PROMOTED

        async with time_running(client):
            assert f"{STABLE} scaled to 0" in await retire.result()
        scaled = next(t for (name, arg), t in zip(fleet.calls, fleet.times) if name == SCALE_VERSION and arg.version == STABLE)
        assert scaled - promoted_at >= timedelta(seconds=600), "old version kept warm for the delay"
        async with time_running(client):
            assert "scaled to 0" in await client.get_workflow_handle(retire_workflow_id(inp.deployment, NEW)).result()
        assert fleet.replicas == {STABLE: 0, NEW: 0, "1.4.0": 2} and fleet.route == {NEW: 0, "1.4.0": 100}


async def _retire(fleet: Fleet, version: str, delay_seconds: float) -> str:
    queue = f"retire-test-{uuid.uuid4().hex[:8]}"
    async with worker(fleet, queue):
        return await fleet.client.execute_workflow(
            RetireVersion.run,
            RetireInput(deployment="llm-serving/chat", version=version, delay_seconds=delay_seconds, reason="test"),
            id=f"retire-test-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )


async def test_retire_scales_a_version_without_traffic_to_0_after_the_delay(client):
    fleet = Fleet(client)
    fleet.route, fleet.replicas = {STABLE: 0, NEW: 100}, {STABLE: 4, NEW: 4}
    assert "scaled to 0" in await _retire(fleet, STABLE, 600)
    assert fleet.scales() == [(STABLE, 0)] and fleet.replicas == {STABLE: 0, NEW: 4}
    assert fleet.times[-1] - fleet.times[0] < timedelta(seconds=1)  # the read just before scaling
    assert fleet.names() == [DESCRIBE_DEPLOYMENT, SCALE_VERSION]


async def test_retire_leaves_a_version_alone_that_carries_traffic_again(client):
    fleet = Fleet(client)  # STABLE carries 100 % again (a rollback or a rollout back to it)
    assert "left as it is" in await _retire(fleet, STABLE, 600)
    assert fleet.scales() == [] and fleet.replicas == {STABLE: 4}


async def test_a_rollout_of_a_version_with_a_pending_scale_down_cancels_it_first(client):
    """Retrying a rolled-back version within the delay: its pending scale-down must not land mid-rollout."""
    fleet = Fleet(client, stable_replicas=2)
    fleet.replicas[NEW] = 2  # still warm from the rollback, no traffic
    inp = rollout_input()
    queue = f"rollout-test-{uuid.uuid4().hex[:8]}"
    async with worker(fleet, queue):
        pending = await client.start_workflow(
            RetireVersion.run,
            RetireInput(deployment=inp.deployment, version=NEW, delay_seconds=600, reason="rolled back"),
            id=retire_workflow_id(inp.deployment, NEW),
            task_queue=queue,
        )
        handle = await start_rollout(client, inp, task_queue=queue)
        fleet.workflow_id = handle.id
        assert (await handle.result()).outcome is Outcome.PROMOTED
        assert (await pending.describe()).status.name == "CANCELED"
        assert (NEW, 0) not in fleet.scales() and fleet.route == {STABLE: 0, NEW: 100}
        await retired(fleet, inp.deployment)
    assert fleet.replicas == {STABLE: 0, NEW: 2}


async def test_second_start_is_refused(client):
    inp = rollout_input()
    queue = f"nobody-{uuid.uuid4().hex[:8]}"  # no worker: the first run just stays open
    handle = await start_rollout(client, inp, task_queue=queue)
    try:
        with pytest.raises(WorkflowAlreadyStartedError):
            await start_rollout(client, inp.model_copy(update={"version": "1.4.0"}), task_queue=queue)
    finally:
        await handle.terminate("test over")


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"deployment": "no-namespace"}, "deployment"),
        ({"steps": [{"weight": 50, "window_seconds": 60}, {"weight": 5, "window_seconds": 60}]}, "steps"),
        ({"sha256": "not-a-digest"}, "sha256"),
        # issue 20: a huge finite number once froze the run (OverflowError on every task, abort ignored)
        ({"gate_interval_seconds": 1e308}, "gate_interval_seconds"),
        ({"deadlines": {"step_ready_seconds": 1e308}}, "deadlines.step_ready_seconds"),
        ({"deadlines": {"pause_seconds": 1e308}}, "deadlines.pause_seconds"),
        ({"warm_up": {"deadline_seconds": 1e308}}, "warm_up.deadline_seconds"),
        ({"scale_down_delay_seconds": 1e308}, "scale_down_delay_seconds"),
        ({"steps": [{"weight": 5, "window_seconds": 1e308}]}, "steps.0.window_seconds"),
        ({"replicas": 2_147_483_648}, "replicas"),
        ({"gpus_per_replica": 1_000}, "gpus_per_replica"),
        ({"query_window_seconds": 0.4}, "query_window_seconds"),  # rendered [0s] before
        ({"version": "1.3.0+build.5"}, "version"),
    ],
)
async def test_bad_input_fails_at_once_naming_the_field(client, bad, field):
    raw = {**rollout_input().model_dump(mode="json"), **bad}
    fleet = Fleet(client)
    queue = f"rollout-test-{uuid.uuid4().hex[:8]}"
    async with worker(fleet, queue):
        handle = await client.start_workflow(
            "ModelRollout", raw, id=f"rollout/bad/{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        with pytest.raises(WorkflowFailureError) as info:
            await asyncio.wait_for(handle.result(), 10)
    assert field in str(info.value.cause)
    assert fleet.calls == []

