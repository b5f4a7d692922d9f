"""How a failure is explained: the cause of a failed activity or child workflow, and bad update
input refused naming every field (waiting is workflows/core/waiting.py)."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, TimeoutError as TemporalTimeout


def cause(err: BaseException) -> str:
    """The innermost useful message of a failed activity or child workflow (e.g. the checksum
    mismatch text), not the "Activity task failed" wrapper around it."""
    while isinstance(err, (ActivityError, ChildWorkflowError)) and err.cause is not None:
        err = err.cause
    if isinstance(err, TemporalTimeout):
        return f"timed out ({err.type.name if err.type else 'timeout'})"
    return str(err) or type(err).__name__


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
