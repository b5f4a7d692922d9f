"""Alert and recording rules, and Grafana dashboards, checked by the real Prometheus.

One Prometheus scrapes (1) an exporter of vLLM / DCGM / kube-state-metrics series for
llm-serving/chat whose numbers we control (version 2.0.0 is the bad canary: 60 requests
waiting, 3 s TTFT, 200 ms TPOT, and its node's GPU is hot and full), (2) tideplane series whose
numbers we also choose (a 7-minute cold start, a scale-up given up, a paused rollout: figures a
short sandbox run cannot produce), recorded with the product's own functions of
workflows/core/telemetry.py into the product's exporter (workers.telemetry.metrics_runtime), so names,
labels and bucket bounds are exactly the worker's, and (3) a target where nothing listens.
These are the rules' inputs; that the product emits every one of these metrics is shown by
``test_every_declared_metric_moves_after_real_runs`` below. Every alert's ``for:`` is dropped in a rendered copy of alerts.yml (the
expressions are the shipped ones, unchanged) so the test sees them fire in seconds, not minutes.
Prometheus 2.42 has no parse endpoint: a dashboard query parses when /api/v1/query does not
answer ``bad_data``.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import uuid

import httpx
import pytest
import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from temporalio.client import Client

from infra.grafana import DASHBOARDS
from infra.prometheus import RULE_FILES, running_prometheus, serve_registry
from infra.sandbox.config import Demand
from infra.sandbox.knobs import set_demand
from infra.sandbox.ports import free_port
from infra.sandbox.spot import spot_interrupt_running
from tests.e2e.rollout.test_rollout import (
    BAD,
    BAD_PROFILE,
    GOOD,
    GOOD_PROFILE,
    NAME,
    STABLE,
    clean_up,
    prepare,
    report,
    rollout_input,
    stable_ready,
)
from tests.e2e.worker_process import WorkerProcess
from tests.sandbox_fixtures import TEST_TIME_SCALE, create_logical_deployment, wait_until
from workers.telemetry import metrics_runtime
from workflows.core.engine_metrics import metric_names
from workflows.core import telemetry
from workflows.core.naming import NODE_CAPACITY_TYPE, rollout_workflow_id, scaling_workflow_id
from workflows.rollout.client import rollout_result

NS, DEP = "alerts-test", "chat"  # a namespace no other test records in the shared registry

# DESIGN.md "Metric names" (vLLM, HTTP server, DCGM) + kube-state-metrics' node labels (cost).
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds", "vllm:request_time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
}
DESIGN_METRICS = {
    "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total", "http_requests_total",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
} | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
EXTERNAL = {"up", "kube_node_labels"}
# Envoy AI Gateway's token counter (a histogram; its _sum counts tokens), which token metering reads.
GATEWAY_METRICS = {f"gen_ai_client_token_usage{suffix}" for suffix in ("_bucket", "_sum", "_count")}
ALERTS = {
    "GPUUtilisationHigh", "GPUMemoryHigh", "RequestsWaitingHigh", "TTFTP99High", "TPOTP99High", "ScaleUpSuccessLow",
    "ColdStartSlow", "RolloutPaused", "RolloutFailed", "MetricSourceDown", "MetricQueryErrors", "GPUBudgetExceeded",
    "TokenQuotaNearlySpent",
}


def telemetry_metrics() -> set[str]:
    """The series names of every declared tideplane metric, as the exporter writes them."""
    suffixes = {"counter": ("",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {f"{m.name}{s}" for m in telemetry.METRICS for s in suffixes[m.kind]}


def recording_rules() -> set[str]:
    groups = yaml.safe_load(RULE_FILES[0].read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"]}


KNOWN = DESIGN_METRICS | EXTERNAL | GATEWAY_METRICS | telemetry_metrics() | recording_rules()

# --- rules ---------------------------------------------------------------------------------------
def test_promtool_check_rules_passes():
    check = subprocess.run(["/usr/bin/promtool", "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("SUCCESS") == 2


def test_rules_refer_only_to_known_metrics():
    exprs = [rule["expr"] for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]
    assert len(exprs) >= 25
    for expr in exprs:
        names = metric_names(expr)
        assert names and names <= KNOWN, f"unknown metric {names - KNOWN} in {expr}"
    alerts = {rule["alert"] for group in yaml.safe_load(RULE_FILES[1].read_text())["groups"] for rule in group["rules"]}
    assert alerts == ALERTS


# --- the stack: exporter + tideplane metrics + Prometheus with the rules -------------------------
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# version -> (pod, node, waiting, ttft, tpot, queue, prefill, decode)
VERSIONS = {
    "1.0.0": ("chat-v1-a", "node-a", 2, 0.1, 0.02, 0.01, 0.1, 4.0),
    "2.0.0": ("chat-v2-a", "node-b", 60, 3.0, 0.2, 2.0, 1.0, 40.0),
}
RPS = 5.0


class Fleet:
    def __init__(self) -> None:
        self.t0 = time.time() - 60

    def collect(self):
        n = (time.time() - self.t0) * RPS
        labels = ["namespace", "pod", "deployment", "version", "model_name", "node"]
        fams = {
            "waiting": GaugeMetricFamily("vllm:num_requests_waiting", "", labels=labels),
            "running": GaugeMetricFamily("vllm:num_requests_running", "", labels=labels),
            "kv": GaugeMetricFamily("vllm:kv_cache_usage_perc", "", labels=labels),
            "gen": CounterMetricFamily("vllm:generation_tokens", "", labels=labels),
            "prompt": CounterMetricFamily("vllm:prompt_tokens", "", labels=labels),
            "ok": CounterMetricFamily("vllm:request_success", "", labels=labels),
            "http": CounterMetricFamily("http_requests", "", labels=[*labels, "status"]),
        }
        hists = {name: HistogramMetricFamily(name, "", labels=labels) for name in sorted(HISTOGRAMS - {"vllm:inter_token_latency_seconds"})}
        for version, (pod, node, waiting, ttft, tpot, queue, prefill, decode) in VERSIONS.items():
            values = [NS, pod, DEP, version, "llama", node]
            fams["waiting"].add_metric(values, waiting)
            fams["running"].add_metric(values, 8)
            fams["kv"].add_metric(values, 0.5)
            fams["gen"].add_metric(values, n * 200)
            fams["prompt"].add_metric(values, n * 500)
            fams["ok"].add_metric(values, n)
            fams["http"].add_metric([*values, "200"], n)
            fams["http"].add_metric([*values, "500"], n * 0.01)
            observed = {
                "vllm:time_to_first_token_seconds": ttft, "vllm:request_time_per_output_token_seconds": tpot,
                "vllm:request_queue_time_seconds": queue, "vllm:request_prefill_time_seconds": prefill,
                "vllm:request_decode_time_seconds": decode, "vllm:e2e_request_latency_seconds": queue + prefill + decode,
            }
            for name, seconds in observed.items():
                buckets = [(str(le), n if seconds <= le else 0.0) for le in BUCKETS] + [("+Inf", n)]
                hists[name].add_metric(values, buckets, sum_value=n * seconds)
        yield from fams.values()
        yield from hists.values()
        dcgm = ["gpu", "UUID", "Hostname", "namespace", "pod"]
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "", labels=dcgm)
        used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "", labels=dcgm)
        free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "", labels=dcgm)
        for gpu, holder, u, mib in (("0", "chat-v1-a", 40, 40000), ("1", "chat-v2-a", 95, 78000), ("2", "", 0, 0)):
            node = "node-a" if gpu == "0" else "node-b"
            lv = [gpu, f"GPU-{gpu}", node, NS if holder else "", holder]
            util.add_metric(lv, u)
            used.add_metric(lv, mib)
            free.add_metric(lv, 81559 - mib)
        nodes = GaugeMetricFamily("kube_node_labels", "", labels=["node", "label_karpenter_sh_nodepool", "label_karpenter_sh_capacity_type"])
        nodes.add_metric(["node-a", "gpu-on-demand", "on-demand"], 1)
        nodes.add_metric(["node-b", "gpu-spot", "spot"], 1)
        yield from (util, used, free, nodes)
        tokens = HistogramMetricFamily("gen_ai_client_token_usage", "", labels=[
            "namespace", "route", "tenant", "gen_ai_request_model", "version", "request_class", "gen_ai_token_type"])
        for tenant, kind, per_request in (("acme", "input", 500), ("acme", "output", 200), ("beta", "input", 50)):
            tokens.add_metric([NS, DEP, tenant, "llama", "1.0.0", "realtime", kind], [("+Inf", n)], sum_value=n * per_request)
        yield tokens


def record_before_first_scrape(meter) -> None:
    """A rollout of 2.0.0 is at 5 %, embed's is paused, chat scales up on spot."""
    for pool, capacity, desired, ready in (("gpu-on-demand", "on-demand", 2, 2), ("gpu-spot", "spot", 3, 1)):
        telemetry.replicas(meter, NS, DEP, pool, capacity, desired, ready)
    telemetry.route_weights(meter, NS, DEP, {"1.0.0": 95, "2.0.0": 5})
    telemetry.scale_up_started(meter, NS, DEP, "gpu-spot")
    telemetry.rollout_paused(meter, NS, "embed", True)
    telemetry.spot_failover(meter, "gpu-spot", "drained", 42)
    telemetry.retention_action(meter, "llama", "deleted")
    telemetry.gate_verdict(meter, NS, DEP, "2.0.0", "pass")
    telemetry.tenant_tokens(meter, NS, DEP, "acme", 900, 1000)  # 90 % of its monthly quota
    telemetry.tenant_tokens(meter, NS, DEP, "beta", 100, 1000)


