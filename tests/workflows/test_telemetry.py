"""The worker's /metrics: tideplane's control-plane metrics and the Temporal SDK's, on one port.

A workflow records its outcomes through the record_* activities exactly as the rollout and
scaling workflows do; a worker runs it against Temporal's test server with a client on the
telemetry runtime, then we read /metrics over HTTP as Prometheus would.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

# The sandbox re-imports this module to run TelemetryProbe: pass everything else through.
with workflow.unsafe.imports_passed_through():
    import httpx
    import pytest
    from prometheus_client.parser import text_string_to_metric_families

    from infra.sandbox.ports import free_port
    from workers import telemetry
    from workers.telemetry import GateVerdictEvent, RolloutEvent, ScalingDecisionEvent

NS, DEP = "telemetry-test", f"chat-{uuid.uuid4().hex[:6]}"


@workflow.defn(name="TelemetryProbe")
class TelemetryProbe:
    """Records what a rollout that failed its 5 % gate and one scale-up decision would record."""

    @workflow.run
    async def run(self, deployment: str) -> None:
        timeout = timedelta(seconds=10)
        await workflow.execute_activity(telemetry.RECORD_GATE_VERDICT, GateVerdictEvent(
            namespace=NS, deployment=deployment, version="2.0.0", verdict="fail", failing_gate="error_rate"),
            start_to_close_timeout=timeout)
        await workflow.execute_activity(telemetry.RECORD_ROLLOUT, RolloutEvent(
            namespace=NS, deployment=deployment, event="rolled_back", stage="canary-5", rollback_seconds=4.5),
            start_to_close_timeout=timeout)
        await workflow.execute_activity(telemetry.RECORD_SCALING_DECISION, ScalingDecisionEvent(
            namespace=NS, deployment=deployment, direction="up", reason="queue_depth"),
            start_to_close_timeout=timeout)


@pytest.fixture(scope="module")
def metrics_server():
    server = telemetry.start_metrics_server(free_port(), host="127.0.0.1")
    yield server
    server.close()


def samples(port: int) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_worker_metrics_show_tideplane_and_sdk_metrics(time_skipping_env, metrics_server):
    client = await Client.connect(
        time_skipping_env.client.service_client.config.target_host,
        namespace=time_skipping_env.client.namespace,
        data_converter=pydantic_data_converter,
        runtime=metrics_server.runtime,
    )
    queue = f"telemetry-{uuid.uuid4()}"
    async with Worker(client, task_queue=queue, workflows=[TelemetryProbe], activities=telemetry.ACTIVITIES):
        await client.execute_workflow(TelemetryProbe.run, DEP, id=f"probe-{uuid.uuid4()}", task_queue=queue)
    # What scaling and rollout activities record directly in the worker process.
    telemetry.scale_up_started(NS, DEP, "gpu-spot")
    telemetry.scale_up_finished(NS, DEP, "gpu-spot", ready=True, seconds=95)
    telemetry.record_route_weights(NS, DEP, {"1.0.0": 100, "2.0.0": 0})

    got = samples(metrics_server.port)
    dep = {("namespace", NS), ("deployment", DEP)}
    assert got[("tideplane_rollouts_total", frozenset(dep | {("outcome", "rolled_back"), ("stage", "canary-5")}))] == 1
    assert got[("tideplane_rollback_seconds_sum", frozenset(dep))] == 4.5
    assert got[("tideplane_rollout_paused", frozenset(dep))] == 0
    verdict = dep | {("version", "2.0.0"), ("verdict", "fail"), ("gate", "error_rate")}
    assert got[("tideplane_gate_verdicts_total", frozenset(verdict))] == 1
    assert got[("tideplane_scaling_decisions_total", frozenset(dep | {("direction", "up"), ("reason", "queue_depth")}))] == 1
    pool = frozenset(dep | {("pool", "gpu-spot")})
    assert got[("tideplane_scale_up_attempts_total", pool)] == got[("tideplane_scale_up_successes_total", pool)] == 1
    assert got[("tideplane_cold_start_seconds_bucket", pool | {("le", "120.0")})] == 1
    assert got[("tideplane_cold_start_seconds_bucket", pool | {("le", "60.0")})] == 0
    assert got[("tideplane_rollout_weight", frozenset(dep | {("version", "1.0.0")}))] == 100

    # The Temporal SDK's own metrics, from the runtime's Prometheus exporter, on the same port.
    completed = [v for (name, labels), v in got.items()
                 if name.startswith("temporal_workflow_completed") and ("workflow_type", "TelemetryProbe") in labels]
    assert completed and sum(completed) >= 1
    assert any(name.startswith("temporal_activity_execution_latency") for name, _ in got)


def test_metrics_endpoint_paths(metrics_server):
    assert httpx.get(f"http://127.0.0.1:{metrics_server.port}/nope").status_code == 404
    resp = httpx.get(f"http://127.0.0.1:{metrics_server.port}/metrics")
    assert resp.status_code == 200 and "version=0.0.4" in resp.headers["content-type"]
