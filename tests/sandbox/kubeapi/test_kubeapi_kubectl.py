"""The stock kubectl 1.32 paths that need more than JSON CRUD: its protobuf bodies, explain, whoami.

One emulated cluster for the module; kubectl as the admin (no credentials).
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from tests.kube_fixtures import emulated_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(admin ApiClient, kubectl returning its stdout, asserting it succeeded)."""
    with emulated_cluster(tmp_path_factory.mktemp("kubectl")) as cluster:

        def kubectl(*args: str) -> str:
            done = cluster.kubectl(*args)
            assert done.returncode == 0, done.stderr
            return done.stdout

        yield cluster.api, kubectl


def test_imperative_creates_sent_as_protobuf(cluster):
    """`kubectl create namespace|configmap|deployment` POST protobuf and never retry as JSON."""
    api, kubectl = cluster
    assert kubectl("create", "namespace", "team-a").strip() == "namespace/team-a created"
    kubectl("create", "configmap", "settings", "-n", "team-a", "--from-literal=mode=fast", "--from-literal=n=3")
    kubectl("create", "deployment", "web", "-n", "team-a", "--image=vllm/vllm-openai:1", "--replicas=0", "--port=8000")
    assert client.CoreV1Api(api).read_namespaced_config_map("settings", "team-a").data == {"mode": "fast", "n": "3"}
    dep = client.AppsV1Api(api).read_namespaced_deployment("web", "team-a")
    assert dep.spec.replicas == 0  # an explicit 0 survives (a pointer field in protobuf)
    assert dep.spec.selector.match_labels == {"app": "web"} and dep.metadata.labels == {"app": "web"}
    container = dep.spec.template.spec.containers[0]
    assert (container.name, container.image, container.ports[0].container_port) == ("vllm-openai", "vllm/vllm-openai:1", 8000)


def test_protobuf_body_with_fields_the_emulator_cannot_decode_is_415(cluster):
    api, _ = cluster
    body = b"k8s\x00" + bytes([0x0a, 0x0e, 0x0a, 0x02]) + b"v1" + bytes([0x12, 0x08]) + b"Namespac" + \
        bytes([0x12, 0x04, 0x78, 0x01, 0x0a, 0x00])  # typeMeta {v1, "Namespac"}: a kind it has no schema for
    with pytest.raises(client.ApiException) as err:
        api.call_api("/api/v1/namespaces", "POST", header_params={"Content-Type": "application/vnd.kubernetes.protobuf"},
                     body=body, response_types_map={201: "object"}, _return_http_data_only=True)
    assert err.value.status == 415


def test_explain_reads_the_openapi_v3_schemas(cluster):
    _, kubectl = cluster
    replicas = kubectl("explain", "deployment.spec.replicas")
    assert "FIELD: replicas <integer>" in replicas and "Number of desired pods." in replicas
    spec = kubectl("explain", "pods.spec")
    assert "containers\t<[]Container> -required-" in spec
    assert "KIND:       HTTPRoute" in kubectl("explain", "httproutes")


def test_whoami_and_can_i_as_the_admin(cluster):
    _, kubectl = cluster
    whoami = json.loads(kubectl("auth", "whoami", "-o", "json"))
    assert whoami["status"]["userInfo"] == {"username": "system:admin",
                                            "groups": ["system:masters", "system:authenticated"]}
    assert kubectl("auth", "can-i", "delete", "nodes").strip() == "yes"


def test_nodes_report_the_server_version(cluster):
    api, kubectl = cluster
    client.CoreV1Api(api).create_node({"metadata": {"name": "gpu-a"}})
    server = json.loads(kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
    assert kubectl("get", "node", "gpu-a", "--no-headers").split()[-1] == server
