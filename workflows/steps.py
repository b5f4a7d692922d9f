"""How every workflow runs its steps: one way to explain a failed activity, one way to wait.

Workflows call activities one way, by method reference of the activity contract classes
(``workflow.execute_activity_method(RolloutActivities.stage_weights, ...)``); the contracts live
in ``workflows/<capability>/activities.py`` and are implemented in ``activities/<capability>.py``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Callable

from temporalio import workflow
from pydantic import BaseModel, ValidationError
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.exceptions import TimeoutError as TemporalTimeout


def cause(err: BaseException) -> str:
    """The innermost useful message of a failed activity or child workflow (e.g. the checksum
    mismatch text), not the "Activity task failed" wrapper around it."""
    while isinstance(err, (ActivityError, ChildWorkflowError)) and err.cause is not None:
        err = err.cause
    if isinstance(err, TemporalTimeout):
        return f"timed out ({err.type.name if err.type else 'timeout'})"
    return str(err) or type(err).__name__


async def wait_until(condition: Callable[[], bool], timeout: timedelta | None = None, summary: str | None = None) -> bool:
    """Wait for ``condition`` (durably: a timer in the history); False when ``timeout`` came first."""
    try:
        await workflow.wait_condition(condition, timeout=timeout, timeout_summary=summary)
    except asyncio.TimeoutError:
        return False
    return True


def validated(model: type[BaseModel], raw: object, what: str) -> BaseModel:
    """``raw`` (an update's JSON input) as ``model``; invalid input is refused non-retryably with
    every field named, like a start-time error, not as raw pydantic text marked retryable."""
    try:
        return model.model_validate({} if raw is None else raw)
    except ValidationError as exc:
        raise ApplicationError(f"invalid {what} input: {field_errors(exc)}", type="InvalidInput", non_retryable=True) from None


def field_errors(exc: ValidationError, whole: str = "(input)") -> str:
    """Every problem, each naming its field (``schedules.0.time_zone: ...``; ``whole`` for the whole value), joined by ``; ``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or whole}: {e['msg']}" for e in exc.errors())
