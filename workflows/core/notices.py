"""How a workflow tells people (a rollout's pause or outcome, a spot failover): best effort, by an
activity that writes a Kubernetes Event and posts the optional webhook. Telling people never holds
up or fails the run: a notice is retried briefly, then given up and logged.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.core.failures import cause

NOTICE = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5), maximum_attempts=4,
    non_retryable_error_types=["ValidationError"],
)
NOTICE_ATTEMPT = timedelta(seconds=20)
NOTICE_DEADLINE = timedelta(seconds=60)


async def deliver(activity_method: Any, notice: Any, summary: str) -> None:
    """Run one notice's activity; its failure is logged, never raised (it ends within NOTICE_DEADLINE)."""
    try:
        await workflow.execute_activity_method(
            activity_method,
            notice,
            start_to_close_timeout=NOTICE_ATTEMPT,
            schedule_to_close_timeout=NOTICE_DEADLINE,
            retry_policy=NOTICE,
            summary=summary,
        )
    except ActivityError as err:
        workflow.logger.warning("%s not delivered: %s", summary, cause(err))
