"""Every tideplane metric, declared once, and the one way to record each: through a MetricMeter.

Workflows record with ``workflow.metric_meter()`` (the SDK drops recordings made while a history
replays, so a figure counts once, and no activity or history event is spent on it); activities
record with ``activity.metric_meter()``. Both meters feed the worker runtime's Prometheus
exporter, which ``workers/telemetry.py`` serves on ``/metrics``. Outside a worker (a unit test, the
benchmark simulator) pass ``MetricMeter.noop``.

Label scheme. The SDK's meters already add ``namespace`` (the *Temporal* namespace),
``task_queue``, ``service_name`` and ``workflow_type`` or ``activity_type`` to every series, so the
Kubernetes namespace of a deployment is ``kube_namespace`` and ``deployment`` is its logical name
(``chat``, not ``chat-1-2-0``). Rules and dashboards aggregate ``by (kube_namespace, deployment)``.

Names are final as written: counters carry ``_total`` and histograms their unit in the name,
because the exporter runs with ``counters_total_suffix`` and ``unit_suffix`` off (which keeps the
SDK's own ``temporal_*`` names as documented). Histogram buckets are declared here and handed to
the exporter as ``histogram_bucket_overrides`` (:data:`BUCKETS`).

Replay of runs recorded before metrics moved onto the meter: those histories schedule the
``record_*`` activities named below. A workflow records like this::

    if workflow.patched(telemetry.METER_PATCH):
        telemetry.gate_verdict(workflow.metric_meter(), ...)
    else:  # a run that recorded through an activity replays the activity it scheduled
        workflow.start_activity(telemetry.LEGACY_GATE_VERDICT, {...}, ...)

(no worker registers the legacy activities any more: an old run still in flight gets a
non-retryable ``NotFoundError`` for it, which the best-effort retry policies already tolerate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from temporalio.common import MetricMeter

METER_PATCH = "metrics-via-meter"
LEGACY_ROLLOUT = "record_rollout"
LEGACY_GATE_VERDICT = "record_gate_verdict"
LEGACY_SCALING_DECISION = "record_scaling_decision"


@dataclass(frozen=True)
class Metric:
    """One declared series family: what the exporter shows under ``# HELP`` and ``# TYPE``."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    description: str
    unit: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


_DEP = ("kube_namespace", "deployment")

ROLLOUTS = Metric(
    "tideplane_rollouts_total", "counter", "Finished rollouts by outcome and the stage they ended in", "1",
    (*_DEP, "outcome", "stage"),
)
ROLLOUT_PAUSED = Metric(
    "tideplane_rollout_paused", "gauge", "1 while a rollout waits paused (operator or inconclusive gate)", "1", _DEP
)
ROLLOUT_WEIGHT = Metric(
    "tideplane_rollout_weight", "gauge", "Route weight (percent) per version, as last set", "%", (*_DEP, "version")
)
GATE_VERDICTS = Metric(
    "tideplane_gate_verdicts_total", "counter",
    "Gate verdicts per observation window; gate names the failing gate ('none' on pass)", "1",
    (*_DEP, "version", "verdict", "gate"),
)
ROLLBACK_SECONDS = Metric(
    "tideplane_rollback_seconds", "histogram", "Failing verdict -> all traffic back on the stable version", "s", _DEP,
    (1, 5, 10, 30, 60, 120, 300, 600),
)
SCALING_DECISIONS = Metric(
    "tideplane_scaling_decisions_total", "counter", "Scaling decisions by direction and reason", "1",
    (*_DEP, "direction", "reason"),
)
REPLICAS_DESIRED = Metric(
    "tideplane_replicas_desired", "gauge", "Replicas the control plane wants", "1", (*_DEP, "pool", "capacity_type")
)
REPLICAS_READY = Metric(
    "tideplane_replicas_ready", "gauge", "Replicas Ready in the cluster", "1", (*_DEP, "pool", "capacity_type")
)
SCALE_UP_ATTEMPTS = Metric(
    "tideplane_scale_up_attempts_total", "counter", "Scale-ups whose outcome is known (Ready or given up)", "1",
    (*_DEP, "pool"),
)
SCALE_UP_SUCCESSES = Metric(
    "tideplane_scale_up_successes_total", "counter", "Scale-ups whose replicas all became Ready", "1", (*_DEP, "pool")
)
COLD_START_SECONDS = Metric(
    "tideplane_cold_start_seconds", "histogram",
    "Scale decision -> replica Ready (node start, image pull, weight load, warm-up)", "s", (*_DEP, "pool"),
    (15, 30, 60, 120, 180, 300, 600, 900, 1800),
)
SPOT_FAILOVERS = Metric(
    "tideplane_spot_failovers_total", "counter", "Spot interruptions handled, by how they ended", "1",
    ("pool", "outcome"),
)
CAPACITY_GAP_SECONDS = Metric(
    "tideplane_capacity_gap_seconds", "histogram", "Per failover: seconds with fewer Ready replicas than desired", "s",
    ("pool",), (0, 10, 30, 60, 120, 300, 600, 1200),
)
RETENTION_ACTIONS = Metric(
    "tideplane_registry_retention_actions_total", "counter", "Registry retention actions per model", "1",
    ("model", "action"),
)
METRIC_QUERY_ERRORS = Metric(
    "tideplane_metric_query_errors_total", "counter", "Failed queries to a metric source (gates, scaling, cost)", "1",
    ("source", "reason"),
)

