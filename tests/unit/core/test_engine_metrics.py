"""The metric contract (workflows/core/engine_metrics.py) against vLLM 0.32's exposition and against
everything the product reads: queries, recording rules, alerts, dashboards; and the fleet model's
exposition against the real engine's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from infra.grafana import DASHBOARDS
from infra.prometheus import RULE_FILES
from infra.sandbox.config import Demand, Profile
from infra.sandbox.fleet_simulator.cluster import Cluster
from infra.sandbox.fleet_simulator.simulator import FleetSimulator
from workflows.core import engine_metrics
from workflows.core.engine_metrics import BY_NAME, DCGM, FAMILIES, REMOVED, family_of, metric_names
from workflows.core.naming import GPU_RESOURCE, LABEL_APP, LABEL_MODEL, LABEL_VERSION

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests/fixtures/vllm/vllm-0.32.0.prom"
PRODUCT = ("workflows", "activities", "workers")
READ_NAME = re.compile(r"vllm:[A-Za-z0-9_:]+|DCGM_FI_[A-Z0-9_]+|http_requests_total")


def exposition(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """series name -> (its family's type, the label names on its samples but ``le``)."""
    out: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            kind, labels = out.setdefault(sample.name, (family.type, set()))
            labels |= set(sample.labels) - {"le"}
    return {name: (kind, frozenset(labels)) for name, (kind, labels) in out.items()}


VLLM_032 = exposition(FIXTURE.read_text())


def product_reads() -> dict[str, set[str]]:
    """Every engine / DCGM / HTTP-server series name the product's code, rules and dashboards name -> where."""
    found: dict[str, set[str]] = {}
    files = [p for top in PRODUCT for p in (ROOT / top).rglob("*.py")] + list(RULE_FILES) + list(DASHBOARDS.values())
    for path in files:
        if path.name == "engine_metrics.py":
            continue  # the contract names the removed families to say so
        for name in READ_NAME.findall(path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_engine_metric_the_product_reads_is_in_the_contract():
    reads = product_reads()
    assert "vllm:request_time_per_output_token_seconds_bucket" in reads
    unknown = {name: where for name, where in reads.items() if family_of(name) is None}
    assert not unknown, f"read but not in workflows/core/engine_metrics.py: {unknown}"
    removed = {name: where for name, where in reads.items() if any(name.startswith(r) for r in REMOVED)}
    assert not removed, f"removed from vLLM, still read: {removed}"


def _exprs(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return own + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_rule_and_dashboard_expressions_name_only_contract_or_own_metrics():
    exprs = [rule["expr"] for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"] for rule in g["rules"]]
    for path in DASHBOARDS.values():
        exprs += _exprs(json.loads(path.read_text()))
    engine = {n for e in exprs for n in metric_names(e) if READ_NAME.fullmatch(n)}
    assert engine and all(family_of(n) for n in engine), sorted(n for n in engine if not family_of(n))
    assert family_of("vllm:request_time_per_output_token_seconds_bucket") in {family_of(n) for n in engine}


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.source != DCGM], ids=lambda f: f.name)
def test_every_engine_family_exists_in_vllm_0_32_with_its_type_and_labels(family):
    for series in family.series():
        assert series in VLLM_032, f"{series} is not in vLLM 0.32's exposition"
        kind, labels = VLLM_032[series]
        assert kind == family.type, f"{series}: vLLM says {kind}, the contract {family.type}"
        assert labels == set(family.labels), f"{series}: vLLM labels {sorted(labels)}, the contract {sorted(family.labels)}"


def test_vllm_labels_no_sample_with_the_scrape_labels():
    for series, (_, labels) in VLLM_032.items():
        assert not labels & {"namespace", "pod", "deployment", "version", "node"}, series


def test_tpot_gate_reads_the_per_request_histogram():
    from workflows.adapters.types import ADAPTER_QUERIES
    from workflows.rollout.types import GateQueries

    for queries in (GateQueries(), ADAPTER_QUERIES):
        assert metric_names(queries.tpot_p99) == {"vllm:request_time_per_output_token_seconds_bucket"}
    assert engine_metrics.REQUEST_TIME_PER_OUTPUT_TOKEN.type == "histogram"


def _simulated_fleet() -> FleetSimulator:
    fleet = FleetSimulator(time_scale=10, seed=1)
    node = {"metadata": {"name": "node-a", "labels": {}}, "status": {"allocatable": {GPU_RESOURCE: "1"}}}
    pod = {"metadata": {"name": "chat-a", "namespace": "llm-serving", "labels": {LABEL_APP: "chat", LABEL_VERSION: "1", LABEL_MODEL: "llama"}},
           "spec": {"nodeName": "node-a", "containers": [{"name": "vllm", "resources": {"limits": {GPU_RESOURCE: "1"}}}]},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    service = {"metadata": {"name": "chat-v1", "namespace": "llm-serving"}, "spec": {"selector": {LABEL_APP: "chat", LABEL_VERSION: "1"}}}
    route = {"metadata": {"name": "chat", "namespace": "llm-serving"}, "spec": {"rules": [{"backendRefs": [{"name": "chat-v1", "port": 8000, "weight": 100}]}]}}
    profile = Profile(capacity_rps=4, error_rate=0.1, ttft_seconds=0.2, tpot_seconds=0.02, output_tokens=20, prompt_tokens=100)
    cluster = Cluster(pods=[pod], services=[service], routes=[route], nodes=[node], profiles={"default": profile}, demand={"llm-serving/chat": Demand(rps=2)})
    for _ in range(3):
        fleet.update(cluster, 0.5)
    return fleet


def _engine_series(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    return {name: v for name, v in exposition(text).items() if name.startswith(("vllm:", "http_"))}


def test_a_simulated_pods_own_exposition_is_vllms():
    """A simulated pod's /metrics (the fleet simulator's /pods/<namespace>/<pod>/metrics): every
    series exists in vLLM 0.32 with its type and exactly vLLM's label names; nothing vLLM lacks."""
    engine = _engine_series(_simulated_fleet().pod_metrics("llm-serving", "chat-a"))
    assert "vllm:request_time_per_output_token_seconds_bucket" in engine and "http_requests_total" in engine
    for series, (kind, labels) in engine.items():
        assert series in VLLM_032, f"the fleet model exports {series}, which vLLM 0.32 lacks"
        assert (kind, labels) == VLLM_032[series], f"{series}: fleet model {kind} {sorted(labels)}, vLLM {VLLM_032[series]}"


def test_neither_the_fleet_wide_nor_the_gateway_exposition_has_engine_series():
    """The simulator's /metrics (DCGM, kube-state-metrics) and its gateway's carry no vLLM series:
    those come from each pod's own address, so no sandbox process writes the scrape labels onto
    engine samples."""
    fleet = _simulated_fleet()
    assert _engine_series(fleet.metrics()) == {} and _engine_series(fleet.gateway_metrics()) == {}


def test_metric_names_extraction():
    expr = ('sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{version=~"$v",deployment="${deployment}"}[${window}])) / on (pod) group_left () '
            'max(up offset 5m) * 1e6 and bool DCGM_FI_DEV_GPU_UTIL')
    assert metric_names(expr) == {"vllm:e2e_request_latency_seconds_bucket", "up", "DCGM_FI_DEV_GPU_UTIL"}
    assert family_of("vllm:e2e_request_latency_seconds_count") is BY_NAME["vllm:e2e_request_latency_seconds"]
    assert family_of("vllm:num_requests_waiting_bucket") is None
