"""Side effects of the scaling loop: signals and history from Prometheus, scale state from Kubernetes.

``ScalingActivities`` implements the contract in workflows/scaling/activities.py with the
worker's clients:

- ``read_scaling_signals`` renders the signal query templates and runs each as an instant query.
  An unreachable or failing Prometheus is not an error here: it returns ``Signals(error=...)`` so
  the loop holds and reports instead of retrying blind; a bad template or PromQL is bad input
  (non-retryable).
- ``get_scale`` reads the scaled version's Deployment and its pods: replicas, Ready, Pending and
  Unschedulable (no GPU capacity, which the node layer acts on), and the declared priority class.
- ``read_replica_history`` reads hourly replica peaks over past weeks for predictive pre-warm.
Scaling itself is the rollout's ``scale_version`` (the Deployment's scale subresource).
"""

from __future__ import annotations

import math
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from kubernetes import client
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, is_ready, label_selector, read_or_none, selector
from activities.clients.prometheus import PrometheusClient, render
from activities.rollout import deployment_state
from workflows import naming
from workflows.naming import DeploymentRef
from workflows.scaling import activities as contract
from workflows.scaling.activities import ReadSignalsInput, ReplicaHistory, ReplicaHistoryInput, ScaleStatus, ScaleTarget
from workflows.scaling.decide import Signals
from workflows.scaling.prewarm import slot_key

WEEK_SECONDS = 7 * 24 * 3600


def unschedulable(pod: client.V1Pod) -> bool:
    """A pending pod the scheduler could not place (no node with the GPUs it asks for)."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conditions)


class ScalingActivities(contract.ScalingActivities):
    """The loop's and pre-warm's activities, over the worker's Kubernetes and Prometheus clients."""

    def __init__(self, kube: KubeClient, prometheus: PrometheusClient) -> None:
        self.kube = kube
        self.prometheus = prometheus

    @activity.defn(name=contract.READ_SCALING_SIGNALS)
    def read_scaling_signals(self, req: ReadSignalsInput) -> Signals:
        variables = {"namespace": req.namespace, "deployment": req.deployment, "window": req.window}
        rendered = {name: render(name, template, variables) for name, template in req.queries.items()}
        values: dict[str, float | None] = {}
        for name, promql in rendered.items():
            try:
                values[name] = self.prometheus.value(name, promql)
            except ApplicationError as exc:
                if exc.non_retryable:
                    raise
                return Signals(error=exc.message)
        return Signals(**values)

    @activity.defn(name=contract.GET_SCALE)
    def get_scale(self, req: ScaleTarget) -> ScaleStatus:
        """The scaled version (given, or the one with the most traffic) and how its pods are doing."""
        state = deployment_state(self.kube, DeploymentRef(namespace=req.namespace, name=req.deployment))
        by_version = {v.version: v for v in state.versions}
        if req.version is not None:
            info = by_version.get(req.version)
        elif state.stable is not None:
            info = state.stable
        else:
            info = by_version[next(iter(by_version))] if len(by_version) == 1 else None
        if info is None:
            wanted = f"version {req.version}" if req.version else "a version carrying traffic"
            raise ApplicationError(
                f"{req.namespace}/{req.deployment}: no Deployment for {wanted} (have {sorted(by_version) or 'none'})",
                non_retryable=True,
            )
        dep = read_or_none(self.kube.apps.read_namespaced_deployment, naming.versioned_name(req.deployment, info.version), req.namespace)
        pods = self.kube.core.list_namespaced_pod(
            req.namespace, label_selector=label_selector(selector(req.deployment, info.version)), _request_timeout=API_TIMEOUT
        ).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        return ScaleStatus(
            version=info.version,
            replicas=info.replicas,
            ready_replicas=sum(1 for p in live if is_ready(p)),
            pending=sum(1 for p in live if (p.status.phase if p.status else "Pending") == "Pending"),
            unschedulable=sum(1 for p in live if unschedulable(p)),
            priority_class=((dep.metadata.labels if dep else None) or {}).get(naming.LABEL_CLASS),
        )

    @activity.defn(name=contract.READ_REPLICA_HISTORY)
    def read_replica_history(self, req: ReplicaHistoryInput) -> ReplicaHistory:
        """Hourly peaks of the past ``weeks`` weeks keyed by local weekday and hour."""
        try:
            tz = ZoneInfo(req.time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ApplicationError(f"unknown time zone {req.time_zone!r}", non_retryable=True) from None
        promql = render("replica_history", req.query, {"namespace": req.namespace, "deployment": req.deployment})
        end = math.floor(req.at / 3600) * 3600
        start = end - req.weeks * WEEK_SECONDS + 3600
        series = self.prometheus.range("replica history", promql, start, end, 3600)
        if len(series) > 1:
            activity.logger.warning("replica history returned %d series; using the first", len(series))
        samples: dict[str, list[float]] = {}
        for at, value in (series[0]["values"] if series else []):
            if math.isnan(float(value)):
                continue
            # the sample at a full hour is the peak of the hour that just ended
            hour = datetime.fromtimestamp(float(at) - 1, tz)
            samples.setdefault(slot_key(hour.weekday(), hour.hour), []).append(float(value))
        now = datetime.fromtimestamp(req.at, tz)
        return ReplicaHistory(samples=samples, weekday=now.weekday(), minute_of_day=now.hour * 60 + now.minute)
