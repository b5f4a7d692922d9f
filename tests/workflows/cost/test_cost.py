"""Cost: the CostReport workflow reading a real Prometheus that scrapes an exporter whose GPUs,
pods, nodes and token rates we control (the pure arithmetic: tests/unit/cost/test_cost.py).

The exporter computes every counter from the clock at scrape time (a straight line), so
Prometheus' increase()/rate() extrapolation is exact up to the scrape's few milliseconds, and
GPU occupancy is constant, so the 1 s subquery counts whole GPU-seconds.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.clients.prometheus import PrometheusClient
from activities.cost.cost_activities import CostActivities
from infra.prometheus import running_prometheus, serve_registry
from tests.servers import BIN
from workers.cli import cost as cost_cli
from workers.config import Settings
from workflows.cost.contract import CollectCostInput, CostQueries, MonthSpendInput
from workflows.cost.pricing import Prices
from workflows.cost.report import CostReport, CostReportInput, CostReportResult, cost_report_schedule
from workflows.core.naming import COST_REPORT_SCHEDULE_ID

NS = "llm-serving"


# --- against Prometheus -------------------------------------------------------------------------
# pod -> (node, GPUs held, version or None if it never served, generation tok/s, prompt tok/s)
PODS = {
    "chat-v1-a": ("node-a", 2, "1.0.0", 100.0, 300.0),
    "chat-v2-a": ("node-a", 1, "2.0.0", 80.0, 200.0),
    "chat-v1-b": ("node-b", 1, "1.0.0", 50.0, 150.0),
    "loader-x": ("node-b", 1, None, 0.0, 0.0),
}
NODES = {"node-a": ("gpu-on-demand", "on-demand", 4), "node-b": ("gpu-spot", "spot", 2), "node-c": ("gpu-shared", "on-demand", 1)}
# pods sharing node-c's one time-sliced GPU: dcgm-exporter --kubernetes-virtual-gpus copies its series to each
SHARED = {"embed-a": "e1", "rerank-a": "r1"}
WINDOW = 6  # seconds
PRICES = Prices(by_capacity_type={"on-demand": 36.0, "spot": 18.0})  # $0.01 and $0.005 per GPU-second


class Fleet:
    """DCGM, vLLM and kube-state-metrics series for the pods and nodes above."""

    def __init__(self) -> None:
        self.t0 = time.time() - 100  # counters well above zero: no extrapolation clamp at the window start

    def collect(self):
        elapsed = time.time() - self.t0
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU util", labels=["gpu", "UUID", "Hostname", "namespace", "pod"])
        free = {node: list(range(gpus)) for node, (_, _, gpus) in NODES.items()}
        for pod, (node, gpus, *_rest) in PODS.items():
            for _ in range(gpus):
                gpu = free[node].pop(0)
                util.add_metric([str(gpu), f"GPU-{node}-{gpu}", node, NS, pod], 50)
        gpu = free["node-c"].pop(0)
        for pod in SHARED:
            util.add_metric([str(gpu), f"GPU-node-c-{gpu}", "node-c", NS, pod], 80)
        for node, left in free.items():
            for gpu in left:
                util.add_metric([str(gpu), f"GPU-{node}-{gpu}", node, "", ""], 0)
        labels = ["namespace", "pod", "deployment", "version", "model_name", "node"]
        running = GaugeMetricFamily("vllm:num_requests_running", "running", labels=labels)
        generated = CounterMetricFamily("vllm:generation_tokens", "generated", labels=labels)
        prompt = CounterMetricFamily("vllm:prompt_tokens", "prompt", labels=labels)
        for pod, (node, _, version, gen_rate, prompt_rate) in PODS.items():
            if version is None:
                continue
            values = [NS, pod, "chat", version, "llama", node]
            running.add_metric(values, 3)
            generated.add_metric(values, gen_rate * elapsed)
            prompt.add_metric(values, prompt_rate * elapsed)
        for pod, version in SHARED.items():
            running.add_metric([NS, pod, pod.split("-")[0], version, pod.split("-")[0], "node-c"], 1)
        nodes = GaugeMetricFamily("kube_node_labels", "node labels",
                                  labels=["node", "label_karpenter_sh_nodepool", "label_karpenter_sh_capacity_type"])
        for node, (pool, capacity, _) in NODES.items():
            nodes.add_metric([node, pool, capacity], 1)
        yield from (util, running, generated, prompt, nodes)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    registry = CollectorRegistry()
    registry.register(Fleet())
    with serve_registry(registry) as target, running_prometheus(tmp_path_factory.mktemp("prom"), {"fleet": target}) as url:
        started = time.time()
        yield url, started


@pytest.fixture(scope="module")
def cost(prometheus) -> CostActivities:
    return CostActivities(PrometheusClient(prometheus[0]))


@pytest.fixture
def window_end(prometheus):
    """A whole second, WINDOW + 3 s after Prometheus started, so the whole window has samples."""
    _, started = prometheus
    time.sleep(max(0.0, started + WINDOW + 4 - time.time()))
    return datetime.fromtimestamp(math.floor(time.time()) - 1, tz=timezone.utc)


async def test_cost_report_workflow_against_prometheus(time_skipping_env, cost, window_end):
    env = time_skipping_env
    queue = f"cost-{uuid.uuid4()}"
    with ThreadPoolExecutor(4) as executor:
        async with Worker(env.client, task_queue=queue, workflows=[CostReport], activities=[cost.collect_cost_inputs],
                          activity_executor=executor):
            result = await env.client.execute_workflow(
                CostReport.run,
                CostReportInput(window_hours=WINDOW / 3600, end=window_end, step_seconds=1, prices=PRICES),
                id=f"cost-report/{uuid.uuid4()}",
                task_queue=queue,
            )
    table = result.table
    # Hand calculation over 6 s: node-a (on-demand, $0.01/GPU-s) holds 2 + 1 GPUs for chat,
    # node-b (spot, $0.005/GPU-s) 1 GPU for chat and 1 for the never-serving loader, node-c
    # (on-demand) one GPU time-sliced between embed and rerank: half of it each.
    pools = {(r.deployment, r.pool, r.capacity_type): (round(r.gpu_hours * 3600, 3), round(r.cost, 6)) for r in table.pools}
    assert pools == {
        ("chat", "gpu-on-demand", "on-demand"): (18.0, 0.18),
        ("chat", "gpu-spot", "spot"): (6.0, 0.03),
        ("(unattributed)", "gpu-spot", "spot"): (6.0, 0.03),
        ("embed", "gpu-shared", "on-demand"): (3.0, 0.03),
        ("rerank", "gpu-shared", "on-demand"): (3.0, 0.03),
    }
    versions = {v.version: v for v in table.versions}
    v1, v2 = versions["1.0.0"], versions["2.0.0"]
    assert v1.cost == pytest.approx(2 * 6 * 0.01 + 6 * 0.005)  # $0.15
    assert v2.cost == pytest.approx(6 * 0.01)  # $0.06
    assert v1.generation_tokens == pytest.approx((100 + 50) * 6, rel=0.01)  # 900
    assert v1.prompt_tokens == pytest.approx((300 + 150) * 6, rel=0.01)  # 2700
    assert v2.generation_tokens == pytest.approx(80 * 6, rel=0.01)  # 480
    assert v1.cost_per_million_tokens == pytest.approx(0.15 / 3600 * 1e6, rel=0.01)  # $41.67
    assert v2.cost_per_million_generated_tokens == pytest.approx(0.06 / 480 * 1e6, rel=0.01)  # $125
    assert v1.generated_tokens_per_gpu_second == pytest.approx(900 / 18, rel=0.01)  # 50 tok/s/GPU
    assert versions["e1"].cost == versions["r1"].cost == pytest.approx(3 * 0.01)  # a shared GPU is paid in full, once
    assert table.total_cost == pytest.approx(0.30)
    assert result.markdown.startswith("## Cost ") and "**Total: $0.30 for 0.01 GPU-hours**" in result.markdown


def test_month_spend_is_the_cost_reports_total_and_its_current_rate(cost, window_end):
    """What the monthly budget reads: the same pricing over the month so far, and the last window per hour."""
    req = MonthSpendInput(month_start=window_end - timedelta(seconds=WINDOW), end=window_end, prices=PRICES,
                          step_seconds=1, rate_window_seconds=3)
    spend = ActivityEnvironment().run(cost.read_month_spend, req)
    assert spend.spent_usd == pytest.approx(0.30)  # the report's total over the same 6 s
    assert spend.rate_usd_per_hour == pytest.approx((4 * 36.0 + 2 * 18.0))  # 3 + 1 shared on-demand + 2 spot GPUs held: $180/h


def test_bad_query_template_is_non_retryable(cost, window_end):
    req = CollectCostInput(end=window_end, window_seconds=WINDOW, step_seconds=1,
                           queries=CostQueries(pods="group by (pod) (vllm:num_requests_running[${windw}])"))
    with pytest.raises(ApplicationError) as err:
        ActivityEnvironment().run(cost.collect_cost_inputs, req)
    assert err.value.non_retryable and "windw" in str(err.value)
    req = CollectCostInput(end=window_end, window_seconds=WINDOW, step_seconds=1,
                           queries=CostQueries(pods="group by (pod) (vllm:num_requests_running)"))
    with pytest.raises(ApplicationError) as err:
        ActivityEnvironment().run(cost.collect_cost_inputs, req)
    assert err.value.non_retryable and "deployment" in str(err.value)  # the labels the query must return


async def test_daily_schedule_runs_the_report(cost, window_end):
    """The Schedule as `tideplane schedules` applies it: daily at 00:00 UTC; triggered now, it reports."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"), data_converter=pydantic_data_converter, ui=False
    )
    try:
        queue = f"cost-{uuid.uuid4()}"
        with ThreadPoolExecutor(4) as executor:
            async with Worker(env.client, task_queue=queue, workflows=[CostReport], activities=[cost.collect_cost_inputs],
                              activity_executor=executor):
                handle = await env.client.create_schedule(
                    COST_REPORT_SCHEDULE_ID, cost_report_schedule(CostReportInput(window_hours=1, step_seconds=1, prices=PRICES), queue)
                )
                desc = await handle.describe()
                calendar = desc.schedule.spec.calendars[0]
                assert [(r.start, r.end) for r in calendar.hour] == [(0, 0)]
                assert [(r.start, r.end) for r in calendar.minute] == [(0, 0)]
                await handle.trigger()
                for _ in range(100):
                    desc = await handle.describe()
                    if desc.info.recent_actions:
                        break
                    await asyncio.sleep(0.1)
                run = desc.info.recent_actions[-1].action
                result = await env.client.get_workflow_handle(
                    run.workflow_id, run_id=run.first_execution_run_id, result_type=CostReportResult
                ).result()
    finally:
        await env.shutdown()
    # The run ended at trigger time over the last hour: all of the exporter's GPUs, priced.
    pools = {(r.deployment, r.capacity_type) for r in result.table.pools}
    assert pools == {("chat", "on-demand"), ("chat", "spot"), ("(unattributed)", "spot"), ("embed", "on-demand"), ("rerank", "on-demand")}
    assert result.end - result.start == timedelta(hours=1)
    gpu_seconds = {r.deployment: r.gpu_hours * 3600 for r in result.table.pools if r.capacity_type == "spot"}
    assert gpu_seconds["chat"] == gpu_seconds["(unattributed)"] > WINDOW  # 1 GPU each, every second since the first scrape