def record_after_first_scrape(meter) -> None:
    """2.0.0 fails its TTFT gate and is rolled back; one 7-minute cold start, one scale-up given up."""
    telemetry.gate_verdict(meter, NS, DEP, "2.0.0", "fail", failing_gate="ttft_p99")
    telemetry.rollout_finished(meter, NS, DEP, "rolled_back", "canary-5", rollback_seconds=3.5)
    telemetry.scaling_decision(meter, NS, DEP, "up", "queue_depth")
    telemetry.scale_up_finished(meter, NS, DEP, "gpu-spot", ready=True, seconds=420)
    telemetry.scale_up_finished(meter, NS, DEP, "gpu-spot", ready=False, seconds=900)
    telemetry.metric_query_error(meter, "prometheus", "unreachable")
    telemetry.budget_refusal(meter, NS, DEP, "batch", "refused")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("observability")
    groups = yaml.safe_load(RULE_FILES[1].read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)
    (work / "alerts-now.yml").write_text(yaml.safe_dump(groups))
    fleet = CollectorRegistry()
    fleet.register(Fleet())
    worker_port = free_port()
    # The labels a workflow's meter adds to every series (namespace is Temporal's, not Kubernetes').
    runtime = metrics_runtime(worker_port, host="127.0.0.1")  # held: the exporter lives as long as it
    meter = runtime.metric_meter.with_additional_attributes(
        {"namespace": "default", "task_queue": "tideplane", "workflow_type": "ModelRollout"}
    )
    record_before_first_scrape(meter)
    with serve_registry(fleet) as fleet_target:
        targets = {"fleet": fleet_target, "tideplane-worker": f"127.0.0.1:{worker_port}", "gone": f"127.0.0.1:{free_port()}"}
        with running_prometheus(work, targets, rule_files=[RULE_FILES[0], work / "alerts-now.yml"]) as url:
            time.sleep(1.5)  # a second scrape: series started at 0 are seen at 0 before they move
            record_after_first_scrape(meter)
            yield url


