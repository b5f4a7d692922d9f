"""Spot failover notices: the Event's name, object, reason and type, and the webhook's payloads."""

from __future__ import annotations

from datetime import datetime, timezone

from activities.spot.failover_notices import event_manifest, failover_key, headline, webhook_payload
from workflows.spot.contract import FailoverNotice

UI = "http://localhost:8233/"
AT = datetime(2026, 12, 7, 3, 30, tzinfo=timezone.utc)


def notice(**overrides) -> FailoverNotice:
    fields = {
        "namespace": "llm-serving", "deployment": "chat-v1-3-0", "instance_id": "i-0123456789abcdef0",
        "node": "ip-10-0-1-7.ec2.internal", "pool": "gpu-spot", "capacity_type": "on-demand", "replicas_moved": 2,
        "replacement_ready_seconds": 41.5, "capacity_gap_seconds": 0.0,
        "workflow_id": "spot-reclaim/i-0123456789abcdef0", "run_id": "0193A2B4-7c1d-7e00-9f00-123456789abc",
        "temporal_namespace": "default", "seq": 1,
    }
    return FailoverNotice(**{**fields, **overrides})


def test_the_event_is_on_the_deployment_whose_replicas_moved():
    event = event_manifest(notice(), "uid-1", AT)
    assert event["metadata"] == {"name": "chat-v1-3-0.0193a2b4.1", "namespace": "llm-serving"}
    assert event["involvedObject"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "namespace": "llm-serving", "name": "chat-v1-3-0", "uid": "uid-1",
    }
    assert (event["reason"], event["type"]) == ("SpotFailover", "Normal")
    assert event["reportingInstance"] == "spot-reclaim/i-0123456789abcdef0"


def test_a_failover_that_left_a_capacity_gap_is_a_warning():
    assert event_manifest(notice(capacity_gap_seconds=12.0), None, AT)["type"] == "Warning"


def test_each_affected_deployment_has_its_own_key():
    assert failover_key(notice(seq=2, deployment="embed-v1-0-0")) == "embed-v1-0-0.0193a2b4.2"
    assert failover_key(notice(seq=2)) != failover_key(notice())


def test_the_headline_says_what_moved_where_and_the_gap():
    assert headline(notice()) == (
        "spot failover llm-serving/chat-v1-3-0: instance i-0123456789abcdef0 (node ip-10-0-1-7.ec2.internal, pool gpu-spot)"
        " reclaimed; 2 replicas moved to on-demand, Ready after 42 s; capacity gap 0 s"
    )
    assert "not all Ready yet" in headline(notice(replacement_ready_seconds=None))


def test_the_generic_payload_has_the_failover_and_the_link_to_the_run():
    payload = webhook_payload(notice(), "generic", UI)
    assert payload["kind"] == "spot_failover" and payload["reason"] == "SpotFailover"
    assert payload["key"] == "chat-v1-3-0.0193a2b4.1" and payload["deployment"] == "llm-serving/chat-v1-3-0"
    assert (payload["instance_id"], payload["replicas_moved"], payload["capacity_gap_seconds"]) == ("i-0123456789abcdef0", 2, 0.0)
    assert payload["link"] == "http://localhost:8233/namespaces/default/workflows/spot-reclaim%2Fi-0123456789abcdef0"


def test_the_slack_payload_is_text_and_blocks():
    payload = webhook_payload(notice(), "slack", UI)
    assert set(payload) == {"text", "blocks"} and payload["text"].startswith("spot failover llm-serving/chat-v1-3-0")
    assert webhook_payload(notice(), "slack", None)["blocks"][0]["text"]["text"] == headline(notice())
