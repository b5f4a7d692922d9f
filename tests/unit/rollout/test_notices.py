"""Rollout notices: the Event's name, object and reason, and the webhook's generic and Slack payloads."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from activities.rollout.notify_activities import event_manifest, notice_key, webhook_payload
from workflows.core.naming import DeploymentRef
from workflows.rollout.contract import NoticeInput, NoticeKind

UI = "http://localhost:8233/"
AT = datetime(2026, 12, 7, 3, 30, tzinfo=timezone.utc)


def notice(kind: NoticeKind = NoticeKind.ROLLED_BACK, seq: int = 2, **overrides) -> NoticeInput:
    fields = {
        "deployment": DeploymentRef(namespace="llm-serving", name="chat"),
        "version": "1.3.0",
        "kind": kind,
        "message": "gate failed at 5 %: error_rate 0.2 > 0.01",
        "weight": 5,
        "workflow_id": "rollout/llm-serving/chat",
        "run_id": "0193A2B4-7c1d-7e00-9f00-123456789abc",
        "namespace": "default",
        "seq": seq,
    }
    return NoticeInput(**{**fields, **overrides})


def test_the_key_names_the_versioned_deployment_the_run_and_the_notice():
    assert notice_key(notice()) == "chat-v1-3-0.0193a2b4.2"
    assert notice_key(notice(seq=3)) != notice_key(notice()), "each notice of a run has its own Event"


@pytest.mark.parametrize(
    "kind, reason, event_type",
    [
        (NoticeKind.PAUSED, "RolloutPaused", "Warning"),
        (NoticeKind.RESUMED, "RolloutResumed", "Normal"),
        (NoticeKind.ROLLED_BACK, "RolloutRolledBack", "Warning"),
        (NoticeKind.ABORTED, "RolloutAborted", "Warning"),
        (NoticeKind.PROMOTED, "RolloutPromoted", "Normal"),
    ],
)
def test_the_event_is_on_the_versions_deployment_with_a_reason_per_kind(kind, reason, event_type):
    event = event_manifest(notice(kind), "uid-1", AT)
    assert event["metadata"] == {"name": "chat-v1-3-0.0193a2b4.2", "namespace": "llm-serving"}
    assert event["involvedObject"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "namespace": "llm-serving", "name": "chat-v1-3-0", "uid": "uid-1",
    }
    assert (event["reason"], event["type"]) == (reason, event_type)
    assert "error_rate 0.2 > 0.01" in event["message"] and event["lastTimestamp"] == "2026-12-07T03:30:00Z"


def test_an_event_for_a_deployment_not_found_carries_no_uid():
    assert "uid" not in event_manifest(notice(), None, AT)["involvedObject"]


def test_the_generic_payload_has_every_field_and_the_link_to_the_run():
    payload = webhook_payload(notice(), "generic", UI)
    assert payload["key"] == "chat-v1-3-0.0193a2b4.2" and payload["kind"] == "rolled_back"
    assert payload["reason"] == "RolloutRolledBack" and payload["deployment"] == "llm-serving/chat"
    assert payload["version"] == "1.3.0" and payload["weight"] == 5
    assert payload["link"] == "http://localhost:8233/namespaces/default/workflows/rollout%2Fllm-serving%2Fchat"
    assert payload["text"] == "rollout llm-serving/chat 1.3.0 rolled back at 5 %: gate failed at 5 %: error_rate 0.2 > 0.01"


def test_the_slack_payload_is_text_and_blocks_with_the_link():
    payload = webhook_payload(notice(NoticeKind.PROMOTED, message="1.3.0 is stable at 100 %", weight=100), "slack", UI)
    assert set(payload) == {"text", "blocks"}
    assert payload["text"].startswith("rollout llm-serving/chat 1.3.0 promoted at 100 %: 1.3.0 is stable at 100 %")
    section, context = payload["blocks"]
    assert section == {"type": "section", "text": {"type": "mrkdwn", "text": "rollout llm-serving/chat 1.3.0 promoted at 100 %: 1.3.0 is stable at 100 %"}}
    assert context["elements"][0]["text"].startswith("<http://localhost:8233/namespaces/default/workflows/rollout%2Fllm-serving%2Fchat|run ")


def test_without_a_web_ui_there_is_no_link():
    assert webhook_payload(notice(), "generic", None)["link"] is None
    assert len(webhook_payload(notice(), "slack", None)["blocks"]) == 1