def test_alerts_fire_when_their_conditions_hold(prometheus):
    deadline = time.monotonic() + 40
    while True:
        alerts = httpx.get(f"{prometheus}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        firing = {a["labels"]["alertname"]: a["labels"] for a in alerts if a["state"] == "firing"}
        if set(firing) >= ALERTS or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(firing) == ALERTS, f"not firing: {ALERTS - set(firing)}"
    assert firing["RequestsWaitingHigh"]["version"] == "2.0.0"
    assert firing["TTFTP99High"]["version"] == "2.0.0" and firing["TPOTP99High"]["version"] == "2.0.0"
    assert firing["GPUUtilisationHigh"]["Hostname"] == firing["GPUMemoryHigh"]["Hostname"] == "node-b"
    assert firing["RolloutFailed"]["outcome"] == "rolled_back" and firing["RolloutFailed"]["stage"] == "canary-5"
    assert firing["RolloutPaused"]["deployment"] == "embed"
    assert firing["MetricSourceDown"]["job"] == "gone"
    assert (firing["ColdStartSlow"]["pool"], firing["ScaleUpSuccessLow"]["deployment"]) == ("gpu-spot", DEP)
    assert (firing["GPUBudgetExceeded"]["deployment"], firing["GPUBudgetExceeded"]["outcome"]) == (DEP, "refused")
    assert [a["labels"]["tenant"] for a in alerts if a["labels"]["alertname"] == "TokenQuotaNearlySpent"] == ["acme"]
    # Only the bad canary's latency alerts fire: the stable version's are under the thresholds.
    latency = [a for a in alerts if a["labels"]["alertname"] in ("TTFTP99High", "TPOTP99High", "RequestsWaitingHigh")]
    assert {a["labels"]["version"] for a in latency} == {"2.0.0"}


# --- dashboards ----------------------------------------------------------------------------------
def dashboard_queries(board: dict) -> list[tuple[str, str]]:
    """(where, expr) for every panel target, annotation and query variable, nested rows included."""
    out = []
    panels = list(board["panels"])
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r}", target["expr"]))
    for ann in board["annotations"]["list"]:
        if "expr" in ann:
            out.append((f"annotation {ann['name']!r}", ann["expr"]))
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["query"]["query"])
            assert match, var
            out.append((f"variable {var['name']!r}", f"group({match.group(1)})"))
    return out


