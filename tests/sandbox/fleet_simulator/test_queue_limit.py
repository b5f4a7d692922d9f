"""The sandbox gateway enforces the queue limit tideplane writes (an Envoy Gateway BackendTrafficPolicy)."""

from __future__ import annotations

from infra.sandbox.config import Demand
from infra.sandbox.fleet_simulator.cluster import Cluster
from infra.sandbox.fleet_simulator.simulator import FleetSimulator
from tests.sandbox.fleet_simulator.test_fleet_simulator import PROFILE, pod, route, service
from workflows.core.naming import DeploymentRef

from activities.scaling.scaling_activities import queue_limit_policy
from workflows.scaling.queue_limit import QueueLimit


def test_requests_beyond_the_pending_limit_are_refused_and_counted():
    policy = queue_limit_policy(DeploymentRef(namespace="llm-serving", name="chat"), QueueLimit(max_pending_requests=5, retry_after_seconds=3))
    base = dict(pods=[pod("v1-a", "1")], services=[service("chat-v1", "1")], routes=[route({"chat-v1": 100})],
                profiles={"default": PROFILE.model_copy(update={"capacity_rps": 1})})
    fleet = FleetSimulator(time_scale=10, seed=1)
    fleet.update(Cluster(**base, traffic_policies=[policy], demand={"llm-serving/chat": Demand(rps=0)}), 0.5)
    assert fleet.refuse_when_queue_full("llm-serving", "chat") is None  # an idle engine admits

    fleet.update(Cluster(**base, traffic_policies=[policy], demand={"llm-serving/chat": Demand(rps=40)}), 2.0)  # 20 s far over capacity
    waiting = fleet.replicas[("llm-serving", "v1-a")][1].waiting
    assert waiting >= 5
    assert fleet.refuse_when_queue_full("llm-serving", "chat") == 3
    assert 'envoy_cluster_upstream_rq_pending_overflow{namespace="llm-serving",deployment="chat"} 1.0' in fleet.gateway_metrics()

    fleet.update(Cluster(**base, demand={"llm-serving/chat": Demand(rps=40)}), 0.5)  # the policy deleted: no limit
    assert fleet.refuse_when_queue_full("llm-serving", "chat") is None


def test_a_second_policy_on_the_route_is_conflicted_and_not_enforced():
    """As Envoy Gateway: the oldest BackendTrafficPolicy on a route is enforced, a later one is reported Conflicted."""
    older = {"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy",
              "metadata": {"name": "chat-token-quotas", "namespace": "llm-serving", "creationTimestamp": "2026-12-01T10:00:00Z"},
              "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "chat"}],
                       "rateLimit": {"type": "Global", "global": {"rules": []}}}}
    limit = queue_limit_policy(DeploymentRef(namespace="llm-serving", name="chat"), QueueLimit(max_pending_requests=5, retry_after_seconds=3))
    newer = {**limit, "metadata": {**limit["metadata"], "name": "chat-queue-limit", "creationTimestamp": "2026-12-01T10:05:00Z"}}
    base = dict(pods=[pod("v1-a", "1")], services=[service("chat-v1", "1")], routes=[route({"chat-v1": 100})],
                profiles={"default": PROFILE.model_copy(update={"capacity_rps": 1})})
    cluster = Cluster(**base, traffic_policies=[newer, older], demand={"llm-serving/chat": Demand(rps=40)})
    fleet = FleetSimulator(time_scale=10, seed=1)
    fleet.update(cluster, 2.0)  # far over capacity: the queue limit would refuse
    assert fleet.replicas[("llm-serving", "v1-a")][1].waiting >= 5
    assert fleet.refuse_when_queue_full("llm-serving", "chat") is None  # the newer policy's limit is not enforced
    [lost] = [a["conditions"][0] for a in cluster.policy_status(newer)["ancestors"]]
    assert (lost["status"], lost["reason"]) == ("False", "Conflicted")
    assert [a["conditions"][0]["status"] for a in cluster.policy_status(older)["ancestors"]] == ["True"]

    fleet.update(Cluster(**base, traffic_policies=[newer], demand={"llm-serving/chat": Demand(rps=40)}), 0.5)  # the older one deleted
    assert fleet.refuse_when_queue_full("llm-serving", "chat") == 3


def test_a_request_for_a_version_without_a_ready_pod_is_counted_as_no_healthy_upstream():
    """Envoy's envoy_cluster_upstream_cx_none_healthy: the 503s a lost canary pod's share gets, which no pod counts."""
    cluster = Cluster(pods=[pod("v1-a", "1"), pod("v2-a", "2", ready=False)], services=[service("chat-v1", "1"), service("chat-v2", "2")],
                      routes=[route({"chat-v1": 0, "chat-v2": 100})], profiles={"default": PROFILE}, demand={"llm-serving/chat": Demand(rps=0)})
    fleet = FleetSimulator(time_scale=10, seed=1)
    fleet.update(cluster, 0.5)
    assert isinstance(fleet.gateway_route("llm-serving", "chat", {}), str)
    assert 'envoy_cluster_upstream_cx_none_healthy{namespace="llm-serving",deployment="chat",version="2"} 1.0' in fleet.gateway_metrics()
