"""Rollout notices (issue 35) on a time-skipping server of their own, with test_rollout.py's stub fleet.

Their own module, so their own server: on the module-scoped server of test_rollout.py, after its
other tests, the paused-rollout tests failed twice in a row (the run stayed at 1 % without a verdict
for 10 s: the server no longer skipped time), while alone they passed 5 of 5 runs.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.workflows.rollout.test_rollout import (
    BAD,
    GOOD,
    NEW,
    STABLE,
    Fleet,
    _abort_when,
    retired,
    rollout_input,
    run_rollout,
    wait_status,
    worker,
)
from workflows.rollout import gates as canary
from workflows.rollout.client import start_rollout
from workflows.rollout.contract import QUERY_GATES, NoticeKind
from workflows.rollout.types import Outcome, PauseInput, ResumeInput, Stage
from workflows.rollout.workflow import ModelRollout


@pytest.fixture
async def client(time_skipping_env) -> Client:
    return time_skipping_env.client



def _kinds(fleet: Fleet) -> list[tuple[int, NoticeKind]]:
    """Each notice once (a failed delivery is attempted again under the same seq)."""
    return sorted({(n.seq, n.kind) for n in fleet.notices})


async def test_a_paused_then_promoted_rollout_tells_of_the_pause_the_resume_and_the_promotion(client):
    async def pause_at_5(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5 and fleet.gate_queries.get(5) == 1:
            await fleet.handle.signal(ModelRollout.pause, PauseInput(reason="looking at dashboards"))

    fleet = Fleet(client, hook=pause_at_5)

    async def operator(handle: WorkflowHandle) -> None:
        await wait_status(handle, lambda s: s.paused)
        await handle.signal(ModelRollout.resume, ResumeInput())

    result = await run_rollout(fleet, rollout_input(), until=operator)
    assert result.outcome is Outcome.PROMOTED
    assert _kinds(fleet) == [(1, NoticeKind.PAUSED), (2, NoticeKind.RESUMED), (3, NoticeKind.PROMOTED)]
    paused, _, promoted = fleet.notices
    assert paused.message == "looking at dashboards" and paused.weight == 5 and paused.version == NEW
    assert promoted.message == result.reason and promoted.weight == 100
    assert {n.workflow_id for n in fleet.notices} == {fleet.workflow_id} and len({n.run_id for n in fleet.notices}) == 1


async def test_a_rolled_back_rollout_tells_why_and_replays_the_same_after_it_closed(client):
    failing = {**GOOD, canary.ERROR_RATE: BAD[canary.ERROR_RATE]}
    fleet = Fleet(client, gates=lambda w, n: failing if w == 5 else GOOD)
    inp = rollout_input()
    queue = f"rollout-test-{uuid.uuid4().hex[:8]}"
    async with worker(fleet, queue):
        handle = await start_rollout(client, inp, task_queue=queue)
        fleet.workflow_id = handle.id
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        # queried after close: the worker replays the history, the end-of-run notice included
        result = await handle.query(ModelRollout.result)
        assert (await handle.query(ModelRollout.status)).stage is Stage.ROLLED_BACK
        await Replayer(workflows=[ModelRollout], data_converter=pydantic_data_converter).replay_workflow(await handle.fetch_history())
        await retired(fleet, inp.deployment)  # the canary's delayed scale-down needs this worker to end
    assert _kinds(fleet) == [(1, NoticeKind.ROLLED_BACK)]
    (notice,) = fleet.notices
    assert notice.message == result.reason and canary.ERROR_RATE in notice.message
    assert notice.weight == 0, "told once the route is back on stable"
    assert len(fleet.notices) == 1, "a replay schedules no second delivery"


async def test_an_abort_is_told_as_an_abort(client):
    fleet = Fleet(client, hook=_abort_when(QUERY_GATES, 5))
    result = await run_rollout(fleet, rollout_input())
    assert result.outcome is Outcome.ABORTED
    assert _kinds(fleet) == [(1, NoticeKind.ABORTED)] and fleet.notices[0].message == result.reason


async def test_a_failing_notification_never_stops_the_rollout(client):
    async def pause_at_5(fleet: Fleet, name: str, arg: Any) -> None:
        if name == QUERY_GATES and fleet.route.get(NEW) == 5 and fleet.gate_queries.get(5) == 1:
            await fleet.handle.signal(ModelRollout.pause, PauseInput(reason="hold"))

    fleet = Fleet(client, hook=pause_at_5, notify_fails=True)

    async def operator(handle: WorkflowHandle) -> None:
        await wait_status(handle, lambda s: s.paused)
        await handle.signal(ModelRollout.resume, ResumeInput())

    result = await run_rollout(fleet, rollout_input(), until=operator)
    assert result.outcome is Outcome.PROMOTED and fleet.route == {STABLE: 0, NEW: 100}
    assert _kinds(fleet) == [(1, NoticeKind.PAUSED), (2, NoticeKind.RESUMED), (3, NoticeKind.PROMOTED)]
    assert len(fleet.notices) > 3, "each failed delivery was retried before it was given up"
