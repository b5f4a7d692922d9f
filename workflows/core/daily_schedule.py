"""The one shape of tideplane's daily report schedules (CostReport, TokenMetering)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def daily_schedule(run: Any, input: Any, workflow_id: str, task_queue: str, hour_utc: int = 0):
    """A Temporal Schedule starting ``run(input)`` at ``hour_utc``:00 UTC every day, to apply with
    ``client.create_schedule(SCHEDULE_ID, ...)``. A run missed while the server was down is caught
    up within 6 hours; runs never overlap. (temporalio.client is imported here, not at module level:
    workflow modules import this file.)"""
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleCalendarSpec,
        ScheduleOverlapPolicy,
        SchedulePolicy,
        ScheduleRange,
        ScheduleSpec,
    )

    return Schedule(
        action=ScheduleActionStartWorkflow(run, input, id=workflow_id, task_queue=task_queue),
        spec=ScheduleSpec(calendars=[ScheduleCalendarSpec(hour=[ScheduleRange(hour_utc)], minute=[ScheduleRange(0)],
                                                          second=[ScheduleRange(0)])]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=timedelta(hours=6)),
    )
