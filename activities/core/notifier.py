"""How an activity tells people about a Deployment: a Kubernetes Event on it, so ``kubectl describe
deployment`` lists it, and an optional webhook (generic JSON or Slack-compatible) with a link to
the run in the web UI. Used by the rollout's notices and the spot failover's.

Idempotent: the caller names the Event from the notice's key, so a retry that finds it there
(409 AlreadyExists) counts it as written; the webhook payload carries the same key, for a receiver
that deduplicates. The payload building is pure and tested on its own.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

import httpx
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, already_exists, fail, read_or_none
from workflows.core.naming import MANAGED_BY

WebhookFormat = Literal["generic", "slack"]
WEBHOOK_TIMEOUT = httpx.Timeout(10.0)
RUN_ID_SHORT = 8


def event_key(deployment: str, run_id: str, seq: int) -> str:
    """``<Deployment>.<run-id-short>.<seq>``: an Event's name, the same on every retry of one notice."""
    return f"{deployment}.{run_id[:RUN_ID_SHORT].lower()}.{seq}"


def deployment_event(
    namespace: str, deployment: str, key: str, reason: str, kind: str, message: str,
    workflow_id: str, deployment_uid: str | None, now: datetime,
) -> dict[str, Any]:
    """The core/v1 Event on a Deployment (its uid, when read, is what describe matches)."""
    stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": namespace, "name": deployment}
    if deployment_uid:
        involved["uid"] = deployment_uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": key, "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "type": kind,
        "message": message,
        "source": {"component": MANAGED_BY},
        "reportingComponent": MANAGED_BY,
        "reportingInstance": workflow_id,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def slack_payload(text: str, link: str | None, run_id: str) -> dict[str, Any]:
    """``{"text": ..., "blocks": [...]}``: what a Slack incoming webhook accepts."""
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    if link:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{link}|run {run_id}>"}]})
    return {"text": f"{text} {link}" if link else text, "blocks": blocks}


class Notifier:
    """The worker's cluster client and notification settings (TIDEPLANE_NOTIFY_WEBHOOK_*)."""

    def __init__(
        self, kube: KubeClient, webhook_url: str | None = None, webhook_format: WebhookFormat = "generic", web_ui_url: str | None = None
    ) -> None:
        self.kube = kube
        self.webhook_url = webhook_url
        self.webhook_format = webhook_format
        self.web_ui_url = web_ui_url

    def deployment_uid(self, namespace: str, deployment: str) -> str | None:
        found = read_or_none(self.kube.apps.read_namespaced_deployment, deployment, namespace)
        return found.metadata.uid if found is not None else None

    def write_event(self, body: dict[str, Any]) -> None:
        namespace = body["metadata"]["namespace"]
        try:
            self.kube.core.create_namespaced_event(namespace, body, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            if not already_exists(exc):  # an earlier attempt wrote it
                fail(exc, f"event {body['metadata']['name']} in {namespace}")

    def post(self, payload: dict[str, Any]) -> None:
        """Post to the webhook, if one is set; a 4xx other than 408/429 is not retried."""
        if not self.webhook_url:
            return
        try:
            answer = httpx.post(self.webhook_url, json=payload, timeout=WEBHOOK_TIMEOUT)
        except httpx.HTTPError as exc:
            raise ApplicationError(f"notification webhook unreachable: {exc}") from None
        if 400 <= answer.status_code < 500 and answer.status_code not in (408, 429):
            raise ApplicationError(
                f"notification webhook refused the notice: HTTP {answer.status_code} {answer.text[:200]}", non_retryable=True
            )
        answer.raise_for_status()
