"""One BackendTrafficPolicy per route against the API emulator: the writers share it and adopt the
old per-writer objects; a second policy on the route is reported Conflicted, as Envoy Gateway does."""

from __future__ import annotations

import yaml
from kubernetes import client

from activities.clients.kube import KubeClient
from activities.scaling.scaling_activities import queue_limit_policy
from activities.core.traffic_policy import POLICY_API, POLICY_PLURAL, apply_traffic_policy
from infra.sandbox.fleet_simulator.cluster import read_cluster, report_policy_status
from infra.sandbox.launcher import ENVOY_GATEWAY_CRDS
from tests.kube_fixtures import emulated_cluster
from workflows.core.naming import DeploymentRef, traffic_policy_name
from workflows.quotas.policy import QuotaFile, quota_policy
from workflows.scaling.queue_limit import QueueLimit
from workflows.core.traffic_policy import QUEUE_LIMIT_FIELDS, QUOTA_FIELDS

NS = "llm-serving"
QUOTAS = QuotaFile(namespace=NS, route="chat", tenants=[{"name": "acme", "tokens_per_minute": 100, "monthly_tokens": 10_000}])


def test_writers_share_the_routes_policy_and_a_second_one_is_conflicted(tmp_path):
    with emulated_cluster(tmp_path) as cluster:
        api = cluster.api
        for crd in yaml.safe_load_all(ENVOY_GATEWAY_CRDS.read_text()):
            client.ApiextensionsV1Api(api).create_custom_resource_definition(crd)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
        custom, kube = client.CustomObjectsApi(api), KubeClient(api)
        custom.create_namespaced_custom_object("gateway.networking.k8s.io", "v1", NS, "httproutes", {
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "chat"},
            "spec": {"parentRefs": [{"name": "inference-gateway"}], "rules": [{"backendRefs": [{"name": "chat-v1", "port": 8000}]}]}})
        old_quotas = quota_policy(QUOTAS, {})  # what a worker of before wrote, under its own name
        old_quotas["metadata"]["name"] = "chat-token-quotas"
        custom.create_namespaced_custom_object(*POLICY_API, NS, POLICY_PLURAL, old_quotas)

        limit = queue_limit_policy(DeploymentRef(namespace=NS, name="chat"), QueueLimit(max_pending_requests=7, retry_after_seconds=2))
        assert apply_traffic_policy(kube, limit, QUEUE_LIMIT_FIELDS) == "created"
        names = [p["metadata"]["name"] for p in custom.list_namespaced_custom_object(*POLICY_API, NS, POLICY_PLURAL)["items"]]
        assert names == [traffic_policy_name("chat")]  # the old object adopted, then deleted
        assert apply_traffic_policy(kube, quota_policy(QUOTAS, {"acme": 10_000}), QUOTA_FIELDS) == "updated"
        assert apply_traffic_policy(kube, limit, QUEUE_LIMIT_FIELDS) == "unchanged"
        shared = custom.get_namespaced_custom_object(*POLICY_API, NS, POLICY_PLURAL, traffic_policy_name("chat"))
        assert shared["spec"]["circuitBreaker"] == {"maxPendingRequests": 7}
        assert shared["spec"]["rateLimit"]["global"]["rules"][0]["limit"]["requests"] == 0  # acme cut off, limit kept

        stranger = {**old_quotas, "metadata": {"name": "zz-someone-elses"}}  # created later: Envoy Gateway ignores it
        custom.create_namespaced_custom_object(*POLICY_API, NS, POLICY_PLURAL, stranger)
        report_policy_status(api, read_cluster(api))
        status = {p["metadata"]["name"]: [c for a in p["status"]["ancestors"] for c in a["conditions"]]
                  for p in custom.list_namespaced_custom_object(*POLICY_API, NS, POLICY_PLURAL)["items"]}
        assert [(c["status"], c["reason"]) for c in status["zz-someone-elses"]] == [("False", "Conflicted")]
        assert [c["status"] for c in status[traffic_policy_name("chat")]] == ["True"]
