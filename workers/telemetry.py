"""tideplane's control-plane metrics and the worker's /metrics endpoint.

What the control plane did and why, as Prometheus series, so dashboards can put a rollback or a
scale-up next to the latency users felt. Activities record directly with the module-level
metrics (``telemetry.ROLLOUTS.labels(...).inc()``): they run in the worker process. Workflows
cannot do I/O, so they record through the small ``record_*`` activities below (register
``telemetry.ACTIVITIES`` on the worker).

One port serves everything: :func:`start_metrics_server` binds the Temporal SDK's own Prometheus
exporter on a private loopback port and serves, on the public port, tideplane's metrics followed
by the SDK's text (the two sets never share a name: ``tideplane_*`` vs ``temporal_*``). One
scrape target per worker pod, one port to open.
"""

from __future__ import annotations

import logging
import threading
import urllib.request
from dataclasses import dataclass
from typing import Literal
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import ThreadingWSGIServer
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from infra.sandbox.ports import free_port
from workflows.telemetry import BUCKETS

log = logging.getLogger(__name__)

_DEP = ("namespace", "deployment")

# --- rollouts ---------------------------------------------------------------------------------
ROLLOUTS = Counter(
    "tideplane_rollouts", "Finished rollouts by outcome and the stage they ended in", (*_DEP, "outcome", "stage")
)
ROLLOUT_PAUSED = Gauge("tideplane_rollout_paused", "1 while a rollout waits paused (operator or inconclusive gate)", _DEP)
ROLLOUT_WEIGHT = Gauge("tideplane_rollout_weight", "Route weight (percent) per version, as last set", (*_DEP, "version"))
GATE_VERDICTS = Counter(
    "tideplane_gate_verdicts",
    "Gate verdicts per observation window; gate names the failing gate ('none' on pass)",
    (*_DEP, "version", "verdict", "gate"),
)
ROLLBACK_SECONDS = Histogram(
    "tideplane_rollback_seconds",
    "Failing verdict -> all traffic back on the stable version",
    _DEP,
    buckets=(1, 5, 10, 30, 60, 120, 300, 600),
)

# --- scaling ----------------------------------------------------------------------------------
SCALING_DECISIONS = Counter(
    "tideplane_scaling_decisions", "Scaling decisions by direction and reason", (*_DEP, "direction", "reason")
)
REPLICAS_DESIRED = Gauge("tideplane_replicas_desired", "Replicas the control plane wants", (*_DEP, "pool", "capacity_type"))
REPLICAS_READY = Gauge("tideplane_replicas_ready", "Replicas Ready in the cluster", (*_DEP, "pool", "capacity_type"))
SCALE_UP_ATTEMPTS = Counter(
    "tideplane_scale_up_attempts", "Scale-ups whose outcome is known (Ready or given up)", (*_DEP, "pool")
)
SCALE_UP_SUCCESSES = Counter("tideplane_scale_up_successes", "Scale-ups whose replicas all became Ready", (*_DEP, "pool"))
COLD_START_SECONDS = Histogram(
    "tideplane_cold_start_seconds",
    "Scale decision -> replica Ready (node start, image pull, weight load, warm-up)",
    (*_DEP, "pool"),
    buckets=(15, 30, 60, 120, 180, 300, 600, 900, 1800),
)

# --- spot, registry, metric sources -----------------------------------------------------------
SPOT_FAILOVERS = Counter("tideplane_spot_failovers", "Spot interruptions handled", ("pool", "outcome"))
CAPACITY_GAP_SECONDS = Histogram(
    "tideplane_capacity_gap_seconds",
    "Per failover: seconds with fewer Ready replicas than desired",
    ("pool",),
    buckets=(0, 10, 30, 60, 120, 300, 600, 1200),
)
RETENTION_ACTIONS = Counter("tideplane_registry_retention_actions", "Registry retention actions", ("model", "action"))
METRIC_QUERY_ERRORS = Counter(
    "tideplane_metric_query_errors", "Failed queries to a metric source (gates, scaling, cost)", ("source", "reason")
)


# --- record activities: how workflows record (they cannot touch the registry) -------------------
RECORD_ROLLOUT = "record_rollout"
RECORD_GATE_VERDICT = "record_gate_verdict"
RECORD_SCALING_DECISION = "record_scaling_decision"


class RolloutEvent(BaseModel):
    namespace: str
    deployment: str = Field(description="logical name, e.g. 'chat'")
    event: Literal["paused", "resumed", "promoted", "rolled_back", "aborted", "failed"]
    stage: str = Field(description="stage the rollout was in, e.g. 'canary-5'")
    rollback_seconds: float | None = Field(None, ge=0, description="with rolled_back: verdict -> traffic restored")


class GateVerdictEvent(BaseModel):
    namespace: str
    deployment: str
    version: str
    verdict: Literal["pass", "fail", "inconclusive"]
    failing_gate: str = Field("none", description="the first gate that failed or had no data")


