"""How a rollout tells people what happened to it (issue 35): a Kubernetes Event on the version's
Deployment, so ``kubectl describe deployment`` lists it, and an optional webhook (generic JSON or
Slack-compatible) with a link to the run in the web UI.

Idempotent: the Event is named from the notice's key (``<deployment>.<run-id-short>.<seq>``), so a
retry that finds it there (409 AlreadyExists) counts it as written; the webhook payload carries the
same key, for a receiver that deduplicates. The message building is pure and tested on its own.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

import httpx
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, already_exists, fail, read_or_none
from workflows.core.naming import MANAGED_BY, workflow_link
from workflows.rollout import contract
from workflows.rollout.contract import NoticeInput, NoticeKind

WebhookFormat = Literal["generic", "slack"]
WEBHOOK_TIMEOUT = httpx.Timeout(10.0)

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
RUN_ID_SHORT = 8


def notice_key(notice: NoticeInput) -> str:
    """``<versioned deployment>.<run-id-short>.<seq>``: the Event's name, the same on every retry."""
    return f"{notice.deployment.versioned(notice.version)}.{notice.run_id[:RUN_ID_SHORT].lower()}.{notice.seq}"


def headline(notice: NoticeInput) -> str:
    """One line: ``rollout llm-serving/chat 1.3.0 rolled back at 10 %: <why>``."""
    ref = notice.deployment
    return f"rollout {ref.namespace}/{ref.name} {notice.version} {HEADLINES[notice.kind]} at {notice.weight} %: {notice.message}"


def event_manifest(notice: NoticeInput, deployment_uid: str | None, now: datetime) -> dict[str, Any]:
    """The core/v1 Event on the version's Deployment (its uid, when read, is what describe matches)."""
    reason, kind = EVENT_REASONS[notice.kind]
    name = notice.deployment.versioned(notice.version)
    stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": notice.deployment.namespace, "name": name}
    if deployment_uid:
        involved["uid"] = deployment_uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": notice_key(notice), "namespace": notice.deployment.namespace},
        "involvedObject": involved,
        "reason": reason,
        "type": kind,
        "message": headline(notice),
        "source": {"component": MANAGED_BY},
        "reportingComponent": MANAGED_BY,
        "reportingInstance": notice.workflow_id,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def webhook_payload(notice: NoticeInput, fmt: WebhookFormat, web_ui_url: str | None) -> dict[str, Any]:
    """The webhook's JSON: ``generic`` (every field of the notice, the link and the key) or
    ``slack`` (``{"text": ..., "blocks": [...]}``, what a Slack incoming webhook accepts)."""
    link = workflow_link(web_ui_url, notice.namespace, notice.workflow_id) if web_ui_url else None
    text = headline(notice)
    if fmt == "slack":
        blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
        if link:
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{link}|run {notice.run_id}>"}]})
        return {"text": f"{text} {link}" if link else text, "blocks": blocks}
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
    """Implements contract.NotifyActivities with the worker's cluster client and notification settings."""

    def __init__(
        self, kube: KubeClient, webhook_url: str | None = None, webhook_format: WebhookFormat = "generic", web_ui_url: str | None = None
    ) -> None:
        self.kube = kube
        self.webhook_url = webhook_url
        self.webhook_format = webhook_format
        self.web_ui_url = web_ui_url

    @activity.defn(name=contract.NOTIFY)
    def notify(self, notice: NoticeInput) -> None:
        self._write_event(notice)
        if self.webhook_url:
            self._post(notice)

    def _write_event(self, notice: NoticeInput) -> None:
        namespace = notice.deployment.namespace
        found = read_or_none(self.kube.apps.read_namespaced_deployment, notice.deployment.versioned(notice.version), namespace)
        body = event_manifest(notice, found.metadata.uid if found is not None else None, datetime.now(timezone.utc))
        try:
            self.kube.core.create_namespaced_event(namespace, body, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            if not already_exists(exc):  # an earlier attempt wrote it
                fail(exc, f"event {body['metadata']['name']} in {namespace}")

    def _post(self, notice: NoticeInput) -> None:
        payload = webhook_payload(notice, self.webhook_format, self.web_ui_url)
        try:
            answer = httpx.post(self.webhook_url, json=payload, timeout=WEBHOOK_TIMEOUT)
        except httpx.HTTPError as exc:
            raise ApplicationError(f"notification webhook unreachable: {exc}") from None
        if 400 <= answer.status_code < 500 and answer.status_code not in (408, 429):
            raise ApplicationError(
                f"notification webhook refused the notice: HTTP {answer.status_code} {answer.text[:200]}", non_retryable=True
            )
        answer.raise_for_status()
