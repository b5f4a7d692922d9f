"""EventBridge EC2 events (AWS's exact format) -> typed spot notices."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from workflows.spot.events import (
    MalformedEvent,
    NoticeKind,
    build_event,
    instance_id_from_provider_id,
    parse_event,
    provider_id,
)
from workflows.core.naming import spot_reclaim_workflow_id

# Verbatim shape of AWS's documented examples (ids and times filled in).
INTERRUPTION = """{
    "version": "0",
    "id": "12345678-1234-1234-1234-123456789012",
    "detail-type": "EC2 Spot Instance Interruption Warning",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2026-11-29T10:00:00Z",
    "region": "us-east-2",
    "resources": ["arn:aws:ec2:us-east-2:123456789012:instance/i-1234567890abcdef0"],
    "detail": {"instance-id": "i-1234567890abcdef0", "instance-action": "terminate"}
}"""
REBALANCE = """{
    "version": "0",
    "id": "12345678-1234-1234-1234-123456789013",
    "detail-type": "EC2 Instance Rebalance Recommendation",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2026-11-29T09:58:00Z",
    "region": "us-east-2",
    "resources": ["arn:aws:ec2:us-east-2:123456789012:instance/i-1234567890abcdef0"],
    "detail": {"instance-id": "i-1234567890abcdef0"}
}"""
STATE = """{
   "id": "7bf73129-1428-4cd3-a780-95db273d1602",
   "detail-type": "EC2 Instance State-change Notification",
   "source": "aws.ec2",
   "account": "123456789012",
   "time": "2015-11-11T21:29:54Z",
   "region": "us-east-1",
   "resources": ["arn:aws:ec2:us-east-1:123456789012:instance/i-abcd1111"],
   "detail": {"instance-id": "i-abcd1111", "state": "shutting-down"}
}"""


def test_interruption_warning():
    n = parse_event(INTERRUPTION)
    assert n.kind == NoticeKind.INTERRUPTION
    assert n.instance_id == "i-1234567890abcdef0"
    assert n.action == "terminate" and n.region == "us-east-2"
    assert n.time == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert n.deadline() == n.time + timedelta(minutes=2)
    assert n.actionable


def test_hibernate_has_no_two_minute_notice():
    event = json.loads(INTERRUPTION)
    event["detail"]["instance-action"] = "hibernate"
    n = parse_event(event)
    assert n.deadline() == n.time


def test_rebalance_recommendation():
    n = parse_event(REBALANCE.encode())
    assert n.kind == NoticeKind.REBALANCE and n.instance_id == "i-1234567890abcdef0"
    assert n.action is None and n.actionable


@pytest.mark.parametrize(("state", "actionable"), [("shutting-down", True), ("terminated", True), ("stopping", True), ("running", False), ("pending", False)])
def test_state_change(state, actionable):
    event = json.loads(STATE)
    event["detail"]["state"] = state
    n = parse_event(event)
    assert n.kind == NoticeKind.STATE_CHANGE and n.state == state and n.instance_id == "i-abcd1111"
    assert n.actionable is actionable
    assert n.deadline() == n.time


def test_sns_envelope():
    wrapped = json.dumps({"Type": "Notification", "MessageId": "m", "Message": INTERRUPTION})
    assert parse_event(wrapped).kind == NoticeKind.INTERRUPTION


def test_unknown_detail_type_is_ignored():
    event = json.loads(INTERRUPTION)
    event["detail-type"] = "EC2 Fast Launch State-change Notification"
    assert parse_event(event) is None


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected an object"),
        ("{}", "detail-type"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_malformed_bodies(body, why):
    with pytest.raises(MalformedEvent, match=why):
        parse_event(body)


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda e: e.pop("detail"), "detail"),
        (lambda e: e["detail"].pop("instance-id"), "instance-id"),
        (lambda e: e["detail"].update({"instance-id": "node-1"}), "instance-id"),
        (lambda e: e["detail"].update({"instance-action": "explode"}), "instance-action"),
        (lambda e: e.update({"time": "yesterday"}), "time"),
        (lambda e: e.pop("id"), "'id'"),
        (lambda e: e.update({"source": "my.app"}), "source"),
    ],
)
def test_malformed_interruption(mutate, why):
    event = json.loads(INTERRUPTION)
    mutate(event)
    with pytest.raises(MalformedEvent, match=why):
        parse_event(json.dumps(event))


def test_state_change_without_state_is_malformed():
    event = json.loads(STATE)
    del event["detail"]["state"]
    with pytest.raises(MalformedEvent, match="state"):
        parse_event(event)


@pytest.mark.parametrize("kind", list(NoticeKind))
def test_built_events_round_trip(kind):
    when = datetime(2026, 11, 29, 10, 0, 5, tzinfo=UTC)
    event = build_event(kind, "i-0123456789abcdef0", event_id="e-1", time=when)
    assert set(event) == {"version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail"}
    n = parse_event(json.dumps(event))
    assert (n.kind, n.instance_id, n.time, n.event_id) == (kind, "i-0123456789abcdef0", when, "e-1")


def test_provider_id():
    pid = provider_id("us-east-1c", "i-0123456789abcdef0")
    assert pid == "aws:///us-east-1c/i-0123456789abcdef0"
    assert instance_id_from_provider_id(pid) == "i-0123456789abcdef0"
    for bad in ("", "kind://x/y", "aws:///us-east-1a/node-1"):
        with pytest.raises(ValueError):
            instance_id_from_provider_id(bad)
    assert spot_reclaim_workflow_id("i-0abc12345") == "spot-reclaim/i-0abc12345"
