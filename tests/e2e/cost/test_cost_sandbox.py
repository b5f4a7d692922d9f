"""CostReport end to end on the sandbox, checked against a hand calculation.

Two logical deployments with known replicas x GPUs are pinned to known capacity types (the fleet
exports kube_node_labels with the Karpenter pool and capacity-type labels), demand is offered,
and after a known window the CostReport workflow (real activity, real Prometheus) must report
GPU-hours and cost = replicas x GPUs x seconds / 3600 x price per pool, and tokens matching the
fleet simulator's own counters read directly from each pod's /metrics at the window's edges.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.clients.prometheus import PrometheusClient
from activities.cost.cost_activities import CostActivities
from infra.sandbox.config import Demand, Profile
from infra.sandbox.knobs import set_demand, set_profile
from tests.sandbox_fixtures import create_logical_deployment, wait_until
from workflows.cost.pricing import Prices
from workflows.cost.report import CostReport, CostReportInput, CostReportResult
from workflows.core.naming import NODE_CAPACITY_TYPE

MODEL, VERSION = "cost-model", "1.0.0"
OUTPUT_TOKENS, PROMPT_TOKENS = 100, 300  # unequal, so swapped counters would show
# (namespace, name, capacity type, pool, replicas, GPUs per replica, rps)
DEPLOYMENTS = [
    ("e2e-cost-spot", "cost-spot", "spot", "gpu-spot", 2, 2, 3.0),
    ("e2e-cost-od", "cost-od", "on-demand", "gpu-on-demand", 1, 3, 2.0),
]
PRICES = Prices(by_pool={"gpu-on-demand": 11.0}, by_capacity_type={"on-demand": 10.0, "spot": 4.0})
PRICE = {"gpu-spot": 4.0, "gpu-on-demand": 11.0}  # by hand: the pool's own price wins over its capacity type's
WINDOW = 24  # seconds, a multiple of STEP
STEP = 1  # = the sandbox Prometheus' scrape interval
# Token counters move once per fleet tick (0.5 s) and Prometheus samples them once a second;
# increase() extrapolates from the first and last sample inside the window, the direct reads land
# within a tick of the edges: each side may be off by about one scrape interval of tokens. Allow
# 3 s of tokens (12.5 % of the window), which still catches swapped, doubled or mis-windowed counts.
TOKEN_SLACK_SECONDS = 3.0


def fleet_tokens(fleet_url: str, core: client.CoreV1Api) -> dict[str, dict[str, float]]:
    """The fleet's own counters per namespace (one deployment version each), summed over each pod's
    own /metrics (vLLM's labels only: the namespace is the pod's)."""
    totals: dict[str, dict[str, float]] = {}
    for ns, *_ in DEPLOYMENTS:
        counts = totals.setdefault(ns, {"generation": 0.0, "prompt": 0.0})
        for pod in core.list_namespaced_pod(ns).items:
            answer = httpx.get(f"{fleet_url}/pods/{ns}/{pod.metadata.name}/metrics", timeout=5)
            if answer.status_code == 503:
                continue  # no replica (not Ready)
            for family in text_string_to_metric_families(answer.text):
                for sample in family.samples:
                    if sample.name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"):
                        counts["generation" if sample.name.startswith("vllm:generation") else "prompt"] += sample.value
    return totals


def prom_value(prom_url: str, promql: str) -> float:
    result = httpx.get(f"{prom_url}/api/v1/query", params={"query": promql}, timeout=5).json()["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


async def test_cost_report_matches_hand_calculation(sandbox_env):
    urls = sandbox_env.urls
    api = config.new_client_from_config(config_file=str(sandbox_env.kubeconfig))
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    set_profile(api, MODEL, None, Profile(load_seconds=1, error_rate=0, output_tokens=OUTPUT_TOKENS,
                                          prompt_tokens=PROMPT_TOKENS, capacity_rps=4))
    for ns, name, capacity, _, replicas, gpus, rps in DEPLOYMENTS:
        versioned = create_logical_deployment(api, ns, name, VERSION, MODEL, replicas=0, gpus=gpus)
        apps.patch_namespaced_deployment(versioned, ns, {"spec": {
            "replicas": replicas, "template": {"spec": {"nodeSelector": {NODE_CAPACITY_TYPE: capacity}}}}})
        set_demand(api, f"{ns}/{name}", Demand(rps=rps))

    def steady() -> bool:
        """Every pod's GPUs and token counters are in Prometheus, and tokens are flowing."""
        for ns, _, _, _, replicas, gpus, _ in DEPLOYMENTS:
            if prom_value(urls["prometheus"], f'count(DCGM_FI_DEV_GPU_UTIL{{namespace="{ns}",pod!=""}})') != replicas * gpus:
                return False
            if prom_value(urls["prometheus"], f'count(vllm:generation_tokens_total{{namespace="{ns}"}})') != replicas:
                return False
            if prom_value(urls["prometheus"], f'sum(rate(vllm:generation_tokens_total{{namespace="{ns}"}}[3s]))') <= 0:
                return False
        return True

    wait_until(steady, 25, "replicas holding their GPUs and serving, as Prometheus sees them", interval=0.5)

    start = time.time()
    before = fleet_tokens(urls["fleet"], core)
    await asyncio.sleep(max(0.0, start + WINDOW - time.time()))
    end = time.time()
    after = fleet_tokens(urls["fleet"], core)
    await asyncio.sleep(2.5)  # the scrape at or just before `end` is in Prometheus

    temporal = await Client.connect(sandbox_env.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    queue = f"cost-e2e-{uuid.uuid4().hex[:6]}"
    cost = CostActivities(PrometheusClient(urls["prometheus"]))
    with ThreadPoolExecutor(2) as executor:
        async with Worker(temporal, task_queue=queue, workflows=[CostReport], activities=[cost.collect_cost_inputs],
                          activity_executor=executor):
            result: CostReportResult = await temporal.execute_workflow(
                CostReport.run,
                CostReportInput(window_hours=WINDOW / 3600, end=datetime.fromtimestamp(end, UTC),
                                step_seconds=STEP, prices=PRICES),
                id=f"cost-report/{queue}", task_queue=queue,
            )

    assert (result.end - result.start).total_seconds() == WINDOW
    table = result.table
    for ns, name, capacity, pool, replicas, gpus, _ in DEPLOYMENTS:
        gpu_hours = replicas * gpus * WINDOW / 3600
        cost = gpu_hours * PRICE[pool]
        [row] = [r for r in table.pools if r.namespace == ns]
        assert (row.deployment, row.pool, row.capacity_type) == (name, pool, capacity)
        # GPUs were held over the whole window, so the occupancy integral is exact.
        assert abs(row.gpu_hours - gpu_hours) < 1e-9, (row, gpu_hours)
        assert row.price_per_gpu_hour == PRICE[pool]
        assert abs(row.cost - cost) < 1e-9

        [version] = [v for v in table.versions if v.namespace == ns]
        assert (version.deployment, version.version, version.model) == (name, VERSION, MODEL)
        assert abs(version.gpu_hours - gpu_hours) < 1e-9 and abs(version.cost - cost) < 1e-9
        generated = after[ns]["generation"] - before[ns]["generation"]
        prompt = after[ns]["prompt"] - before[ns]["prompt"]
        assert generated > 0 and prompt == generated * PROMPT_TOKENS / OUTPUT_TOKENS  # every request: 300 in, 100 out
        slack = TOKEN_SLACK_SECONDS / WINDOW
        assert abs(version.generation_tokens - generated) <= slack * generated, (version, generated)
        assert abs(version.prompt_tokens - prompt) <= slack * prompt, (version, prompt)
        per_million = cost / (generated + prompt) * 1e6
        assert abs(version.cost_per_million_tokens - per_million) <= slack * per_million * 1.2
        assert version.cost_per_million_generated_tokens == version.cost / version.generation_tokens * 1e6
    assert table.total_gpu_hours >= sum(r * g for _, _, _, _, r, g, _ in DEPLOYMENTS) * WINDOW / 3600 - 1e-9
    assert "cost-spot" in result.markdown and "gpu-spot" in result.markdown