def render(board: dict, expr: str) -> str:
    """Grafana's interpolation as a test can do it: every selection 'All', textboxes at their default."""
    values = {"__rate_interval": "1m", "__interval": "1s", "__interval_ms": "1000", "__range": "1h"}
    for var in board["templating"]["list"]:
        values[var["name"]] = var["query"] if var["type"] == "textbox" else ".*"
    return re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), expr)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_loads_and_every_query_parses_and_returns_data(prometheus, name):
    board = json.loads(DASHBOARDS[name].read_text())
    assert board["uid"] == f"tideplane-{name}" and board["templating"]["list"][0]["type"] == "datasource"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    queries = dashboard_queries(board)
    assert len(queries) >= 6
    empty = []
    for where, expr in queries:
        promql = render(board, expr)
        names = metric_names(promql)
        assert names and names <= KNOWN, f"{name} {where}: unknown metric {names - KNOWN} in {promql}"
        body = query(prometheus, promql)
        assert body["status"] == "success", f"{name} {where}: {body.get('errorType')}: {body.get('error')}\n{expr}"
        if not body["data"]["result"] and not where.startswith("annotation"):
            empty.append((where, expr))
    # Every panel has data from the fed fleet (joins on node and pod labels hold); rates and
    # recording rules need a few scrapes, so wait for them a little.
    deadline = time.monotonic() + 20
    while empty and time.monotonic() < deadline:
        time.sleep(0.25)
        empty = [(where, expr) for where, expr in empty if not query(prometheus, render(board, expr))["data"]["result"]]
    assert not empty, f"{name}: no data for {[where for where, _ in empty]}"


def query(url: str, promql: str) -> dict:
    return httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()


