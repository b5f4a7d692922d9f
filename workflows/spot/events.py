"""EC2 spot notices as EventBridge delivers them to SQS, parsed into typed values.

Pure code (the watcher's activity parses, tests parse, the sandbox builds events with the same
field names). The three detail-types are AWS's exact event formats:

- ``EC2 Spot Instance Interruption Warning``: ``detail.instance-id``, ``detail.instance-action``
  (terminate | stop | hibernate), emitted two minutes before the instance is reclaimed;
- ``EC2 Instance Rebalance Recommendation``: ``detail.instance-id``, an elevated risk of
  interruption (the instance may live on);
- ``EC2 Instance State-change Notification``: ``detail.instance-id``, ``detail.state``.

A body may also arrive wrapped in an SNS envelope (EventBridge -> SNS -> SQS). Anything else is
``MalformedEvent`` (undecodable, missing fields) or ``None`` (a well-formed event of another type,
which the queue may legitimately carry and the watcher acknowledges).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

INTERRUPTION_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"
SOURCE = "aws.ec2"

# The interruption warning comes two minutes before the instance is stopped or terminated.
NOTICE_SECONDS = 120.0

INSTANCE_ACTIONS = ("terminate", "stop", "hibernate")
INSTANCE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down", "terminated")
# States after which the instance no longer serves: a reclaim with no time left.
GOING_AWAY_STATES = ("stopping", "stopped", "shutting-down", "terminated")

_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
# aws:///us-east-1a/i-0123456789abcdef0 (EKS / the AWS cloud provider)
_PROVIDER_ID = re.compile(r"^aws:///(?P<zone>[^/]*)/(?P<instance>i-[0-9a-f]{8,17})$")


class NoticeKind(StrEnum):
    INTERRUPTION = "interruption"
    REBALANCE = "rebalance"
    STATE_CHANGE = "state-change"


class SpotNotice(BaseModel):
    """One EC2 event about one instance, as the failover workflows consume it."""

    kind: NoticeKind
    instance_id: str = Field(pattern=_INSTANCE_ID.pattern)
    event_id: str
    time: datetime = Field(description="when EC2 emitted the event (UTC)")
    region: str = ""
    action: str | None = Field(None, description="instance-action of an interruption warning")
    state: str | None = Field(None, description="new state of a state-change notification")

    @property
    def actionable(self) -> bool:
        """Whether this notice should start (or advance) a reclaim of its instance."""
        return self.kind != NoticeKind.STATE_CHANGE or self.state in GOING_AWAY_STATES

    def deadline(self) -> datetime:
        """When the instance stops serving: two minutes after a warning, now for a going-away state."""
        if self.kind == NoticeKind.INTERRUPTION and self.action != "hibernate":
            return self.time + timedelta(seconds=NOTICE_SECONDS)
        return self.time


class MalformedEvent(ValueError):
    """The message is not a well-formed EC2 event; the text says what is wrong."""


def parse_event(body: str | bytes | dict[str, Any]) -> SpotNotice | None:
    """Parse an SQS message body; None for a well-formed event of a type we do not handle."""
    event = _decode(body)
    if "Message" in event and event.get("Type") == "Notification":
        event = _decode(event["Message"])  # SNS envelope
    detail_type = event.get("detail-type")
    if not isinstance(detail_type, str):
        raise MalformedEvent("missing 'detail-type'")
    kind = {
        INTERRUPTION_WARNING: NoticeKind.INTERRUPTION,
        REBALANCE_RECOMMENDATION: NoticeKind.REBALANCE,
        STATE_CHANGE: NoticeKind.STATE_CHANGE,
    }.get(detail_type)
    if kind is None:
        return None
    if event.get("source") != SOURCE:
        raise MalformedEvent(f"{detail_type!r} from source {event.get('source')!r}, expected {SOURCE!r}")
    detail = event.get("detail")
    if not isinstance(detail, dict):
        raise MalformedEvent("missing 'detail' object")
    instance_id = detail.get("instance-id")
    if not isinstance(instance_id, str) or not _INSTANCE_ID.match(instance_id):
        raise MalformedEvent(f"bad detail.instance-id {instance_id!r}")
    event_id = event.get("id")
    if not isinstance(event_id, str) or not event_id:
        raise MalformedEvent("missing 'id'")
    time = _parse_time(event.get("time"))
    action = state = None
    if kind == NoticeKind.INTERRUPTION:
        action = detail.get("instance-action")
        if action not in INSTANCE_ACTIONS:
            raise MalformedEvent(f"bad detail.instance-action {action!r}, expected one of {INSTANCE_ACTIONS}")
    elif kind == NoticeKind.STATE_CHANGE:
        state = detail.get("state")
        if state not in INSTANCE_STATES:
            raise MalformedEvent(f"bad detail.state {state!r}, expected one of {INSTANCE_STATES}")
    return SpotNotice(
        kind=kind,
        instance_id=instance_id,
        event_id=event_id,
        time=time,
        region=str(event.get("region", "")),
        action=action,
        state=state,
    )


def build_event(
    kind: NoticeKind,
    instance_id: str,
    *,
    event_id: str,
    time: datetime,
    region: str = "us-east-1",
    account: str = "123456789012",
    action: str = "terminate",
    state: str = "shutting-down",
) -> dict[str, Any]:
    """An event in EventBridge's exact format (what the sandbox publishes, what tests feed)."""
    detail_type = {
        NoticeKind.INTERRUPTION: INTERRUPTION_WARNING,
        NoticeKind.REBALANCE: REBALANCE_RECOMMENDATION,
        NoticeKind.STATE_CHANGE: STATE_CHANGE,
    }[kind]
    detail: dict[str, str] = {"instance-id": instance_id}
    if kind == NoticeKind.INTERRUPTION:
        detail["instance-action"] = action
    elif kind == NoticeKind.STATE_CHANGE:
        detail["state"] = state
    return {
        "version": "0",
        "id": event_id,
        "detail-type": detail_type,
        "source": SOURCE,
        "account": account,
        "time": time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:ec2:{region}:{account}:instance/{instance_id}"],
        "detail": detail,
    }


def instance_id_from_provider_id(provider_id: str) -> str:
    """``aws:///us-east-1a/i-0abc...`` -> ``i-0abc...``; ValueError for anything else."""
    match = _PROVIDER_ID.match(provider_id or "")
    if not match:
        raise ValueError(f"not an AWS provider ID: {provider_id!r}")
    return match["instance"]


def provider_id(zone: str, instance_id: str) -> str:
    return f"aws:///{zone}/{instance_id}"


def _decode(body: str | bytes | dict[str, Any]) -> dict[str, Any]:
    if isinstance(body, dict):
        return body
    try:
        event = json.loads(body)
    except (ValueError, TypeError) as exc:
        raise MalformedEvent(f"body is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise MalformedEvent(f"body is JSON {type(event).__name__}, expected an object")
    return event


def _parse_time(value: Any) -> datetime:
    if not isinstance(value, str):
        raise MalformedEvent(f"bad 'time' {value!r}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise MalformedEvent(f"bad 'time' {value!r}, expected ISO 8601") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
