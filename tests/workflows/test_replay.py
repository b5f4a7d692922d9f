"""Worker versioning guard: every recorded history in tests/histories/ replays against today's code.

A workflow change that would make a running execution take a different path (a new activity, a
reordered timer) fails here with a NondeterminismError instead of wedging live rollouts after a
deploy. Add a history when a workflow changes (docs/production.md, "Worker versioning").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.common import RawValue
from temporalio.worker import Replayer

from workers.client import data_converter
from workers.config import load_settings
from workers.worker import WORKFLOWS

HISTORIES = sorted((Path(__file__).parents[1] / "histories").glob("*.json"))


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


@pytest.mark.parametrize("path", HISTORIES or [None], ids=lambda p: p.stem if p else "no-histories")
async def test_history_replays(path: Path | None):
    assert path is not None, "tests/histories/ holds no *.json: record one (python -m tests.histories.record)"
    # an unregistered workflow type fails too ("Workflow class X is not registered on this worker")
    replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter(load_settings()))
    await replayer.replay_workflow(load(path))


@workflow.defn(dynamic=True, sandboxed=False)
class ChangedWorkflow:
    """Any workflow type, rewritten to start with an activity no recorded run ever scheduled."""

    @workflow.run
    async def run(self, args: Sequence[RawValue]) -> None:
        await workflow.execute_activity("replay_guard_probe", start_to_close_timeout=timedelta(seconds=1))


async def test_a_changed_workflow_fails_replay():
    """The guard can fail: the same history against changed code is nondeterministic."""
    assert HISTORIES, "no histories to replay"
    with pytest.raises(workflow.NondeterminismError):
        await Replayer(workflows=[ChangedWorkflow], data_converter=data_converter(load_settings())).replay_workflow(
            load(HISTORIES[0])
        )


def test_reactive_scaling_history_went_through_the_decide_on_ready_patch():
    """The recorded loop took the patched branch (``workflow.patched("decide-on-ready")``), so its
    replay above checks that branch; a run recorded without the marker would check the old one."""
    path = next((p for p in HISTORIES if p.stem.startswith("reactive-scaling")), None)
    assert path is not None, "record it: python -m tests.histories.record reactive-scaling"
    patches = {
        json.loads(e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)["id"]
        for e in load(path).events
        if e.HasField("marker_recorded_event_attributes")
    }
    assert "decide-on-ready" in patches
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in load(path).events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert "scale_version" in scheduled  # it scaled, then decided on the Ready replicas

