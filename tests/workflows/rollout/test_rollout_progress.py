"""The weights download's progress while a rollout stages, on its own time-skipping server:
stage_weights (stubbed, but sending its report as the real one does, through WorkflowSignals from
a worker thread) reports bytes, total and rate; the status query, the current details and
``tideplane rollout get`` show them with the ETA, and the activity's summary says what is staged."""

from __future__ import annotations

import asyncio
import json

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from activities.core.workflow_signals import WorkflowSignals
from tests.servers import time_skipping
from tests.workflows.rollout.test_rollout import Fleet, rollout_input, run_rollout, wait_status
from tests.workflows.rollout.test_rollout_cli import _run
from workers.cli import rollout as cli
from workers.config import load_settings
from workflows.core.transfer import DownloadProgress
from workflows.rollout.contract import STAGE_WEIGHTS, STAGING_PROGRESS, StagedWeights, StageWeightsInput
from workflows.rollout.types import Outcome, RolloutStatus, Stage

GiB, MiB = 1024**3, 1024**2
DETAILS = "download 4.0 GiB of 16.0 GiB (25 %)  40.0 MiB/s  ETA 5m07s"  # the web UI's current details
LINE = "download [#####...............] 4.0 GiB of 16.0 GiB (25 %)  40.0 MiB/s  ETA 5m07s"  # tideplane rollout get


@pytest.fixture(scope="module")
async def env():
    async with time_skipping() as env:
        yield env


@pytest.fixture
async def client(env) -> Client:
    return env.client


class Downloading(Fleet):
    """stage_weights reports a quarter of 16 GiB at 40 MiB/s, then heartbeats until the test has read it."""

    def __init__(self, client: Client) -> None:
        super().__init__(client)
        self.read = asyncio.Event()

    @activity.defn(name=STAGE_WEIGHTS)
    async def stage_weights(self, input: StageWeightsInput) -> StagedWeights:
        await self._record(STAGE_WEIGHTS, input)
        assert input.report_progress, "the rollout asks for progress"
        info, progress = activity.info(), DownloadProgress(bytes_done=4 * GiB, bytes_total=16 * GiB, bytes_per_second=40 * MiB)
        signals = WorkflowSignals(self.client, asyncio.get_running_loop())
        await asyncio.to_thread(signals.send, info.workflow_id, info.workflow_run_id, STAGING_PROGRESS, progress)
        while not self.read.is_set():
            activity.heartbeat({**progress.model_dump(exclude={"reported_at", "eta_seconds"}), "verified": {}})
            await asyncio.sleep(0.02)
        return StagedWeights(path=f"/models/{input.model}/{input.version}", size_bytes=16 * GiB, seconds=410.0)


async def test_while_staging_the_status_details_and_get_show_bytes_rate_and_eta(client, capsys):
    settings = load_settings().model_copy(update={"temporal_address": client.service_client.config.target_host,
                                                  "temporal_namespace": client.namespace})
    inp = rollout_input()
    fleet = Downloading(client)

    async def operator(handle: WorkflowHandle) -> None:
        try:
            status = await wait_status(handle, lambda s: s.download is not None)
            assert status.stage is Stage.STAGING
            seen = status.download
            assert (seen.bytes_done, seen.bytes_total, seen.bytes_per_second) == (4 * GiB, 16 * GiB, 40 * MiB)
            assert seen.eta_seconds == pytest.approx(307.2) and seen.reported_at is not None
            meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
            assert DETAILS in meta.current_details
            code, out = await _run(f"rollout get {inp.deployment}", settings, capsys)
            assert code == 0 and LINE in out.splitlines()
            code, out = await _run(f"rollout get {inp.deployment} -o json", settings, capsys)
            shown = json.loads(out)
            assert shown["download"]["bytes_per_second"] == 40 * MiB
            assert shown["status"]["download"]["eta_seconds"] == pytest.approx(307.2)
        finally:
            fleet.read.set()

    result = await run_rollout(fleet, inp, until=operator)
    assert result.outcome is Outcome.PROMOTED

    signals, summaries = [], []
    async for event in fleet.handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            signals.append(event.workflow_execution_signaled_event_attributes.signal_name)
        scheduled = event.activity_task_scheduled_event_attributes
        if event.HasField("activity_task_scheduled_event_attributes") and scheduled.activity_type.name == STAGE_WEIGHTS:
            summaries.append(json.loads(event.user_metadata.summary.data))
    assert signals == [STAGING_PROGRESS]
    assert summaries == [
        f"stage llama {inp.version}: 1 weight file(s) from s3://tideplane-models/llama/1.3.0, verifying SHA-256"
        " (progress in the current details)"
    ]


def test_without_a_readable_heartbeat_get_shows_the_rollouts_last_report():
    status = RolloutStatus(deployment="chat", version="1.3.0", stable_version="1.2.0", stage=Stage.STAGING, weight=0, step=None,
                           steps=[1, 5, 50, 100], paused=False, pause_reason=None, analysis={}, last_verdict=None, verdicts=[],
                           timings={}, download=DownloadProgress(bytes_done=4 * GiB, bytes_total=16 * GiB,
                                                                 bytes_per_second=40 * MiB, reported_at="2026-12-07T08:01:02Z"))
    assert f"{LINE}  (at 08:01:02)" in cli.render(status)
    beat = DownloadProgress(bytes_done=4 * GiB, bytes_total=16 * GiB, bytes_per_second=40 * MiB)
    assert LINE in cli.render(status, download=beat), "the heartbeat, fresher, wins"


def test_get_takes_the_rate_the_heartbeat_reports_over_its_own_estimate():
    """The heartbeat's rate counts only what this attempt fetched; bytes over the attempt's seconds
    would count what an earlier attempt verified as speed."""
    beat = {"bytes_done": 4 * GiB, "bytes_total": 16 * GiB, "bytes_per_second": 40 * MiB, "verified": {}}
    assert cli.download_line(cli.heartbeat_progress(beat, 1.0)) == LINE
