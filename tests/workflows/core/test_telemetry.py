"""The worker's /metrics: tideplane's metrics, recorded through the SDK's metric meters, and the
Temporal SDK's own, from one exporter.

A workflow records through ``workflow.metric_meter()`` and an activity through
``activity.metric_meter()`` with the functions of ``workflows/core/telemetry.py``, on a worker whose
client uses ``workers.telemetry.metrics_runtime``; /metrics is read over HTTP as Prometheus would.
The workflow cache is off, so every workflow task replays the history from the start: a figure
recorded before a timer must still count once.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

# The sandbox re-imports this module to run TelemetryProbe: pass everything else through.
with workflow.unsafe.imports_passed_through():
    import httpx
    import pytest
    from prometheus_client.parser import text_string_to_metric_families

    from infra.sandbox.ports import free_port
    from workers.telemetry import metrics_runtime
    from workflows.core import telemetry

NS, DEP = "telemetry-test", f"chat-{uuid.uuid4().hex[:6]}"


@activity.defn(name="telemetry_probe_weights")
def set_weights(deployment: str) -> None:
    """What the route-weight activity records after it applied the weights."""
    telemetry.route_weights(activity.metric_meter(), NS, deployment, {"1.0.0": 100, "2.0.0": 0})


@workflow.defn(name="TelemetryProbe")
class TelemetryProbe:
    """What a rollout that failed its 5 % gate and one scale-up record, around timers."""

    @workflow.run
    async def run(self, deployment: str) -> None:
        meter = workflow.metric_meter()
        telemetry.gate_verdict(meter, NS, deployment, "2.0.0", "fail", failing_gate="error_rate")
        await workflow.sleep(timedelta(seconds=5))
        await workflow.execute_activity(set_weights, deployment, start_to_close_timeout=timedelta(seconds=10))
        telemetry.rollout_finished(meter, NS, deployment, "rolled_back", "canary-5", rollback_seconds=4.5)
        telemetry.scaling_decision(meter, NS, deployment, "up", "queue_depth")
        telemetry.scale_up_started(meter, NS, deployment, "gpu-spot")
        await workflow.sleep(timedelta(seconds=5))
        telemetry.scale_up_finished(meter, NS, deployment, "gpu-spot", ready=True, seconds=95)


@pytest.fixture(scope="module")
def runtime_port():
    port = free_port()
    return metrics_runtime(port, host="127.0.0.1"), port


def samples(port: int) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def ours(got: dict, name: str, deployment: str) -> dict[frozenset, float]:
    """This test's series of ``name``, with the labels the SDK adds to every series removed."""
    sdk = {"namespace", "task_queue", "workflow_type", "activity_type", "service_name"}
    return {
        frozenset((k, v) for k, v in labels if k not in sdk): value
        for (n, labels), value in got.items()
        if n == name and ("deployment", deployment) in labels
    }


async def test_workflow_and_activity_metrics_on_the_worker_endpoint(time_skipping_env, runtime_port):
    runtime, port = runtime_port
    client = await Client.connect(
        time_skipping_env.client.service_client.config.target_host,
        namespace=time_skipping_env.client.namespace,
        data_converter=pydantic_data_converter,
        runtime=runtime,
    )
    queue = f"telemetry-{uuid.uuid4()}"
    async with Worker(
        client, task_queue=queue, workflows=[TelemetryProbe], activities=[set_weights],
        activity_executor=ThreadPoolExecutor(2),
        max_cached_workflows=0,  # every task replays the whole history
    ):
        await client.execute_workflow(TelemetryProbe.run, DEP, id=f"probe-{uuid.uuid4()}", task_queue=queue)

    got = samples(port)
    dep = {("kube_namespace", NS), ("deployment", DEP)}
    assert ours(got, "tideplane_gate_verdicts_total", DEP) == {
        frozenset(dep | {("version", "2.0.0"), ("verdict", "fail"), ("gate", "error_rate")}): 1
    }
    assert ours(got, "tideplane_rollouts_total", DEP) == {
        frozenset(dep | {("outcome", "rolled_back"), ("stage", "canary-5")}): 1
    }
    assert ours(got, "tideplane_rollback_seconds_sum", DEP) == {frozenset(dep): 4.5}
    assert ours(got, "tideplane_rollout_paused", DEP) == {frozenset(dep): 0}
    assert ours(got, "tideplane_scaling_decisions_total", DEP) == {
        frozenset(dep | {("direction", "up"), ("reason", "queue_depth")}): 1
    }
    pool = frozenset(dep | {("pool", "gpu-spot")})
    assert ours(got, "tideplane_scale_up_attempts_total", DEP) == {pool: 1}
    assert ours(got, "tideplane_scale_up_successes_total", DEP) == {pool: 1}
    # The buckets declared with the metric, not the SDK's millisecond defaults.
    cold = ours(got, "tideplane_cold_start_seconds_bucket", DEP)
    assert cold[pool | {("le", "60")}] == 0 and cold[pool | {("le", "120")}] == 1
    assert {dict(k)["le"] for k in cold} == {*(f"{b:g}" for b in telemetry.COLD_START_SECONDS.buckets), "+Inf"}
    weights = ours(got, "tideplane_rollout_weight", DEP)
    assert weights == {frozenset(dep | {("version", "1.0.0")}): 100, frozenset(dep | {("version", "2.0.0")}): 0}

    # The SDK's labels tell Temporal's namespace from the deployment's Kubernetes namespace.
    ((labels, _),) = [(dict(k), v) for (n, k), v in got.items() if n == "tideplane_rollouts_total" and ("deployment", DEP) in k]
    assert labels["namespace"] == time_skipping_env.client.namespace and labels["kube_namespace"] == NS
    assert labels["workflow_type"] == "TelemetryProbe" and labels["task_queue"] == queue
    ((labels, _),) = [(dict(k), v) for (n, k), v in got.items() if n == "tideplane_rollout_weight" and ("version", "1.0.0") in k and ("deployment", DEP) in k]
    assert labels["activity_type"] == "telemetry_probe_weights"

    # The Temporal SDK's own metrics, same exporter, their documented names.
    completed = [v for (name, labels), v in got.items()
                 if name.startswith("temporal_workflow_completed") and ("workflow_type", "TelemetryProbe") in labels]
    assert completed == [1]
    assert any(name.startswith("temporal_activity_execution_latency") for name, _ in got)


def test_metrics_endpoint_paths(runtime_port):
    _, port = runtime_port
    assert httpx.get(f"http://127.0.0.1:{port}/nope").status_code == 404
    resp = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert resp.status_code == 200 and "version=0.0.4" in resp.headers["content-type"]


def test_a_taken_port_is_refused(runtime_port):
    _, port = runtime_port
    with pytest.raises(ValueError, match="Address already in use"):
        metrics_runtime(port, host="127.0.0.1")


def test_every_metric_declared_once_with_prometheus_conventions():
    names = [m.name for m in telemetry.METRICS]
    assert len(names) == len(set(names))
    for m in telemetry.METRICS:
        assert m.name.startswith("tideplane_")
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        assert (m.kind == "histogram") == bool(m.buckets) and list(m.buckets) == sorted(m.buckets), m.name
        assert "namespace" not in m.labels, f"{m.name}: 'namespace' is the SDK's (Temporal's) label"
    assert set(telemetry.BUCKETS) == {m.name for m in telemetry.METRICS if m.kind == "histogram"}