BUDGET_REFUSALS = Metric(
    "tideplane_budget_refusals_total", "counter",
    "Growth over the monthly GPU budget: refused, or kept for a protected realtime class", "1",
    (*_DEP, "pool", "outcome"),
)
TENANT_MONTH_TOKENS = Metric(
    "tideplane_tenant_month_tokens", "gauge", "Tokens a tenant used on a route this calendar month, as metered at the last quota check",
    "1", ("kube_namespace", "route", "tenant"),
)
TENANT_MONTHLY_QUOTA = Metric(
    "tideplane_tenant_monthly_token_quota", "gauge", "A tenant's monthly token quota on a route", "1",
    ("kube_namespace", "route", "tenant"),
)

METRICS: tuple[Metric, ...] = (
    BUDGET_REFUSALS, TENANT_MONTH_TOKENS, TENANT_MONTHLY_QUOTA,
    ROLLOUTS, ROLLOUT_PAUSED, ROLLOUT_WEIGHT, GATE_VERDICTS, ROLLBACK_SECONDS,
    SCALING_DECISIONS, REPLICAS_DESIRED, REPLICAS_READY, SCALE_UP_ATTEMPTS, SCALE_UP_SUCCESSES, COLD_START_SECONDS,
    SPOT_FAILOVERS, CAPACITY_GAP_SECONDS, RETENTION_ACTIONS, METRIC_QUERY_ERRORS,
)  # fmt: skip
BUCKETS: dict[str, list[float]] = {m.name: [float(b) for b in m.buckets] for m in METRICS if m.buckets}

# Served by each node's weight-cache chunk server (activities/node_cache/chunk_server.py), not the worker's meter.
NODE_CACHE_BYTES = Metric(
    "tideplane_node_cache_bytes", "gauge", "Bytes of a model version held in a node's weight cache", "By",
    ("node", "model", "version"),
)
NODE_CACHE_LAST_USED = Metric(
    "tideplane_node_cache_last_used_timestamp_seconds", "gauge",
    "When a version in a node's weight cache was last staged or loaded (Unix time)", "s", ("node", "model", "version"),
)
NODE_CACHE_SERVED = Metric(
    "tideplane_node_cache_served_bytes_total", "counter", "Bytes of verified chunks a node served to its peers", "By",
    ("node",),
)
NODE_CACHE_METRICS: tuple[Metric, ...] = (NODE_CACHE_BYTES, NODE_CACHE_LAST_USED, NODE_CACHE_SERVED)


def _labels(metric: Metric, *values: str) -> dict[str, str]:
    if len(values) != len(metric.labels):
        raise ValueError(f"{metric.name} takes labels {metric.labels}, got {values}")
    return dict(zip(metric.labels, values))


def _add(meter: MetricMeter, metric: Metric, *labels: str, value: int = 1) -> None:
    meter.create_counter(metric.name, metric.description, metric.unit).add(value, _labels(metric, *labels))


def _set(meter: MetricMeter, metric: Metric, value: int, *labels: str) -> None:
    meter.create_gauge(metric.name, metric.description, metric.unit).set(value, _labels(metric, *labels))


def _observe(meter: MetricMeter, metric: Metric, value: float, *labels: str) -> None:
    meter.create_histogram_float(metric.name, metric.description, metric.unit).record(
        max(0.0, value), _labels(metric, *labels)
    )


# --- rollouts (ModelRollout, and the activity that sets route weights) -------------------------
def rollout_finished(
    meter: MetricMeter,
    kube_namespace: str,
    deployment: str,
    outcome: str,
    stage: str,
    rollback_seconds: float | None = None,
) -> None:
    """A rollout ended (promoted, rolled_back, aborted, failed) in ``stage`` (e.g. ``canary-5``);
    with a rollback, how long until all traffic was back on the stable version. Clears paused."""
    _add(meter, ROLLOUTS, kube_namespace, deployment, outcome, stage)
    _set(meter, ROLLOUT_PAUSED, 0, kube_namespace, deployment)
    if rollback_seconds is not None:
        _observe(meter, ROLLBACK_SECONDS, rollback_seconds, kube_namespace, deployment)


def rollout_paused(meter: MetricMeter, kube_namespace: str, deployment: str, paused: bool) -> None:
    """The rollout started (True) or stopped (False) waiting paused."""
    _set(meter, ROLLOUT_PAUSED, int(paused), kube_namespace, deployment)


