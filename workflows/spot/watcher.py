"""``SpotInterruptionWatcher`` (id ``spot-watcher``): spot notices from SQS into SpotReclaim workflows.

Long-polls the SQS queue that EventBridge feeds, and for every actionable notice signal-with-starts
``SpotReclaim`` for that instance (id ``spot-reclaim/<instance-id>``), so duplicates and a
rebalance followed by an interruption reach one workflow. A message is deleted only after that
start succeeded; malformed and irrelevant messages are recorded and deleted. A notice of the same
kind for an instance already signalled is acknowledged without another start for as long as the
first one lives (``workflows.spot.policy.notice_expiry``): EventBridge and SQS repeat notices, and
a reclaim that finished quickly (a node with no serving pods) would otherwise run again for each
repeat. Continues as new to keep its history bounded.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.spot.contract import (
        CALL_TIMEOUT,
        PATIENT_RETRY,
        QUICK_RETRY,
        DeleteMessageInput,
        FailoverPolicy,
        ReceivedMessage,
        ReceiveNoticesInput,
        SpotActivities,
        SpotWorkflowStarts,
        StartReclaimInput,
    )
    from workflows.spot.policy import notice_expiry, notice_key, rebalance_hold
    from workflows.core.failures import cause
    from workflows.core.waiting import wait_until


# Runs started before notices were deduplicated started a reclaim for every repeat.
DEDUPE_PATCH = "dedupe-notices-by-instance"


class MalformedRecord(BaseModel):
    message_id: str
    error: str
    at: datetime


class WatcherStatus(BaseModel):
    polls: int = 0
    received: int = 0
    started: int = 0
    ignored: int = 0
    malformed: int = 0
    start_failures: int = 0
    duplicates: int = Field(0, description="notices acknowledged because one of their kind for the instance still lives")
    recent_malformed: list[MalformedRecord] = Field(default_factory=list)
    last_error: str | None = None


class WatcherInput(BaseModel):
    queue_url: str | None = Field(None, description="None: the worker's spot queue (TIDEPLANE_SPOT_QUEUE_URL)")
    policy: FailoverPolicy = Field(default_factory=FailoverPolicy)
    wait_seconds: int = Field(20, ge=0, le=20)
    idle_seconds: float = Field(1, ge=0, description="pause after an empty poll")
    polls_per_run: int = Field(500, ge=1, description="continue as new after this many polls")
    status: WatcherStatus = Field(default_factory=WatcherStatus, description="carried over by continue-as-new")
    live_notices: dict[str, datetime] = Field(
        default_factory=dict, description="instance/kind -> until when repeats are duplicates; carried over by continue-as-new"
    )


@workflow.defn(name="SpotInterruptionWatcher")
class SpotInterruptionWatcher:
    """Turns EventBridge spot notices from SQS into SpotReclaim workflows, one per instance."""

    def __init__(self) -> None:
        self._status = WatcherStatus()
        self._stopping = False
        self._live: dict[str, datetime] = {}

    @workflow.run
    async def run(self, input: WatcherInput) -> WatcherStatus:
        self._status = input.status.model_copy(deep=True)
        self._live = dict(input.live_notices)
        receive = ReceiveNoticesInput(queue_url=input.queue_url, wait_seconds=input.wait_seconds)
        for _ in range(input.polls_per_run):
            if self._stopping:
                break
            batch = await workflow.execute_activity_method(
                SpotActivities.receive_spot_notices,
                receive,
                start_to_close_timeout=timedelta(seconds=input.wait_seconds) + CALL_TIMEOUT,
                retry_policy=PATIENT_RETRY,
            )
            self._status.polls += 1
            self._status.received += len(batch.messages)
            now = workflow.now()
            self._live = {key: until for key, until in self._live.items() if until > now}
            await asyncio.gather(*(self._handle(input, m) for m in batch.messages))
            self._show()
            if workflow.info().is_continue_as_new_suggested():
                break
            if not batch.messages and input.idle_seconds:
                await wait_until(lambda: self._stopping, timedelta(seconds=input.idle_seconds), "idle after an empty poll")
        if self._stopping:
            return self._status
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(input.model_copy(update={"status": self._status, "live_notices": self._live}))

    async def _handle(self, input: WatcherInput, message: ReceivedMessage) -> None:
        notice = message.notice
        if message.error is not None:
            self._status.malformed += 1
            self._status.recent_malformed = [
                *self._status.recent_malformed[-19:],
                MalformedRecord(message_id=message.message_id, error=message.error, at=workflow.now()),
            ]
        elif notice is None or not notice.actionable:
            self._status.ignored += 1
        elif workflow.patched(DEDUPE_PATCH) and (key := notice_key(notice)) in self._live:
            self._status.duplicates += 1
        else:
            key = notice_key(notice)
            if workflow.patched(DEDUPE_PATCH):
                self._live[key] = notice_expiry(notice, rebalance_hold(input.policy.rebalance_hold_seconds, input.policy.stabilisation_seconds))
            try:
                await workflow.execute_activity_method(
                    SpotWorkflowStarts.start_spot_reclaim,
                    StartReclaimInput(notice=notice, policy=input.policy),
                    start_to_close_timeout=CALL_TIMEOUT,
                    retry_policy=QUICK_RETRY,
                    summary=f"{notice.kind} {notice.instance_id}",
                )
            except ActivityError as exc:
                # Not deleted: SQS delivers it again after the visibility timeout.
                self._status.start_failures += 1
                self._live.pop(key, None)  # the redelivery must start it
                self._status.last_error = f"start for {notice.instance_id}: {cause(exc)}"
                return
            self._status.started += 1
        try:
            await workflow.execute_activity_method(
                SpotActivities.delete_spot_message,
                DeleteMessageInput(queue_url=input.queue_url, receipt_handle=message.receipt_handle),
                start_to_close_timeout=CALL_TIMEOUT,
                retry_policy=QUICK_RETRY,
            )
        except ActivityError as exc:
            self._status.last_error = f"delete {message.message_id}: {cause(exc)}"

    def _show(self) -> None:
        s = self._status
        lines = [
            (f"**polls** {s.polls} · **received** {s.received} · **failovers started/joined** {s.started}"
             f" · **duplicates** {s.duplicates} · **ignored** {s.ignored} · **malformed** {s.malformed} · **start failures** {s.start_failures}"),
        ]
        if s.recent_malformed:
            last = s.recent_malformed[-1]
            lines.append(f"last malformed: `{last.message_id}`: {last.error}")
        if s.last_error:
            lines.append(f"last error: {s.last_error}")
        workflow.set_current_details("\n\n".join(lines))

    @workflow.query(name="status")
    def status(self) -> WatcherStatus:
        return self._status

    @workflow.signal(name="stop")
    def stop(self) -> None:
        """Finish after the current poll instead of continuing."""
        self._stopping = True
