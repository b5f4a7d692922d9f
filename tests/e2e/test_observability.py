"""Alert and recording rules, and Grafana dashboards, checked by the real Prometheus.

One Prometheus scrapes (1) an exporter of vLLM / DCGM / kube-state-metrics series for
llm-serving/chat whose numbers we control (version 2.0.0 is the bad canary: 60 requests
waiting, 3 s TTFT, 200 ms TPOT, and its node's GPU is hot and full), (2) tideplane series whose
numbers we also choose (a 7-minute cold start, a scale-up given up, a paused rollout: figures a
short sandbox run cannot produce), recorded with the product's own functions of
workflows/telemetry.py into the product's exporter (workers.telemetry.metrics_runtime), so names,
labels and bucket bounds are exactly the worker's, and (3) a target where nothing listens.
These are the rules' inputs; that the product emits every one of these metrics is shown by
``test_every_declared_metric_moves_after_real_runs`` below. Every alert's ``for:`` is dropped in a rendered copy of alerts.yml (the
expressions are the shipped ones, unchanged) so the test sees them fire in seconds, not minutes.
Prometheus 2.42 has no parse endpoint: a dashboard query parses when /api/v1/query does not
answer ``bad_data``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from infra.grafana import DASHBOARDS
from infra.prometheus import RULE_FILES, running_prometheus, serve_registry
from infra.sandbox.ports import free_port
from workers.telemetry import metrics_runtime
from workflows import telemetry

NS, DEP = "alerts-test", "chat"  # a namespace no other test records in the shared registry

# DESIGN.md "Metric names" (vLLM, HTTP server, DCGM) + kube-state-metrics' node labels (cost).
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
}
DESIGN_METRICS = {
    "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total", "http_requests_total",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
} | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
EXTERNAL = {"up", "kube_node_labels"}
ALERTS = {
    "GPUUtilisationHigh", "GPUMemoryHigh", "RequestsWaitingHigh", "TTFTP99High", "TPOTP99High", "ScaleUpSuccessLow",
    "ColdStartSlow", "RolloutPaused", "RolloutFailed", "MetricSourceDown", "MetricQueryErrors",
}


def telemetry_metrics() -> set[str]:
    """The series names of every declared tideplane metric, as the exporter writes them."""
    suffixes = {"counter": ("",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {f"{m.name}{s}" for m in telemetry.METRICS for s in suffixes[m.kind]}


def recording_rules() -> set[str]:
    groups = yaml.safe_load(RULE_FILES[0].read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"]}


KNOWN = DESIGN_METRICS | EXTERNAL | telemetry_metrics() | recording_rules()

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on", "ignoring", "group_left", "group_right"}


def metric_names(promql: str) -> set[str]:
    """The metric names a PromQL expression selects (strings, matchers, ranges and label lists removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", text)
    return {n for n in names if n.lower() not in _KEYWORDS}


def test_metric_names_extraction():
    expr = ('sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{version=~"$v"}[1m])) / on (pod) group_left () '
            'max(up offset 5m) * 1e6 and bool DCGM_FI_DEV_GPU_UTIL')
    assert metric_names(expr) == {"vllm:e2e_request_latency_seconds_bucket", "up", "DCGM_FI_DEV_GPU_UTIL"}


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
                "vllm:time_to_first_token_seconds": ttft, "vllm:time_per_output_token_seconds": tpot,
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


def record_before_first_scrape(meter) -> None:
    """A rollout of 2.0.0 is at 5 %, embed's is paused, chat scales up on spot."""
    for pool, capacity, desired, ready in (("gpu-on-demand", "on-demand", 2, 2), ("gpu-spot", "spot", 3, 1)):
        telemetry.replicas(meter, NS, DEP, pool, capacity, desired, ready)
    telemetry.route_weights(meter, NS, DEP, {"1.0.0": 95, "2.0.0": 5})
    telemetry.scale_up_started(meter, NS, DEP, "gpu-spot")
    telemetry.rollout_paused(meter, NS, "embed", True)
    telemetry.spot_failover(meter, "gpu-spot", "replaced", 42)
    telemetry.retention_action(meter, "llama", "deleted")
    telemetry.gate_verdict(meter, NS, DEP, "2.0.0", "pass")


def record_after_first_scrape(meter) -> None:
    """2.0.0 fails its TTFT gate and is rolled back; one 7-minute cold start, one scale-up given up."""
    telemetry.gate_verdict(meter, NS, DEP, "2.0.0", "fail", failing_gate="ttft_p99")
    telemetry.rollout_finished(meter, NS, DEP, "rolled_back", "canary-5", rollback_seconds=3.5)
    telemetry.scaling_decision(meter, NS, DEP, "up", "queue_depth")
    telemetry.scale_up_finished(meter, NS, DEP, "gpu-spot", ready=True, seconds=420)
    telemetry.scale_up_finished(meter, NS, DEP, "gpu-spot", ready=False, seconds=900)
    telemetry.metric_query_error(meter, "prometheus", "unreachable")


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
        time.sleep(1)
        empty = [(where, expr) for where, expr in empty if not query(prometheus, render(board, expr))["data"]["result"]]
    assert not empty, f"{name}: no data for {[where for where, _ in empty]}"


def query(url: str, promql: str) -> dict:
    return httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
