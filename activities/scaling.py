"""Side effects of the scaling loop: signals and history from Prometheus, scale state from Kubernetes.

- ``read_scaling_signals`` renders the signal query templates and runs each as an instant query
  (activities.metrics helpers). An unreachable or failing Prometheus is not an error here: it
  returns ``Signals(error=...)`` so the loop holds and reports instead of retrying blind; a bad
  template or PromQL is bad input (non-retryable).
- ``get_scale`` reads the scaled version's Deployment and its pods: replicas, Ready, Pending and
  Unschedulable (no GPU capacity, which the node layer acts on), and the declared priority class;
  it sets the replicas desired/ready gauges of the control-plane metrics.
- ``read_replica_history`` reads hourly replica peaks over past weeks for predictive pre-warm.
Scaling itself is activities.kube.scale_version (the Deployment's scale subresource).
"""

from __future__ import annotations

import math
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from kubernetes import client
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube import API_TIMEOUT, _is_ready, _label_selector, _read_or_none, _selector, api_client, describe_deployment
from activities.metrics import HTTP_TIMEOUT, api, query, render
from workers import telemetry
from workflows import naming
from workflows.scaling.placement import CAPACITY_FOR_CLASS
from workflows.scaling.prewarm import slot_key
from workflows.rollout.activities import DeploymentRef
from workflows.scaling.decide import Signals
from workflows.scaling.activities import (
    GET_SCALE,
    READ_REPLICA_HISTORY,
    READ_SCALING_SIGNALS,
    ReadSignalsInput,
    ReplicaHistory,
    ReplicaHistoryInput,
    ScaleStatus,
    ScaleTarget,
)

WEEK_SECONDS = 7 * 24 * 3600


@activity.defn(name=READ_SCALING_SIGNALS)
def read_scaling_signals(req: ReadSignalsInput) -> Signals:
    variables = {"namespace": req.namespace, "deployment": req.deployment, "window": req.window}
    rendered = {name: render(name, template, variables) for name, template in req.queries.items()}
    values: dict[str, float | None] = {}
    with httpx.Client(timeout=HTTP_TIMEOUT) as http:
        for name, promql in rendered.items():
            try:
                values[name] = query(http, name, promql)
            except ApplicationError as exc:
                if exc.non_retryable:
                    raise
                return Signals(error=exc.message)
    return Signals(**values)


def _unschedulable(pod: client.V1Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conditions)


@activity.defn(name=GET_SCALE)
def get_scale(req: ScaleTarget) -> ScaleStatus:
    """The scaled version (given, or the one with the most traffic) and how its pods are doing."""
    state = describe_deployment(DeploymentRef(namespace=req.namespace, name=req.deployment))
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
    api = api_client()
    dep = _read_or_none(
        client.AppsV1Api(api).read_namespaced_deployment, naming.versioned_name(req.deployment, info.version), req.namespace
    )
    declared = ((dep.metadata.labels if dep else None) or {}).get(naming.LABEL_CLASS)
    pods = client.CoreV1Api(api).list_namespaced_pod(
        req.namespace, label_selector=_label_selector(_selector(req.deployment, info.version)), _request_timeout=API_TIMEOUT
    ).items
    live = [p for p in pods if p.metadata.deletion_timestamp is None]
    status = ScaleStatus(
        version=info.version,
        replicas=info.replicas,
        ready_replicas=sum(1 for p in live if _is_ready(p)),
        pending=sum(1 for p in live if (p.status.phase if p.status else "Pending") == "Pending"),
        unschedulable=sum(1 for p in live if _unschedulable(p)),
        priority_class=declared,
    )
    # The priority class is the pool these replicas belong to (realtime on on-demand, batch on spot).
    pool = declared or "realtime"
    labels = (req.namespace, req.deployment, pool, CAPACITY_FOR_CLASS.get(pool, "unknown"))
    telemetry.REPLICAS_DESIRED.labels(*labels).set(status.replicas)
    telemetry.REPLICAS_READY.labels(*labels).set(status.ready_replicas)
    return status


def _query_range(http: httpx.Client, promql: str, start: float, end: float, step: float) -> list[tuple[float, float]]:
    data = api(http, "replica history", "/api/v1/query_range", {"query": promql, "start": start, "end": end, "step": step})
    series = data["result"]
    if len(series) > 1:
        activity.logger.warning("replica history returned %d series; using the first", len(series))
    return [(float(t), float(v)) for t, v in (series[0]["values"] if series else []) if not math.isnan(float(v))]


@activity.defn(name=READ_REPLICA_HISTORY)
def read_replica_history(req: ReplicaHistoryInput) -> ReplicaHistory:
    """Hourly peaks of the past ``weeks`` weeks keyed by local weekday and hour."""
    try:
        tz = ZoneInfo(req.time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ApplicationError(f"unknown time zone {req.time_zone!r}", non_retryable=True) from None
    promql = render("replica_history", req.query, {"namespace": req.namespace, "deployment": req.deployment})
    end = math.floor(req.at / 3600) * 3600
    start = end - req.weeks * WEEK_SECONDS + 3600
    samples: dict[str, list[float]] = {}
    with httpx.Client(timeout=HTTP_TIMEOUT) as http:
        for at, value in _query_range(http, promql, start, end, 3600):
            # the sample at a full hour is the peak of the hour that just ended
            hour = datetime.fromtimestamp(at - 1, tz)
            samples.setdefault(slot_key(hour.weekday(), hour.hour), []).append(value)
    now = datetime.fromtimestamp(req.at, tz)
    return ReplicaHistory(samples=samples, weekday=now.weekday(), minute_of_day=now.hour * 60 + now.minute)


ACTIVITIES = [read_scaling_signals, get_scale, read_replica_history]
