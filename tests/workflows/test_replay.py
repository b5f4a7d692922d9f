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


def _patches_and_activities(stem: str) -> tuple[set[str], list[str]]:
    path = next((p for p in HISTORIES if p.stem == stem), None)
    assert path is not None, f"tests/histories/{stem}.json is missing"
    events = load(path).events
    patches = {
        json.loads(e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)["id"]
        for e in events
        if e.HasField("marker_recorded_event_attributes")
    }
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    return patches, scheduled


def test_reactive_scaling_histories_cover_both_sides_of_its_patches():
    """The two ReactiveScaling histories replayed above take both branches of ``decide-on-ready``
    and ``metrics-via-meter``: one recorded on today's code (python -m tests.histories.record
    reactive-scaling), one recorded on the code before decide-on-ready (commit d467039^, same
    stubs and input), whose decisions ignored Ready replicas and were counted by an activity."""
    patches, scheduled = _patches_and_activities("reactive-scaling")
    assert {"decide-on-ready", "metrics-via-meter"} <= patches
    assert "scale_version" in scheduled and "record_scaling_decision" not in scheduled
    old_patches, old_scheduled = _patches_and_activities("reactive-scaling-before-decide-on-ready")
    assert not old_patches
    assert "scale_version" in old_scheduled and "record_scaling_decision" in old_scheduled


def test_a_golden_failure_history_takes_the_patched_side_of_quality_failure_deprecates():
    """Recorded on today's code (python -m tests.histories.record model-rollout-golden-failed):
    the version is deprecated after its golden set failed, and no traffic moved."""
    patches, scheduled = _patches_and_activities("model-rollout-golden-failed")
    assert {"golden-gate", "quality-failure-deprecates"} <= patches
    assert "run_golden_set" in scheduled and "set_registry_status" in scheduled
    assert "query_gates" not in scheduled


def test_a_ttft_burst_history_takes_the_patched_side_of_ratio_step_up():
    """Recorded on today's code (python -m tests.histories.record reactive-scaling-ttft-burst): a
    p99 of 12 s on 2 Ready replicas doubles the fleet to 4, where the whole ratio asked for 12.
    reactive-scaling.json, recorded before the patch, replays the whole-ratio side."""
    patches, scheduled = _patches_and_activities("reactive-scaling-ttft-burst")
    assert "ratio-step-up" in patches
    events = load(next(p for p in HISTORIES if p.stem == "reactive-scaling-ttft-burst")).events
    scaled = [json.loads(e.activity_task_scheduled_event_attributes.input.payloads[0].data)["replicas"]
              for e in events if e.HasField("activity_task_scheduled_event_attributes")
              and e.activity_task_scheduled_event_attributes.activity_type.name == "scale_version"]
    assert scaled == [4]
    assert "ratio-step-up" not in _patches_and_activities("reactive-scaling")[0]
