"""What the canary's pods and load look like beside a gate verdict, read from the real systems:
Ready and crashed pods of both versions from the Kubernetes API (a container's last termination
``OOMKilled`` or its wait ``CrashLoopBackOff``), each version's request rate and the gateway's
no-healthy-upstream count from Prometheus. The workflow names the verdict's cause from it
(workflows/rollout/diagnosis.py). Read-only, so any retry is safe; every call is bounded by the
clients' timeouts.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, is_ready, label_selector, selector
from activities.clients.prometheus import PrometheusClient, render, scalar
from workflows.rollout import contract
from workflows.rollout.contract import READ_CANARY_FLEET, CanaryFleetInput
from workflows.rollout.diagnosis import CRASH_REASONS, CanaryFleet

FLEET_QUERIES = ("canary_rps", "stable_rps", "no_healthy_upstream")


def crash_reason(pod) -> str | None:
    """OOMKilled or CrashLoopBackOff when one of the pod's containers was killed or waits so."""
    for status in (pod.status.container_statuses if pod.status else None) or []:
        waiting = status.state.waiting if status.state else None
        if waiting is not None and waiting.reason in CRASH_REASONS:
            return waiting.reason
        terminated = status.last_state.terminated if status.last_state else None
        if terminated is not None and terminated.reason in CRASH_REASONS:
            return terminated.reason
    return None


class CanaryFleetActivities(contract.CanaryFleetActivities):
    def __init__(self, kube: KubeClient, prometheus: PrometheusClient) -> None:
        self.kube = kube
        self.prometheus = prometheus

    @activity.defn(name=READ_CANARY_FLEET)
    def read_canary_fleet(self, req: CanaryFleetInput) -> CanaryFleet:
        unknown = set(req.queries) - set(FLEET_QUERIES)
        if unknown:
            raise ApplicationError(f"read_canary_fleet: unknown queries {sorted(unknown)}; known: {list(FLEET_QUERIES)}",
                                   type="ValidationError", non_retryable=True)
        rendered = {name: render(name, template, req.variables) for name, template in req.queries.items()}
        canary = self._pods(req, req.version)
        stable = self._pods(req, req.stable_version)
        values = {name: scalar(name, self.prometheus.instant(name, promql)) for name, promql in rendered.items()}
        return CanaryFleet(
            weight=req.weight,
            canary_wanted=req.canary_wanted,
            canary_ready=sum(1 for p in canary if is_ready(p)),
            stable_ready=sum(1 for p in stable if is_ready(p)),
            crashed={p.metadata.name: why for p in canary if (why := crash_reason(p)) is not None},
            no_healthy_upstream=max(0.0, values.get("no_healthy_upstream") or 0.0),
            canary_rps=values.get("canary_rps"),
            stable_rps=values.get("stable_rps"),
        )

    def _pods(self, req: CanaryFleetInput, version: str) -> list:
        ref = req.deployment
        pods = self.kube.core.list_namespaced_pod(
            ref.namespace, label_selector=label_selector(selector(ref.name, version)), _request_timeout=API_TIMEOUT
        ).items
        return [p for p in pods if p.metadata.deletion_timestamp is None]
