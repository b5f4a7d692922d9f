"""How a failure is explained: the cause of a failed activity or child workflow, and bad update
input refused naming every field, a signal's payload taken for what it can be (waiting is workflows/core/waiting.py)."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, TimeoutError as TemporalTimeout

M = TypeVar("M", bound=BaseModel)


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


def understood(model: type[M], raw: object, what: str, text_field: str = "reason") -> tuple[M, str | None]:
    """``raw`` (a signal's payload, any JSON) as ``model``, never refused: a signal cannot answer, and
    the SDK drops one it cannot decode, so an operator's ``abort`` must act whatever it carries. The
    fields that validate are kept, a bare string is taken as ``text_field``; the second value names
    what was not understood (None: all of it was), for the status and the logs to say."""
    if raw is None:
        return model(), None
    if isinstance(raw, str) and text_field in model.model_fields:
        raw = {text_field: raw}
    try:
        return model.model_validate(raw), None
    except ValidationError as exc:
        problem = field_errors(exc)
    kept = {}
    if isinstance(raw, dict):
        for key, value in raw.items():
            try:
                model.model_validate({key: value})
            except ValidationError:
                continue
            kept[key] = value
    return model.model_validate(kept), f"{what} payload not understood: {problem}"


def field_errors(exc: ValidationError, whole: str = "(input)") -> str:
    """Every problem, each naming its field (``schedules.0.time_zone: ...``; ``whole`` for the whole value), joined by ``; ``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or whole}: {e['msg']}" for e in exc.errors())