# --- the product: every declared metric moves after real runs -------------------------------------
# One ``tideplane worker`` process, on the sandbox's worker metrics port that the sandbox's
# Prometheus scrapes every second, runs short versions of the e2e scenarios (tests/e2e/rollout/test_rollout,
# test_scaling, test_spot, test_retention): a rollout promoted (paused and resumed on the way) and
# one rolled back by its error gate, a scale-up under queueing load, a loop whose signal query
# Prometheus rejects, a registry retention run, then a spot node reclaimed.
OBS_GOOD, OBS_BAD, OBS_SCALING, OBS_BLIND = "obs-rollout-good", "obs-rollout-bad", "obs-scaling", "obs-blind"
OBS_BUDGET = "obs-budget"  # a loop whose scale-up the monthly budget refuses
OBS_MODEL = "obs-llm"
SCALING_POLICY = {
    "min_replicas": 1, "max_replicas": 3, "queue_per_replica": 2, "queue_capacity_per_replica": 4,
    "ttft_p99_slo_seconds": 30, "gpu_util_sustain_seconds": 0, "stabilisation_seconds": 3, "cooldown_seconds": 5,
    "replica_capacity_rps": 4 * TEST_TIME_SCALE,  # 4 req/s of sandbox time; Prometheus' rate() counts real seconds
}
SPOT_POLICY = {
    "on_demand_pool_asg": "gpu-on-demand", "poll_seconds": 0.5, "drain_margin_seconds": 2,
    "restore_timeout_seconds": 60, "stabilisation_seconds": 3, "max_stabilisation_seconds": 12,
}


class SandboxPrometheus:
    """Instant queries to the sandbox's Prometheus, restricted to one worker's task queue."""

    def __init__(self, url: str, task_queue: str) -> None:
        self.url, self.task_queue = url, task_queue

    def value(self, promql: str) -> float | None:
        """The single value of ``promql`` (``$q`` stands for this worker's task-queue matcher)."""
        result = query(self.url, promql.replace("$q", f'task_queue="{self.task_queue}"'))["data"]["result"]
        return sum(float(r["value"][1]) for r in result) if result else None

    async def until(self, promql: str, holds, what: str, timeout: float = 90) -> float:
        deadline = time.monotonic() + timeout
        while True:
            got = await asyncio.to_thread(self.value, promql)
            if got is not None and holds(got):
                return got
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {promql} = {got}"
            await asyncio.sleep(0.25)  # Prometheus scrapes every second: see a new sample soon after


def namespaces(kube) -> set[str]:
    return {ns.metadata.name for ns in client.CoreV1Api(kube).list_namespace().items}


def spot_node(kube) -> str | None:
    nodes = client.CoreV1Api(kube).list_node(label_selector=f"{NODE_CAPACITY_TYPE}=spot").items
    return next((n.metadata.name for n in nodes if not n.spec.unschedulable), None)