async def test_cost_report_command_prints_the_markdown(cost, window_end, capsys):
    """`tideplane cost report` runs a report through a worker and prints its table; `--latest`
    prints the last completed one without running anything."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"), data_converter=pydantic_data_converter, ui=False
    )
    config = Settings(temporal_address=env.client.service_client.config.target_host, task_queue=f"cost-{uuid.uuid4()}")
    try:
        assert await asyncio.to_thread(cost_cli.main, ["cost", "report", "--latest"], config) == 1
        assert "no completed CostReport yet" in capsys.readouterr().err
        with ThreadPoolExecutor(4) as executor:
            async with Worker(env.client, task_queue=config.task_queue, workflows=[CostReport], activities=[cost.collect_cost_inputs],
                              activity_executor=executor):
                assert await asyncio.to_thread(cost_cli.main, ["cost", "report", "--window-hours", "1"], config) == 0
        printed = capsys.readouterr().out
        assert printed.startswith("## Cost ") and "**Total: $" in printed and "| llm-serving/chat 1.0.0 | llama |" in printed
        for _ in range(50):  # the list of completed runs lags a little behind
            assert await asyncio.to_thread(cost_cli.main, ["cost", "report", "--latest"], config) in (0, 1)
            captured = capsys.readouterr()
            if captured.out:
                break
            await asyncio.sleep(0.2)
        assert captured.out == printed
    finally:
        await env.shutdown()
