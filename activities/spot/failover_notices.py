"""How a spot failover tells people (issue 35): once SpotReclaim has drained a reclaimed node, a
Kubernetes Event on each Deployment whose replicas moved (``kubectl describe deployment`` lists it)
and the optional webhook, through activities/core/notifier.py."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from temporalio import activity

from activities.core.notifier import Notifier, WebhookFormat, deployment_event, event_key, slack_payload
from workflows.core.naming import workflow_link
from workflows.spot import contract
from workflows.spot.contract import FailoverNotice

REASON = "SpotFailover"


def failover_key(notice: FailoverNotice) -> str:
    """``<deployment>.<run-id-short>.<seq>``: the Event's name, the same on every retry."""
    return event_key(notice.deployment, notice.run_id, notice.seq)


def event_type(notice: FailoverNotice) -> str:
    """Warning when the Deployment was short of Ready replicas at some point, else Normal."""
    return "Warning" if notice.capacity_gap_seconds > 0 else "Normal"


def headline(notice: FailoverNotice) -> str:
    """One line: ``spot failover llm-serving/chat-v1-0-0: instance i-… (node …, pool …) reclaimed; …``."""
    pool = f", pool {notice.pool}" if notice.pool else ""
    ready = (
        f", Ready after {notice.replacement_ready_seconds:.0f} s" if notice.replacement_ready_seconds is not None
        else ", not all Ready yet"
    )
    return (
        f"spot failover {notice.namespace}/{notice.deployment}: instance {notice.instance_id} (node {notice.node}{pool}) reclaimed;"
        f" {notice.replicas_moved} replicas moved to {notice.capacity_type}{ready}; capacity gap {notice.capacity_gap_seconds:.0f} s"
    )


def event_manifest(notice: FailoverNotice, deployment_uid: str | None, now: datetime) -> dict[str, Any]:
    return deployment_event(
        notice.namespace, notice.deployment, failover_key(notice), REASON, event_type(notice), headline(notice),
        notice.workflow_id, deployment_uid, now,
    )


def webhook_payload(notice: FailoverNotice, fmt: WebhookFormat, web_ui_url: str | None) -> dict[str, Any]:
    """``generic``: every field of the notice, the link and the key (``kind`` ``spot_failover``); or ``slack``."""
    link = workflow_link(web_ui_url, notice.temporal_namespace, notice.workflow_id) if web_ui_url else None
    text = headline(notice)
    if fmt == "slack":
        return slack_payload(text, link, notice.run_id)
    return {
        "key": failover_key(notice),
        "kind": "spot_failover",
        "reason": REASON,
        "deployment": f"{notice.namespace}/{notice.deployment}",
        "instance_id": notice.instance_id,
        "node": notice.node,
        "pool": notice.pool,
        "capacity_type": notice.capacity_type,
        "replicas_moved": notice.replicas_moved,
        "replacement_ready_seconds": notice.replacement_ready_seconds,
        "capacity_gap_seconds": notice.capacity_gap_seconds,
        "text": text,
        "workflow_id": notice.workflow_id,
        "run_id": notice.run_id,
        "link": link,
    }


class SpotNotifyActivities:
    """Implements contract.SpotNotifyActivities with the worker's Notifier."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier

    @activity.defn(name=contract.NOTIFY_SPOT_FAILOVER)
    def notify_spot_failover(self, notice: FailoverNotice) -> None:
        n = self.notifier
        n.write_event(event_manifest(notice, n.deployment_uid(notice.namespace, notice.deployment), datetime.now(timezone.utc)))
        n.post(webhook_payload(notice, n.webhook_format, n.web_ui_url))
