"""``ScalingActivities`` (Kubernetes, Prometheus), for ReactiveScaling and PredictivePrewarm: signals
and history from Prometheus, scale state from Kubernetes (the contract is
workflows/scaling/contract.py; the node layer's is node_pool_activities.py):

- ``read_scaling_signals`` renders the signal query templates and runs each as an instant query.
  An unreachable or failing Prometheus is not an error here: it returns ``Signals(error=...)`` so
  the loop holds and reports instead of retrying blind; a bad template or PromQL is bad input
  (non-retryable).
- ``get_scale`` reads the scaled version's Deployment and its pods: replicas, Ready, Pending and
  Unschedulable (no GPU capacity, which the node layer acts on), the declared priority class, and
  the newest Ready replica's cold start by its parts (its ``ColdStart`` Events).
- ``read_replica_history`` reads hourly replica peaks over past weeks for predictive pre-warm.
- ``forecast_demand`` reads the arrival rate of the last week and a half, a sample a minute, and
  forecasts its peak over the loop's horizon with the pure ``workflows.scaling.forecast``.
Scaling itself is the rollout's ``scale_version`` (the Deployment's scale subresource).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, fail, is_ready, label_selector, read_or_none, selector
from activities.clients.prometheus import PrometheusClient, render
from activities.core.deployments import deployment_state, owned_elsewhere
from activities.core.traffic_policy import POLICY_API, apply_traffic_policy, remove_traffic_policy_fields
from workflows.core import naming
from workflows.core.naming import DeploymentRef
from workflows.core.traffic_policy import QUEUE_LIMIT_FIELDS, legacy_policy_names
from workflows.scaling import contract
from workflows.scaling.contract import (
    COLD_START_PARTS,
    PROMETHEUS_MAX_POINTS,
    ClearQueueLimitInput,
    ColdStart,
    DemandForecastInput,
    QueueLimitInput,
    ReadSignalsInput,
    ReplicaHistory,
    ReplicaHistoryInput,
    ScaleStatus,
    ScaleTarget,
)
from workflows.scaling.decide import Signals
from workflows.scaling.forecast import WEEK_S, DemandForecast, forecast_demand
from workflows.scaling.prewarm import slot_key
from workflows.scaling.queue_limit import QueueLimit

WEEK_SECONDS = 7 * 24 * 3600
_COLD_START_MESSAGE = re.compile(rf"^({'|'.join(COLD_START_PARTS)}) ([0-9]+(?:\.[0-9]+)?)s\b")
RETRY_AFTER_ANNOTATION = "tideplane.io/retry-after-seconds"


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
        if dep is not None and req.owner is not None:
            self._claim(dep, req.owner)
        pods = self.kube.core.list_namespaced_pod(
            req.namespace, label_selector=label_selector(selector(req.deployment, info.version)), _request_timeout=API_TIMEOUT
        ).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        return ScaleStatus(
            version=info.version,
            replicas=info.replicas,  # version_replicas' total: a spot mix's, not its versioned Deployment's 0
            ready_replicas=sum(1 for p in live if is_ready(p)),
            pending=sum(1 for p in live if (p.status.phase if p.status else "Pending") == "Pending"),
            unschedulable=sum(1 for p in live if unschedulable(p)),
            priority_class=((dep.metadata.labels if dep else None) or {}).get(naming.LABEL_CLASS),
            cold_start=self._cold_start(req.namespace, [p for p in live if is_ready(p)]),
            canary=next((v.version for v in state.versions if v.route_weight > 0 and v.version != info.version), None),
        )

    def _cold_start(self, namespace: str, ready: list[client.V1Pod]) -> ColdStart | None:
        """The newest Ready replica's ColdStart Events, part -> seconds (None: no replica, no events)."""
        if not ready:
            return None
        newest = max(ready, key=lambda p: (p.status.start_time or p.metadata.creation_timestamp, p.metadata.name))
        events = self.kube.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={newest.metadata.name},reason=ColdStart", _request_timeout=API_TIMEOUT
        ).items
        parts = {m[1]: float(m[2]) for e in events if (m := _COLD_START_MESSAGE.match(e.message or ""))}
        return ColdStart(pod=newest.metadata.name, parts=parts) if parts else None

    def _claim(self, dep: client.V1Deployment, owner: str) -> None:
        """One scaling loop per deployment, whatever its workflow ID: the scaled Deployment carries
        its loop's ID (replace with the resourceVersion read: compare-and-swap); another loop's is refused."""
        held = (dep.metadata.annotations or {}).get(naming.ANNOTATION_OWNER)
        what = f"Deployment {dep.metadata.namespace}/{dep.metadata.name}"
        if held == owner:
            return
        if held is not None:
            raise owned_elsewhere(what, held, owner)
        dep.metadata.annotations = {**(dep.metadata.annotations or {}), naming.ANNOTATION_OWNER: owner}
        try:
            self.kube.apps.replace_namespaced_deployment(dep.metadata.name, dep.metadata.namespace, dep, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            if exc.status == 409:  # changed since read (maybe another loop claimed it): the next cycle decides
                raise ApplicationError(f"{what} changed while claiming it for {owner}; retrying") from None
            fail(exc, what)

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

    @activity.defn(name=contract.SET_QUEUE_LIMIT)
    def set_queue_limit(self, req: QueueLimitInput) -> None:
        """Write the queue limit into the route's BackendTrafficPolicy, keeping its token quotas;
        a policy that already says the same is left alone."""
        apply_traffic_policy(self.kube, queue_limit_policy(req.deployment, req.limit), QUEUE_LIMIT_FIELDS)

    @activity.defn(name=contract.CLEAR_QUEUE_LIMIT)
    def clear_queue_limit(self, req: ClearQueueLimitInput) -> str:
        """Take the queue limit (its fields and its Retry-After annotation) out of the route's
        BackendTrafficPolicy, keeping the token quotas and anyone else's fields."""
        ref = req.deployment
        return remove_traffic_policy_fields(self.kube, ref.namespace, ref.name, QUEUE_LIMIT_FIELDS, (RETRY_AFTER_ANNOTATION,),
                                            legacy_name=legacy_policy_names(ref.name)[0])

    @activity.defn(name=contract.FORECAST_DEMAND)
    def forecast_demand(self, req: DemandForecastInput) -> DemandForecast:
        """The demand forecast over ``horizon_seconds`` from the last week and a half of the arrival rate."""
        promql = render("demand_rate", req.query, {"namespace": req.namespace, "deployment": req.deployment})
        end = math.floor(req.at / req.step_seconds) * req.step_seconds
        points = min(PROMETHEUS_MAX_POINTS - 1, math.ceil((WEEK_S + 2 * req.horizon_seconds + 8 * 3600) / req.step_seconds))
        start = end - points * req.step_seconds
        series = self.prometheus.range("demand rate", promql, start, end, req.step_seconds)
        if len(series) > 1:
            activity.logger.warning("demand rate returned %d series; using the first", len(series))
        # one slot per step from start to end; a step with no sample (no data, or the deployment did
        # not exist yet) stays None, so history begins at the first measured sample
        history: list[float | None] = [None] * (points + 1)
        for at, value in (series[0]["values"] if series else []):
            index = round((float(at) - start) / req.step_seconds)
            if 0 <= index <= points and not math.isnan(float(value)):
                history[index] = float(value)
        first = next((i for i, v in enumerate(history) if v is not None), len(history))
        return forecast_demand(history[first:], req.step_seconds, req.horizon_seconds, req.error_quantile)


def queue_limit_policy(ref: DeploymentRef, limit: QueueLimit) -> dict:
    """Envoy Gateway's BackendTrafficPolicy on the deployment's HTTPRoute: requests beyond
    ``maxPendingRequests`` waiting are refused at once (Envoy's circuit breaker answers 503), and
    the response override makes that a 429 the client knows to retry after ``Retry-After``."""
    return {
        "apiVersion": "/".join(POLICY_API),
        "kind": "BackendTrafficPolicy",
        "metadata": {
            "name": naming.traffic_policy_name(ref.name),
            "namespace": ref.namespace,
            "labels": {naming.LABEL_APP: ref.name, naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
            "annotations": {RETRY_AFTER_ANNOTATION: str(limit.retry_after_seconds)},
        },
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": ref.name}],
            "circuitBreaker": {"maxPendingRequests": limit.max_pending_requests},
            "responseOverride": [{
                "source": "Local",  # Envoy's own overflow answer, not a backend's 503
                "match": {"statusCodes": [{"type": "Value", "value": 503}]},
                "response": {
                    "statusCode": 429,
                    "contentType": "application/json",
                    "body": {"type": "Inline", "inline": '{"object": "error", "message": "queue full: retry later", "code": 429}'},
                },
            }],
        },
    }


