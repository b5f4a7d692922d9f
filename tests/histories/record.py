"""Record replay histories: run a workflow with stub activities and export its history as JSON.

    .venv/bin/python -m tests.histories.record                   # every scenario
    .venv/bin/python -m tests.histories.record return-to-spot    # some
    .venv/bin/python -m tests.histories.record --list

Runs on Temporal's time-skipping test server (tideplane's search attributes registered), so
timers cost nothing and the event sequence is the same every time (only timestamps and run ids
differ). The stubs return fixed answers chosen to walk the workflow through its interesting
branches. The file format is the one ``temporal workflow show --workflow-id X -o json`` writes,
so histories exported from a dev server go in the same folder. A history only replays in
tests/workflows/test_replay.py once its workflow is registered in ``workers.worker.WORKFLOWS``.

``reactive-scaling-before-decide-on-ready.json`` is the ``reactive-scaling`` scenario (same stubs
and input) run on the code before that patch, ``git archive d467039^`` unpacked first on the path
with its old module names (workflows.scaling_workflow, workers.telemetry's record activity): it
holds the branches running loops started on, which today's code must still replay.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel
from temporalio import activity
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowContinuedAsNewError, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.rollout.retire_scheduling import RetireScheduling
from tests.workflows.quality.test_quality_gates import DOSE_WRONG, QualityFleet
from tests.workflows.rollout.test_rollout import BAD, GOOD, SHORT, Fleet, rollout_input
from workers.worker import WORKFLOWS
from workflows.core import search_attributes
from workflows.core.naming import DeploymentRef
from workflows.spot import contract as spot
from workflows.spot.return_to_spot import ReturnToSpot
from workflows.rollout.contract import SCALE_VERSION, ScaleVersionInput
from workflows.rollout.gates import ERROR_RATE
from workflows.rollout.workflow import ModelRollout
from workflows.rollout.client import start_rollout
from workflows.scaling import contract as scaling
from workflows.scaling.decide import ScalingPolicy, Signals
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
RUN_TIMEOUT_SECONDS = 60  # real seconds; virtual time skips every timer, so a run takes about one


@dataclass
class Scenario:
    workflow: type
    input: BaseModel
    activities: Callable[[Client], list]  # fresh stubs per run (they keep state)
    start: Callable[[Client, BaseModel, str, str], Awaitable[WorkflowHandle]] | None = None
    continues_as_new: bool = False  # a loop: record its first run, which ends by continuing as new


def _return_to_spot_stubs(_: Client) -> list:
    """Spot Ready 1/2, then 2/2, a flap back to 1/2 (doubling the delay), then stable until released."""
    ready = iter([1, 2, 1])

    @activity.defn(name="spot_replica_counts")
    async def counts(req: spot.CountsInput) -> spot.CountsResult:
        key = req.deployments[0]
        return spot.CountsResult(counts=[spot.ReplicaCounts(
            namespace=key.namespace, name=key.name, desired=2, ready=next(ready, 2), fallback_desired=2, fallback_ready=2,
        )])

    @activity.defn(name="release_spot_fallback")
    async def release(req: spot.ReleaseFallbackInput) -> spot.FallbackClaims:
        return spot.FallbackClaims(name=f"{req.deployment.name}-od", replicas=0)

    @activity.defn(name="sync_on_demand_pool")
    async def sync_pool(req: spot.PoolInput) -> spot.PoolState:
        return spot.PoolState(desired=1, base=1)

    return [counts, release, sync_pool]


def _reactive_scaling_stubs(_: Client) -> list:
    """A deployment at 2 replicas whose queue jumps: the loop scales 2 -> 8 in one decision, then,
    with 3 of the 8 Ready and a queue of 60, holds because the 5 starting replicas cover the want
    (the ``decide-on-ready`` branch; before it, the loop sized from the 8 asked for and scaled on
    to 11: tests/histories/reactive-scaling-before-decide-on-ready.json)."""
    fleet = {"replicas": 2, "ready": 2}
    queues = iter([0, 120, 60, 60])

    @activity.defn(name=scaling.GET_SCALE)
    async def get_scale(req: scaling.ScaleTarget) -> scaling.ScaleStatus:
        return scaling.ScaleStatus(
            version="1.0.0", replicas=fleet["replicas"], ready_replicas=fleet["ready"],
            pending=fleet["replicas"] - fleet["ready"], unschedulable=0, priority_class="realtime",
        )

    @activity.defn(name=scaling.READ_SCALING_SIGNALS)
    async def read_signals(req: scaling.ReadSignalsInput) -> Signals:
        return Signals(queue_waiting=next(queues, 60), running=4, kv_cache_usage=0.5, ttft_p99_seconds=0.4, gpu_util_percent=70)

    @activity.defn(name=SCALE_VERSION)
    async def scale_version(req: ScaleVersionInput) -> None:
        fleet["replicas"], fleet["ready"] = req.replicas, min(req.replicas, 3)  # the rest still loading

    return [get_scale, read_signals, scale_version]


def _ttft_burst_stubs(_: Client) -> list:
    """2 Ready replicas, no queue, a p99 TTFT of 12 s against the 2 s SLO: the ratio trigger asks
    for 12 and the ``ratio-step-up`` branch doubles the fleet to 4 instead."""
    fleet = {"replicas": 2}

    @activity.defn(name=scaling.GET_SCALE)
    async def get_scale(req: scaling.ScaleTarget) -> scaling.ScaleStatus:
        return scaling.ScaleStatus(version="1.0.0", replicas=fleet["replicas"], ready_replicas=2,
                                   pending=fleet["replicas"] - 2, unschedulable=0, priority_class="realtime")

    @activity.defn(name=scaling.READ_SCALING_SIGNALS)
    async def read_signals(req: scaling.ReadSignalsInput) -> Signals:
        return Signals(queue_waiting=0, running=4, ttft_p99_seconds=12.0)

    @activity.defn(name=SCALE_VERSION)
    async def scale_version(req: ScaleVersionInput) -> None:
        fleet["replicas"] = req.replicas

    return [get_scale, read_signals, scale_version]


def _rollout_stubs(fleet: Fleet) -> list:
    """The stub fleet's activities and the real retire scheduling, as tests/workflows/rollout/test_rollout.py's worker has them."""
    retire = RetireScheduling()
    return [*fleet.activities(), retire.schedule_retire, retire.cancel_retire]


async def _start_rollout(client: Client, input: BaseModel, workflow_id: str, queue: str) -> WorkflowHandle:
    return await start_rollout(client, input, task_queue=queue)  # its id is rollout/<deployment>


def _rollout(deployment: str, bad_at_weight: int | None) -> Scenario:
    """ModelRollout over the tests' stub fleet: 1 % -> 5 % -> 50 %; the error-rate gate fails the
    second window at ``bad_at_weight`` (None: every gate passes and the rollout promotes)."""

    def gates(weight: int, n: int) -> dict[str, float]:
        return {**GOOD, ERROR_RATE: BAD[ERROR_RATE]} if weight == bad_at_weight and n == 2 else GOOD

    return Scenario(
        workflow=ModelRollout,
        input=rollout_input(deployment=deployment, steps=SHORT),
        activities=lambda client: _rollout_stubs(Fleet(client, gates=gates)),
        start=_start_rollout,
    )


SCENARIOS = {
    "return-to-spot": Scenario(
        workflow=ReturnToSpot,
        input=spot.ReturnToSpotInput(
            deployment=DeploymentRef(namespace="llm-serving", name="chat-v1-3-0"),
            policy=spot.FailoverPolicy(on_demand_pool_asg="gpu-on-demand", poll_seconds=30, stabilisation_seconds=60),
        ),
        activities=_return_to_spot_stubs,
    ),
    "model-rollout-promoted": _rollout("llm-serving/chat", bad_at_weight=None),
    "model-rollout-rolled-back": _rollout("llm-serving/chat-rb", bad_at_weight=5),
    # a must-pass golden case fails at warm-up: rolled back before any traffic, the version deprecated
    "model-rollout-golden-failed": Scenario(
        workflow=ModelRollout,
        input=rollout_input(deployment="llm-serving/chat-golden", steps=SHORT, weights_uri=None, sha256=None),
        activities=lambda client: _rollout_stubs(QualityFleet(client, new=DOSE_WRONG)),
        start=_start_rollout,
    ),
    "reactive-scaling": Scenario(
        workflow=ReactiveScaling,
        input=ScalingInput(
            deployment="llm-serving/chat",
            policy=ScalingPolicy(min_replicas=1, max_replicas=20),
            interval_seconds=30,
            iterations_per_run=4,
        ),
        activities=_reactive_scaling_stubs,
        continues_as_new=True,
    ),
    "reactive-scaling-ttft-burst": Scenario(
        workflow=ReactiveScaling,
        input=ScalingInput(deployment="llm-serving/chat", policy=ScalingPolicy(min_replicas=1, max_replicas=20),
                           interval_seconds=30, iterations_per_run=2),
        activities=_ttft_burst_stubs,
        continues_as_new=True,
    ),
}


async def record(name: str, env: WorkflowEnvironment, out: Path) -> Path:
    """Run scenario ``name`` to completion and write ``<out>/<name>.json``."""
    scenario = SCENARIOS[name]
    queue = f"record-{uuid.uuid4().hex[:8]}"
    workflows = WORKFLOWS if scenario.workflow in WORKFLOWS else [*WORKFLOWS, scenario.workflow]
    async with Worker(env.client, task_queue=queue, workflows=workflows, activities=scenario.activities(env.client)):
        if scenario.start:
            handle = await scenario.start(env.client, scenario.input, f"replay/{name}", queue)
        else:
            handle = await env.client.start_workflow(scenario.workflow, scenario.input, id=f"replay/{name}", task_queue=queue)
        if scenario.continues_as_new:
            try:
                await asyncio.wait_for(handle.result(follow_runs=False), RUN_TIMEOUT_SECONDS)
            except WorkflowContinuedAsNewError:
                pass
            await env.client.get_workflow_handle(handle.id).terminate()  # the runs after the recorded one
            handle = env.client.get_workflow_handle(handle.id, run_id=handle.result_run_id)
        else:
            try:
                await asyncio.wait_for(handle.result(), RUN_TIMEOUT_SECONDS)
            except WorkflowFailureError:
                pass  # a rolled-back rollout fails (outcome-in-status): its history is recorded all the same
    history = await handle.fetch_history()
    path = out / f"{name}.json"
    path.write_text(history.to_json() + "\n")
    return path


async def main(names: list[str], out: Path) -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(BIN / "temporal-test-server"), data_converter=pydantic_data_converter
    )
    kinds = {"Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD, "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT}
    await env.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=env.client.namespace,
        search_attributes={name: kinds[kind] for name, kind in search_attributes.CLI_TYPES.items()},
    ))
    try:
        for name in names:
            print(f"recorded {await record(name, env, out)}")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="default: all")
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write to (default %(default)s)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args()
    if args.list:
        print("\n".join(SCENARIOS))
        sys.exit(0)
    chosen = args.scenarios or list(SCENARIOS)
    if unknown := set(chosen) - set(SCENARIOS):
        parser.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")
    asyncio.run(main(chosen, args.out))
    # The SDK's Rust threads can race interpreter finalisation and abort after all the work is
    # done (seen intermittently with temporalio 1.35): everything is written, so skip finalisation.
    sys.stdout.flush()
    os._exit(0)
