"""How a rollout tells people what happened to it (issue 35): a Kubernetes Event on the version's
Deployment and the optional webhook, through activities/core/notifier.py. The Event is named from
the notice's key (``<versioned deployment>.<run-id-short>.<seq>``), so a retry writes it once.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from temporalio import activity

from activities.core.notifier import Notifier, WebhookFormat, deployment_event, event_key, slack_payload
from workflows.core.naming import workflow_link
from workflows.rollout import contract
from workflows.rollout.contract import NoticeInput, NoticeKind

# Event reason (CamelCase, as Kubernetes components write them) and type of each notice.
EVENT_REASONS = {
    NoticeKind.PAUSED: ("RolloutPaused", "Warning"),
    NoticeKind.RESUMED: ("RolloutResumed", "Normal"),
    NoticeKind.ROLLED_BACK: ("RolloutRolledBack", "Warning"),
    NoticeKind.ABORTED: ("RolloutAborted", "Warning"),
    NoticeKind.PROMOTED: ("RolloutPromoted", "Normal"),
}
HEADLINES = {
    NoticeKind.PAUSED: "paused",
    NoticeKind.RESUMED: "resumed",
    NoticeKind.ROLLED_BACK: "rolled back",
    NoticeKind.ABORTED: "aborted",
    NoticeKind.PROMOTED: "promoted",
}


def notice_key(notice: NoticeInput) -> str:
    """``<versioned deployment>.<run-id-short>.<seq>``: the Event's name, the same on every retry."""
    return event_key(notice.deployment.versioned(notice.version), notice.run_id, notice.seq)


def headline(notice: NoticeInput) -> str:
    """One line: ``rollout llm-serving/chat 1.3.0 rolled back at 10 %: <why>``."""
    ref = notice.deployment
    return f"rollout {ref.namespace}/{ref.name} {notice.version} {HEADLINES[notice.kind]} at {notice.weight} %: {notice.message}"


def event_manifest(notice: NoticeInput, deployment_uid: str | None, now: datetime) -> dict[str, Any]:
    """The core/v1 Event on the version's Deployment."""
    reason, kind = EVENT_REASONS[notice.kind]
    return deployment_event(
        notice.deployment.namespace, notice.deployment.versioned(notice.version), notice_key(notice), reason, kind,
        headline(notice), notice.workflow_id, deployment_uid, now,
    )


def webhook_payload(notice: NoticeInput, fmt: WebhookFormat, web_ui_url: str | None) -> dict[str, Any]:
    """The webhook's JSON: ``generic`` (every field of the notice, the link and the key) or ``slack``."""
    link = workflow_link(web_ui_url, notice.namespace, notice.workflow_id) if web_ui_url else None
    text = headline(notice)
    if fmt == "slack":
        return slack_payload(text, link, notice.run_id)
    reason, _ = EVENT_REASONS[notice.kind]
    return {
        "key": notice_key(notice),
        "kind": notice.kind.value,
        "reason": reason,
        "deployment": f"{notice.deployment.namespace}/{notice.deployment.name}",
        "version": notice.version,
        "weight": notice.weight,
        "message": notice.message,
        "text": text,
        "workflow_id": notice.workflow_id,
        "run_id": notice.run_id,
        "link": link,
    }


class NotifyActivities:
    """Implements contract.NotifyActivities with the worker's Notifier."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier

    @activity.defn(name=contract.NOTIFY)
    def notify(self, notice: NoticeInput) -> None:
        n = self.notifier
        uid = n.deployment_uid(notice.deployment.namespace, notice.deployment.versioned(notice.version))
        n.write_event(event_manifest(notice, uid, datetime.now(timezone.utc)))
        n.post(webhook_payload(notice, n.webhook_format, n.web_ui_url))