async def test_every_declared_metric_moves_after_real_runs(sandbox, kube, registry, tmp_path, request):
    queue = f"observability-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess({**sandbox.env, "TIDEPLANE_TASK_QUEUE": queue}, tmp_path / "worker.log")
    prom = SandboxPrometheus(sandbox.urls["prometheus"], queue)
    temporal = await Client.connect(sandbox.urls["temporal"], data_converter=sandbox.data_converter)  # the worker process encrypts
    checked: dict[str, float] = {}

    async def check(metric: telemetry.Metric, promql: str, holds, what: str) -> None:
        checked[metric.name] = await prom.until(promql, holds, what)

    prepare(kube, registry, tmp_path, OBS_GOOD, OBS_MODEL, {GOOD: GOOD_PROFILE})
    prepare(kube, registry, tmp_path, OBS_BAD, OBS_MODEL, {BAD: BAD_PROFILE})
    create_logical_deployment(kube, OBS_SCALING, NAME, STABLE, "llama-3-8b", replicas=1)
    create_logical_deployment(kube, OBS_BLIND, NAME, STABLE, "llama-3-8b", replicas=1, gpus=0)
    create_logical_deployment(kube, OBS_BUDGET, NAME, STABLE, "llama-3-8b", replicas=1, gpus=0)
    worker.start()
    try:
        wait_until(lambda: stable_ready(kube, OBS_GOOD) and stable_ready(kube, OBS_BAD), 30, "the stable versions")
        handles = {}
        for ns, version in ((OBS_GOOD, GOOD), (OBS_BAD, BAD)):
            inp = rollout_input(f"{ns}/{NAME}", OBS_MODEL, version)
            inp["steps"] = inp["steps"][:1]  # 5 % then promote: one gate window is enough here
            handles[ns] = await temporal.start_workflow(
                "ModelRollout", inp, id=rollout_workflow_id(inp["deployment"]), task_queue=queue
            )
        set_demand(kube, f"{OBS_SCALING}/{NAME}", Demand(rps=12))  # one replica serves 4 rps: the rest queues
        set_demand(kube, f"{OBS_BUDGET}/{NAME}", Demand(rps=12))
        loops = [
            await temporal.start_workflow(
                "ReactiveScaling",
                {"deployment": f"{ns}/{NAME}", "policy": {**SCALING_POLICY, **extra}, "interval_seconds": 1, "window": "5s",
                 "queries": queries},
                id=scaling_workflow_id(f"{ns}/{NAME}"), task_queue=queue,
            )
            for ns, queries, extra in ((OBS_SCALING, {}, {}), (OBS_BLIND, {"queue_waiting": "sum(vllm:num_requests_waiting"}, {}),
                                       (OBS_BUDGET, {}, {"monthly_budget": {"monthly_usd": 1}}))
        ]

        # Paused by an operator at 5 %, then resumed.
        good = f'kube_namespace="{OBS_GOOD}",deployment="{NAME}",$q'
        await prom.until(f"tideplane_rollout_weight{{{good},version=\"{GOOD}\"}}", lambda v: v == 5, "the good canary at 5 %")
        await handles[OBS_GOOD].signal("pause", {"reason": "observability test"})
        await check(telemetry.ROLLOUT_PAUSED, f"tideplane_rollout_paused{{{good}}}", lambda v: v == 1, "paused")
        await handles[OBS_GOOD].signal("resume", {})
        results = await asyncio.wait_for(asyncio.gather(*(rollout_result(h) for h in handles.values())), 120)
        assert [r.outcome.value for r in results] == ["promoted", "rolled_back"], results

        bad = f'kube_namespace="{OBS_BAD}",deployment="{NAME}",$q'
        await check(telemetry.ROLLOUTS, f'tideplane_rollouts_total{{{good},outcome="promoted",stage="promoted"}}', lambda v: v == 1, "promoted")
        assert prom.value(f'tideplane_rollouts_total{{{bad},outcome="rolled_back",stage="canary-5"}}') == 1
        assert prom.value(f"tideplane_rollout_paused{{{good}}}") == 0
        await check(telemetry.GATE_VERDICTS, f'tideplane_gate_verdicts_total{{{bad},version="{BAD}",verdict="fail",gate="error_rate"}}', lambda v: v == 1, "the failing verdict")
        assert prom.value(f'tideplane_gate_verdicts_total{{{good},version="{GOOD}",verdict="pass",gate="none"}}') >= 1
        await check(telemetry.ROLLBACK_SECONDS, f"tideplane_rollback_seconds_sum{{{bad}}}", lambda v: v == pytest.approx(results[1].route_reverted_seconds), "the rollback time")
        assert prom.value(f"tideplane_rollback_seconds_count{{{bad}}}") == 1
        await check(telemetry.ROLLOUT_WEIGHT, f'tideplane_rollout_weight{{{good},version="{GOOD}"}}', lambda v: v == 100, "the good version at 100 %")
        assert prom.value(f'tideplane_rollout_weight{{{bad},version="{BAD}"}}') == 0

        # The scale-up: decided on queueing, replicas wanted then Ready, its cold start observed.
        scaling = f'kube_namespace="{OBS_SCALING}",deployment="{NAME}",$q'
        await check(telemetry.SCALING_DECISIONS, f'tideplane_scaling_decisions_total{{{scaling},direction="up"}}', lambda v: v >= 1, "a scale-up decision")
        await check(telemetry.REPLICAS_DESIRED, f"max_over_time(tideplane_replicas_desired{{{scaling}}}[10m])", lambda v: v == 3, "3 replicas desired")
        await check(telemetry.REPLICAS_READY, f"tideplane_replicas_ready{{{scaling}}}", lambda v: v == 3, "3 replicas Ready")
        await check(telemetry.SCALE_UP_ATTEMPTS, f"tideplane_scale_up_attempts_total{{{scaling}}}", lambda v: v >= 1, "a finished scale-up")
        await check(telemetry.SCALE_UP_SUCCESSES, f"tideplane_scale_up_successes_total{{{scaling}}}", lambda v: v >= 1, "a successful scale-up")
        await check(telemetry.COLD_START_SECONDS, f"tideplane_cold_start_seconds_count{{{scaling}}}", lambda v: v >= 1, "a cold start")
        assert prom.value(f"tideplane_cold_start_seconds_sum{{{scaling}}}") > 0
        budget = f'kube_namespace="{OBS_BUDGET}",deployment="{NAME}",pool="realtime",outcome="refused",$q'
        await check(telemetry.BUDGET_REFUSALS, f"tideplane_budget_refusals_total{{{budget}}}", lambda v: v >= 1, "a refused scale-up")
        await check(telemetry.METRIC_QUERY_ERRORS, 'tideplane_metric_query_errors_total{source="prometheus",reason="bad_query",$q}', lambda v: v >= 1, "the rejected query")
        # Token quotas checked once against the month's metered tokens (none here: no tenant called).
        applied = await temporal.execute_workflow(
            "ApplyTokenQuotas", {"quotas": {"namespace": OBS_SCALING, "route": NAME,
                                            "tenants": [{"name": "obs-tenant", "tokens_per_minute": 100, "monthly_tokens": 5000}]}},
            id=f"token-quotas-{queue}", task_queue=queue)
        assert applied["outcome"] == "created"
        tenant = f'kube_namespace="{OBS_SCALING}",route="{NAME}",tenant="obs-tenant",$q'
        await check(telemetry.TENANT_MONTHLY_QUOTA, f"tideplane_tenant_monthly_token_quota{{{tenant}}}", lambda v: v == 5000, "the quota")
        await check(telemetry.TENANT_MONTH_TOKENS, f"tideplane_tenant_month_tokens{{{tenant}}}", lambda v: v == 0, "its tokens")
        for loop in loops:
            await loop.terminate()
        for ns in (OBS_GOOD, OBS_BAD, OBS_SCALING, OBS_BLIND, OBS_BUDGET):
            clean_up(kube, ns)
        wait_until(lambda: not namespaces(kube) & {OBS_GOOD, OBS_BAD, OBS_SCALING, OBS_BLIND, OBS_BUDGET}, 30, "the namespaces gone")

        # Retention: the rolled-back version was deprecated by its rollout and no Deployment uses
        # it any more: its weights go now.
        await temporal.execute_workflow(
            "RegistryRetention", {"models": [OBS_MODEL], "deprecated_days": 0}, id=f"retention-{queue}", task_queue=queue
        )
        retention = f'model="{OBS_MODEL}",$q'
        await check(telemetry.RETENTION_ACTIONS, f'tideplane_registry_retention_actions_total{{{retention},action="deleted"}}', lambda v: v == 1, "the deleted weights")
        assert prom.value(f'tideplane_registry_retention_actions_total{{{retention},action="kept"}}') >= 1

        # A spot node reclaimed (nothing of this test left on it: the namespaces are gone).
        node = wait_until(lambda: spot_node(kube), 60, "a schedulable spot node")
        watcher = await temporal.start_workflow(
            "SpotInterruptionWatcher", {"policy": SPOT_POLICY, "wait_seconds": 1, "idle_seconds": 0},
            id=f"spot-watcher-{queue}", task_queue=queue,
        )
        interruption = await asyncio.to_thread(spot_interrupt_running, sandbox.state_dir, node)
        assert interruption.terminated
        spot = 'pool="gpu-spot",$q'
        await check(telemetry.SPOT_FAILOVERS, f"tideplane_spot_failovers_total{{{spot}}}", lambda v: v == 1, "the reclaim")
        await check(telemetry.CAPACITY_GAP_SECONDS, f"tideplane_capacity_gap_seconds_count{{{spot}}}", lambda v: v == 1, "its capacity gap")
        await watcher.signal("stop")
    finally:
        worker.stop()
        for ns in (OBS_GOOD, OBS_BAD, OBS_SCALING, OBS_BLIND, OBS_BUDGET):
            clean_up(kube, ns)
    report(request, "metrics read from the sandbox's Prometheus after real runs: " + ", ".join(f"{k}={v:g}" for k, v in sorted(checked.items())))
    assert set(checked) == {m.name for m in telemetry.METRICS}, "a declared metric no real run was checked for"
