"""ModelRollout acts on each verdict's cause (issue 32, items 3 and 4): an overloaded canary is
re-sized, a crashed one rolled back as a regression, a lost pod holds the analysis clock. Runs the
real workflow on the time-skipping server against test_rollout.py's stub activities."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from temporalio.client import WorkflowHandle

from tests.workflows.rollout.test_rollout import (  # noqa: F401 - client, metered_env: the fixtures
    NEW,
    SCALE_VERSION,
    SET_REGISTRY_STATUS,
    SET_ROUTE_WEIGHTS,
    STABLE,
    GOOD,
    Fleet,
    assert_rolled_back_route_first,
    client,
    metered_env,
    rollout_input,
    run_rollout,
    wait_status,
)
from workflows.rollout import gates as canary
from workflows.rollout.contract import CanaryFleetInput
from workflows.rollout.diagnosis import CanaryFleet, Cause
from workflows.rollout.types import AbortInput, Outcome
from workflows.rollout.workflow import ModelRollout

def crashed_canary(weight: int, reason: str) -> Callable[[CanaryFleetInput, int], CanaryFleet]:
    """One canary pod at ``weight`` % killed with ``reason`` (not Ready, its last termination says why)."""
    def facts(inp: CanaryFleetInput, n: int) -> CanaryFleet:
        wanted = inp.canary_wanted
        hit = inp.weight == weight
        return CanaryFleet(weight=inp.weight, canary_wanted=wanted, canary_ready=wanted - 1 if hit else wanted, stable_ready=4,
                           crashed={f"chat-{NEW}-0": reason} if hit else {}, canary_rps=10.0 * wanted, stable_rps=40.0)
    return facts


async def test_an_overloaded_canary_is_resized_and_promoted_never_rolled_back_or_deprecated(client):
    """Demand tripled during the 50 % step: each canary replica carries 3x a stable one's load and
    fails its p99 gate; the canary is re-sized to the stable's per-replica load and the step starts over."""
    seen: list[str] = []

    def facts(inp: CanaryFleetInput, n: int) -> CanaryFleet:
        overloaded = inp.weight == 50 and inp.canary_wanted == 2
        return CanaryFleet(weight=inp.weight, canary_wanted=inp.canary_wanted, canary_ready=inp.canary_wanted, stable_ready=4,
                           canary_rps=60.0 if overloaded else 10.0 * inp.canary_wanted, stable_rps=40.0)

    async def read_details(fleet: Fleet, name: str, arg: Any) -> None:
        if name == SCALE_VERSION and arg.version == NEW and arg.replicas == 6:
            seen.append((await fleet.handle.query(ModelRollout.status)).holding or "")

    slow = {**GOOD, canary.P99_LATENCY: 1.5}
    fleet = Fleet(client, canary_fleet=facts, hook=read_details,
                  gates=lambda w, n: slow if w == 50 and fleet.replicas[NEW] == 2 else GOOD)
    result = await run_rollout(fleet, rollout_input(weights_uri=None, sha256=None))

    assert result.outcome is Outcome.PROMOTED
    assert (NEW, 6) in fleet.scales()  # 60 req/s at the stable's 10 req/s per replica
    assert [s.status.state for s in fleet.recorded(SET_REGISTRY_STATUS)] == ["canary", "canary", "canary", "stable"]
    [holding] = seen
    assert "overload at 50 %" in holding and "3.00x a stable replica's load" in holding and "6 replica(s)" in holding
    assert fleet.gate_queries[50] == 4  # the overloaded observation is no evidence: three passes after the re-size


@pytest.mark.parametrize("reason", ["CrashLoopBackOff", "OOMKilled"])
async def test_a_crashed_canary_is_rolled_back_as_a_regression_and_deprecated(client, reason):
    """The gates still pass (the dead pod counts nothing), but a crash of the canary is a failure."""
    fleet = Fleet(client, canary_fleet=crashed_canary(5, reason))
    result = await run_rollout(fleet, rollout_input(weights_uri=None, sha256=None))

    assert result.outcome is Outcome.ROLLED_BACK and result.cause is Cause.REGRESSION
    assert result.failing_verdict.weight == 5 and result.failing_verdict.diagnosis.cause is Cause.REGRESSION
    assert f"chat-{NEW}-0 {reason}" in result.reason
    assert [s.status.state for s in fleet.recorded(SET_REGISTRY_STATUS)] == ["canary", "canary", "deprecated"]
    assert_rolled_back_route_first(fleet, 5)


async def test_a_lost_canary_pod_holds_the_clock_and_replans_the_weights_onto_live_pods(client):
    """A spot reclaim takes one of the two canary pods at 50 %: no verdict while it is gone, the route
    carries what the live pod can, and the step resumes at 50 % once the pod is back."""
    seen: list[Any] = []

    def facts(inp: CanaryFleetInput, n: int) -> CanaryFleet:
        lost = inp.weight == 50 and {STABLE: 75, NEW: 25} not in fleet.routes()  # back at the read after the re-plan
        ready = inp.canary_wanted - 1 if lost else inp.canary_wanted
        return CanaryFleet(weight=inp.weight, canary_wanted=inp.canary_wanted, canary_ready=ready, stable_ready=4,
                           canary_rps=10.0 * ready, stable_rps=40.0, no_healthy_upstream=12 if lost else 0)

    async def read_status(fleet: Fleet, name: str, arg: Any) -> None:
        if name == SET_ROUTE_WEIGHTS and arg.weights.get(NEW) == 25:
            seen.append(await fleet.handle.query(ModelRollout.status))

    fleet = Fleet(client, canary_fleet=facts, hook=read_status)
    result = await run_rollout(fleet, rollout_input(weights_uri=None, sha256=None))

    assert result.outcome is Outcome.PROMOTED
    routes = fleet.routes()
    at_25 = routes.index({STABLE: 75, NEW: 25})
    assert routes[at_25 - 1] == {STABLE: 50, NEW: 50} and routes[at_25 + 1] == {STABLE: 50, NEW: 50}
    [status] = seen
    assert status.diagnosis.cause is Cause.LOST_CAPACITY and "1 of 2 canary pod(s) lost" in status.holding
    assert "analysis clock held" in status.holding and not status.paused
    assert fleet.gate_queries[50] == 4  # the held observation is dropped and the held minute not counted
    assert [s.status.state for s in fleet.recorded(SET_REGISTRY_STATUS)][-1] == "stable"


async def test_capacity_that_does_not_return_pauses_for_a_human(client):
    def facts(inp: CanaryFleetInput, n: int) -> CanaryFleet:
        ready = inp.canary_wanted - 1 if inp.weight == 50 else inp.canary_wanted
        return CanaryFleet(weight=inp.weight, canary_wanted=inp.canary_wanted, canary_ready=ready, stable_ready=4,
                           canary_rps=10.0 * ready, stable_rps=40.0)

    async def operator(handle: WorkflowHandle) -> None:
        status = await wait_status(handle, lambda s: s.paused)
        assert "lost capacity for over 300s at 50 %" in status.pause_reason and status.weight == 25
        await handle.signal(ModelRollout.abort, AbortInput(reason="node pool gone"))

    fleet = Fleet(client, canary_fleet=facts)
    result = await run_rollout(fleet, rollout_input(deadlines={"lost_capacity_seconds": 300}), until=operator)
    assert result.outcome is Outcome.ABORTED