def gate_verdict(
    meter: MetricMeter,
    kube_namespace: str,
    deployment: str,
    version: str,
    verdict: Literal["pass", "fail", "inconclusive"],
    failing_gate: str = "none",
) -> None:
    """One observation window's verdict on ``version``; ``failing_gate`` is the first gate that
    failed or had no data (ignored on pass)."""
    gate = "none" if verdict == "pass" else failing_gate
    _add(meter, GATE_VERDICTS, kube_namespace, deployment, version, verdict, gate)


def route_weights(meter: MetricMeter, kube_namespace: str, deployment: str, weights: Mapping[str, int]) -> None:
    """The HTTPRoute weights (percent per version) just applied; the rollouts dashboard plots them."""
    for version, weight in weights.items():
        _set(meter, ROLLOUT_WEIGHT, weight, kube_namespace, deployment, version)


# --- scaling ----------------------------------------------------------------------------------
def scaling_decision(
    meter: MetricMeter, kube_namespace: str, deployment: str, direction: Literal["up", "down", "hold"], reason: str
) -> None:
    """A scaling decision and its reason (queue_depth, gpu_util, ttft, schedule, prewarm, ...)."""
    _add(meter, SCALING_DECISIONS, kube_namespace, deployment, direction, reason)


def budget_refusal(
    meter: MetricMeter, kube_namespace: str, deployment: str, pool: str, outcome: Literal["refused", "protected"]
) -> None:
    """Growth the monthly budget cannot pay for: cut (refused) or kept (protected realtime class).
    A deployment's scale-up names its class's pool; a node pool's, the pool (namespace and deployment empty)."""
    _add(meter, BUDGET_REFUSALS, kube_namespace, deployment, pool, outcome)


def replicas(
    meter: MetricMeter, kube_namespace: str, deployment: str, pool: str, capacity_type: str, desired: int, ready: int
) -> None:
    """Replicas wanted and Ready for a deployment on one node pool (capacity_type: on-demand | spot)."""
    _set(meter, REPLICAS_DESIRED, desired, kube_namespace, deployment, pool, capacity_type)
    _set(meter, REPLICAS_READY, ready, kube_namespace, deployment, pool, capacity_type)


def scale_up_started(meter: MetricMeter, kube_namespace: str, deployment: str, pool: str) -> None:
    """Replicas were requested: shows the outcome counters at 0, so the first outcome is an increase."""
    _add(meter, SCALE_UP_ATTEMPTS, kube_namespace, deployment, pool, value=0)
    _add(meter, SCALE_UP_SUCCESSES, kube_namespace, deployment, pool, value=0)


def scale_up_finished(
    meter: MetricMeter, kube_namespace: str, deployment: str, pool: str, ready: bool, seconds: float
) -> None:
    """A scale-up ended: all replicas Ready after ``seconds`` (its cold start), or given up."""
    _add(meter, SCALE_UP_ATTEMPTS, kube_namespace, deployment, pool)
    _add(meter, SCALE_UP_SUCCESSES, kube_namespace, deployment, pool, value=int(ready))
    if ready:
        _observe(meter, COLD_START_SECONDS, seconds, kube_namespace, deployment, pool)


# --- token quotas (ApplyTokenQuotas) ---------------------------------------------------------
def tenant_tokens(meter: MetricMeter, kube_namespace: str, route: str, tenant: str, month_tokens: float, monthly_quota: int) -> None:
    """A tenant's metered tokens this month and its monthly quota; the TokenQuotaNearlySpent alert divides them."""
    _set(meter, TENANT_MONTH_TOKENS, int(month_tokens), kube_namespace, route, tenant)
    _set(meter, TENANT_MONTHLY_QUOTA, monthly_quota, kube_namespace, route, tenant)


# --- spot, registry, metric sources -----------------------------------------------------------
def spot_failover(meter: MetricMeter, pool: str, outcome: str, gap_seconds: float) -> None:
    """A spot interruption on ``pool`` was handled (outcome as SpotReclaim ends: drained, no-node,
    no-managed-pods, rebalance-released);
    ``gap_seconds``: how long fewer replicas than desired were Ready."""
    _add(meter, SPOT_FAILOVERS, pool, outcome)
    _observe(meter, CAPACITY_GAP_SECONDS, gap_seconds, pool)


def retention_action(meter: MetricMeter, model: str, action: str, count: int = 1) -> None:
    """Registry retention deleted or kept (``action``: deleted, kept) the weights of ``count`` versions of ``model``."""
    _add(meter, RETENTION_ACTIONS, model, action, value=count)


def metric_query_error(meter: MetricMeter, source: str, reason: str) -> None:
    """A query to a metric source failed (source: prometheus, dcgm, ...; reason: unreachable,
    bad_query, http_503, ...)."""
    _add(meter, METRIC_QUERY_ERRORS, source, reason)
