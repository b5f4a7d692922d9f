"""Endpoints/EndpointSlices from Ready pods, HTTPRoute status from the gateway controller, node Leases.

One emulated cluster (time scale 100) for the module, through the official client and kubectl.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from tests.kube_fixtures import emulated_cluster, kube_wait as wait
from workflows.core.naming import GPU_RESOURCE, LABEL_MODEL

NS = "llm-serving"
GATEWAY_API = ("gateway.networking.k8s.io", "v1")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(tmp_path_factory.mktemp("kubectl")) as cluster:
        core = client.CoreV1Api(cluster.api)
        core.create_node({"metadata": {"name": "gpu-a"}, "status": {"allocatable": {GPU_RESOURCE: "8"}}})
        core.create_namespace({"metadata": {"name": NS}})
        core.create_namespaced_config_map("tideplane-sandbox", {"metadata": {"name": "fleet-profiles"}, "data": {
            "default": json.dumps({"load_seconds": 1}), "never": json.dumps({"never_ready": True})}})
        yield cluster


def test_endpoints_follow_ready_pods(cluster):
    api = cluster.api
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    core.create_namespaced_service(NS, {"metadata": {"name": "chat"}, "spec": {
        "selector": {"app": "chat"}, "ports": [{"name": "http", "port": 80, "targetPort": 8000}]}})
    for name, model in (("chat-good", "default"), ("chat-bad", "never")):
        core.create_namespaced_pod(NS, {"metadata": {"name": name, "labels": {"app": "chat", LABEL_MODEL: model}},
                                        "spec": {"containers": [{"name": "vllm", "image": "vllm:1"}]}})

    def subset():
        subsets = core.read_namespaced_endpoints("chat", NS).subsets or []
        return subsets[0] if subsets else None

    wait(lambda: (s := subset()) is not None and s.addresses and len(s.addresses) == 1, "the Ready pod's address")
    s = subset()
    assert s.addresses[0].target_ref.name == "chat-good" and s.ports[0].port == 8000
    assert [a.target_ref.name for a in s.not_ready_addresses] == ["chat-bad"]
    slices = discovery.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=chat").items
    assert len(slices) == 1 and slices[0].address_type == "IPv4"
    ready = {e.target_ref.name: e.conditions.ready for e in slices[0].endpoints}
    assert ready == {"chat-good": True, "chat-bad": False}

    core.delete_namespaced_pod("chat-good", NS)
    wait(lambda: not subset().addresses, "the deleted pod out of the ready addresses")
    core.delete_namespaced_service("chat", NS)
    wait(lambda: not core.list_namespaced_endpoints(NS).items
         and not discovery.list_namespaced_endpoint_slice(NS).items, "endpoints gone with the service")


def route_conditions(custom: client.CustomObjectsApi, name: str) -> dict[str, tuple[str, str]]:
    parents = (custom.get_namespaced_custom_object(*GATEWAY_API, NS, "httproutes", name).get("status") or {}).get("parents")
    return {c["type"]: (c["status"], c["reason"]) for c in (parents or [{}])[0].get("conditions") or []}


def test_route_status_from_the_gateway_controller(cluster):
    api = cluster.api
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    custom.create_namespaced_custom_object(*GATEWAY_API, NS, "httproutes", {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "chat"},
        "spec": {"parentRefs": [{"name": "inference-gateway"}],
                 "rules": [{"backendRefs": [{"name": "chat-v1", "port": 80, "weight": 100}]}]}})
    wait(lambda: route_conditions(custom, "chat") == {"Accepted": ("False", "NoMatchingParent"),
                                                      "ResolvedRefs": ("False", "BackendNotFound")}, "route refused")
    custom.create_namespaced_custom_object(*GATEWAY_API, NS, "gateways", {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "inference-gateway"},
        "spec": {"gatewayClassName": "sandbox", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}})
    core.create_namespaced_service(NS, {"metadata": {"name": "chat-v1"}, "spec": {"ports": [{"port": 80}]}})
    wait(lambda: route_conditions(custom, "chat") == {"Accepted": ("True", "Accepted"),
                                                      "ResolvedRefs": ("True", "ResolvedRefs")}, "route accepted")
    gateway = custom.get_namespaced_custom_object(*GATEWAY_API, NS, "gateways", "inference-gateway")
    assert {c["type"]: c["status"] for c in gateway["status"]["conditions"]} == {"Accepted": "True", "Programmed": "True"}


def test_node_lease_and_version(cluster):
    api, kubectl = cluster.api, cluster.kubectl
    lease = wait(lambda: _lease(api), "the node's lease", 5)
    assert lease.spec.holder_identity == "gpu-a" and lease.spec.renew_time is not None
    describe = kubectl("describe", "node", "gpu-a")
    assert describe.returncode == 0, describe.stderr
    assert "HolderIdentity:  gpu-a" in describe.stdout
    server = json.loads(kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    assert client.CoreV1Api(api).read_node("gpu-a").status.node_info.kubelet_version == server


def _lease(api):
    try:
        return client.CoordinationV1Api(api).read_namespaced_lease("gpu-a", "kube-node-lease")
    except client.ApiException:
        return None