class ScalingDecisionEvent(BaseModel):
    namespace: str
    deployment: str
    direction: Literal["up", "down", "hold"]
    reason: str = Field(description="e.g. queue_depth, gpu_util, ttft, schedule, prewarm, metric_fallback")


@activity.defn(name=RECORD_ROLLOUT)
async def record_rollout(event: RolloutEvent) -> None:
    """Paused/resumed flip the paused gauge; the other events end the rollout and count it."""
    dep = (event.namespace, event.deployment)
    ROLLOUT_PAUSED.labels(*dep).set(1 if event.event == "paused" else 0)
    if event.event in ("paused", "resumed"):
        return
    ROLLOUTS.labels(*dep, event.event, event.stage).inc()
    if event.rollback_seconds is not None:
        ROLLBACK_SECONDS.labels(*dep).observe(event.rollback_seconds)


@activity.defn(name=RECORD_GATE_VERDICT)
async def record_gate_verdict(event: GateVerdictEvent) -> None:
    gate = "none" if event.verdict == "pass" else event.failing_gate
    GATE_VERDICTS.labels(event.namespace, event.deployment, event.version, event.verdict, gate).inc()


@activity.defn(name=RECORD_SCALING_DECISION)
async def record_scaling_decision(event: ScalingDecisionEvent) -> None:
    SCALING_DECISIONS.labels(event.namespace, event.deployment, event.direction, event.reason).inc()


ACTIVITIES = [record_rollout, record_gate_verdict, record_scaling_decision]


def scale_up_started(namespace: str, deployment: str, pool: str) -> None:
    """Call when replicas are requested: creates the series at 0 so the first outcome is an increase."""
    SCALE_UP_ATTEMPTS.labels(namespace, deployment, pool)
    SCALE_UP_SUCCESSES.labels(namespace, deployment, pool)
    COLD_START_SECONDS.labels(namespace, deployment, pool)


def scale_up_finished(namespace: str, deployment: str, pool: str, ready: bool, seconds: float) -> None:
    """Call when the scale-up ended: all replicas Ready after ``seconds`` (cold start), or given up."""
    SCALE_UP_ATTEMPTS.labels(namespace, deployment, pool).inc()
    if ready:
        SCALE_UP_SUCCESSES.labels(namespace, deployment, pool).inc()
        COLD_START_SECONDS.labels(namespace, deployment, pool).observe(seconds)


def record_route_weights(namespace: str, deployment: str, weights: dict[str, int]) -> None:
    """Called by the activity that sets HTTPRoute weights: the rollouts dashboard plots these."""
    for version, weight in weights.items():
        ROLLOUT_WEIGHT.labels(namespace, deployment, version).set(weight)


# --- the /metrics endpoint --------------------------------------------------------------------
@dataclass
class MetricsServer:
    """The running endpoint; pass ``runtime`` to ``Client.connect`` so SDK metrics are recorded."""

    port: int
    runtime: Runtime
    sdk_port: int
    _server: WSGIServer
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        """A scrape every few seconds is not worth a log line."""


def _sdk_text(sdk_port: int) -> bytes:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sdk_port}/metrics", timeout=2) as resp:
            text = resp.read()
    except OSError as exc:
        log.warning("Temporal SDK metrics unavailable on 127.0.0.1:%d: %s", sdk_port, exc)
        return b""
    return text if text.endswith(b"\n") or not text else text + b"\n"


def start_metrics_server(port: int, host: str = "0.0.0.0") -> MetricsServer:
    """Serve tideplane's and the Temporal SDK's metrics together on ``host:port``.

    Also installs the telemetry runtime as Temporal's default, so clients created afterwards
    record SDK metrics without passing ``runtime=`` (passing it is still clearer).
    """
    disable_created_metrics()  # *_created series only double the scrape size
    sdk_port = free_port()
    runtime = Runtime(
        telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{sdk_port}"))
    )
    Runtime.set_default(runtime, error_if_already_set=False)

    def app(environ, start_response):
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found; try /metrics\n"]
        body = generate_latest(REGISTRY) + _sdk_text(sdk_port)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)])
        return [body]

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="tideplane-metrics", daemon=True)
    thread.start()
    return MetricsServer(server.server_port, runtime, sdk_port, server, thread)


def metrics_runtime(port: int, host: str = "0.0.0.0") -> Runtime:
    """A Temporal runtime serving every metric on ``http://host:port/metrics``.

    Pass it to ``Client.connect(runtime=...)``: the workers of that client record into it.
    Names are exported as declared (no ``_total``/unit suffixes added), so the SDK's own metrics
    keep their documented names; histograms get the buckets declared with each metric. Raises
    ValueError when the port is taken.
    """
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=f"{host}:{port}", histogram_bucket_overrides=BUCKETS)
        )
    )
