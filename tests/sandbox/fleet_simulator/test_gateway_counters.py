"""The sandbox gateway counts what it answered per backend as Envoy does (infra/sandbox/gateway.py
UpstreamStats): what the rollout's gateway gate reads (GateQueries.gateway_error_rate)."""

from __future__ import annotations

import re

import pytest

from infra.sandbox.config import Demand
from infra.sandbox.fleet_simulator.cluster import Cluster
from infra.sandbox.fleet_simulator.simulator import FleetSimulator
from tests.sandbox.fleet_simulator.test_fleet_simulator import PROFILE, pod, route, service
from workflows.core.engine_metrics import metric_names
from workflows.rollout.types import GateQueries

SERVICES = [service("chat-v1", "1"), service("chat-v2", "2")]


SAMPLE = re.compile(r'^([\w:]+)\{(.*)\} (\S+)$')


def samples(fleet: FleetSimulator) -> dict[tuple[str, frozenset], float]:
    """The gateway job's samples (``/gateway/metrics``): name and labels -> value, as Prometheus reads the text
    (names as written, no ``_total`` added)."""
    found = {}
    for line in fleet.gateway_metrics().splitlines():
        if m := SAMPLE.match(line):
            found[(m[1], frozenset(re.findall(r'(\w+)="([^"]*)"', m[2])))] = float(m[3])
    return found


def backend(version: str, **extra: str) -> frozenset:
    return frozenset({"namespace": "llm-serving", "deployment": "chat", "version": version, **extra}.items())


def run(pods: list[dict], weights: dict[str, int], profile=PROFILE, ticks: int = 10) -> FleetSimulator:
    fleet = FleetSimulator(time_scale=10, seed=1)
    cluster = Cluster(pods=pods, services=SERVICES, routes=[route(weights)], profiles={"default": profile},
                      demand={"llm-serving/chat": Demand(rps=2)})
    for _ in range(ticks):
        fleet.update(cluster, 0.5)
    return fleet


def pod_answers(fleet: FleetSimulator, pod_name: str, status: str) -> float:
    """What one pod's own vLLM HTTP server counted (its ``/metrics``: no version label, the pod is the version's)."""
    return sum(float(m[3]) for line in (fleet.pod_metrics("llm-serving", pod_name) or "").splitlines()
               if (m := SAMPLE.match(line)) and m[1] == "http_requests_total" and f'status="{status}"' in m[2])


def test_the_gateways_upstream_answers_are_the_pods_answers_by_version_and_class():
    fleet = run([pod("v1-a", "1"), pod("v2-a", "2")], {"chat-v1": 50, "chat-v2": 50}, PROFILE.model_copy(update={"error_rate": 0.2}))
    seen = samples(fleet)
    for version, pod_name in (("1", "v1-a"), ("2", "v2-a")):
        ok, failed = pod_answers(fleet, pod_name, "2xx"), pod_answers(fleet, pod_name, "5xx")
        assert ok > 0 and failed > 0
        assert seen[("envoy_cluster_upstream_rq_total", backend(version))] == ok + failed
        assert seen[("envoy_cluster_upstream_rq_xx", backend(version, envoy_response_code_class="5"))] == failed
        assert seen[("envoy_cluster_upstream_rq_xx", backend(version, envoy_response_code_class="2"))] == ok
    assert not any(name == "envoy_cluster_upstream_cx_none_healthy" for name, _ in seen)


def test_the_share_of_a_version_without_a_ready_pod_is_answered_503_by_the_gateway_and_counted_by_no_pod():
    """A lost canary pod: its 50 % of 2 rps over 10 ticks of 5 sandbox seconds are the gateway's 503s."""
    fleet = run([pod("v1-a", "1"), pod("v2-a", "2", ready=False)], {"chat-v1": 50, "chat-v2": 50})
    seen = samples(fleet)
    assert seen[("envoy_cluster_upstream_cx_none_healthy", backend("2"))] == pytest.approx(2 * 0.5 * 50)
    assert pod_answers(fleet, "v2-a", "2xx") + pod_answers(fleet, "v2-a", "5xx") == 0
    assert ("envoy_cluster_upstream_rq_total", backend("2")) not in seen
    assert seen[("envoy_cluster_upstream_rq_total", backend("1"))] > 0


def test_the_sandbox_gateway_exports_every_family_the_gateway_gate_reads():
    fleet = run([pod("v1-a", "1"), pod("v2-a", "2", ready=False)], {"chat-v1": 50, "chat-v2": 50})
    exported = {name for name, _ in samples(fleet)}
    assert metric_names(GateQueries().gateway_error_rate) <= exported
