"""The emulator refuses what a real API server refuses, with the same status, reason and messages.

Driven through the official client (and kubectl) against one emulated cluster for the module;
each test works in a namespace of its own.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.kube_fixtures import kube_wait, namespace_for, run_kube_api, write_kubeconfig

GATEWAY_API = ("gateway.networking.k8s.io", "v1")
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                   "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                   "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


@pytest.fixture(scope="module")
def api_url():
    with run_kube_api() as url:
        yield url


@pytest.fixture(scope="module")
def api(api_url):
    config = client.Configuration()
    config.host = api_url
    with client.ApiClient(config) as api_client:
        yield api_client


@pytest.fixture
def ns(api, request) -> str:
    return namespace_for(api, request)


def refused(call, *args, **kwargs) -> tuple[int, dict]:
    with pytest.raises(ApiException) as err:
        call(*args, **kwargs)
    return err.value.status, json.loads(err.value.body)


def deployment(name: str, labels: dict[str, str]) -> dict:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, **labels}},
                                  "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:1"}]}}}}


def test_label_values_that_a_real_cluster_refuses(api, ns):
    apps = client.AppsV1Api(api)
    code, status = refused(apps.create_namespaced_deployment, ns, deployment("chat", {"version": "1.3.0+build.5"}))
    assert code == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith('Deployment.apps "chat" is invalid: [metadata.labels: Invalid value: '
                                        f'"1.3.0+build.5": {LABEL_VALUE_MSG}, spec.template.metadata.labels')
    assert status["details"]["causes"][0] == {"reason": "FieldValueInvalid", "field": "metadata.labels",
                                              "message": f'Invalid value: "1.3.0+build.5": {LABEL_VALUE_MSG}'}
    long_value = "a" * 70
    code, status = refused(apps.create_namespaced_deployment, ns, deployment("chat", {"model": long_value}))
    assert code == 422
    assert f'metadata.labels: Invalid value: "{long_value}": must be no more than 63 characters' in status["message"]
    code, status = refused(client.CoreV1Api(api).create_namespaced_config_map, ns,
                           {"metadata": {"name": "x", "labels": {"org/model/x": "a"}}})
    assert code == 422 and "a qualified name must consist of alphanumeric characters" in status["message"]
    # What a real cluster accepts: dots, dashes, underscores, prefixed keys, the empty value, 63 characters.
    apps.create_namespaced_deployment(ns, deployment("chat", {"tideplane.io/version": "1.3.0-build.5",
                                                              "model": "meta-llama.Llama_3", "empty": "",
                                                              "max": "a" * 63}))


def test_names_by_kind(api, ns):
    core = client.CoreV1Api(api)
    code, status = refused(core.create_namespaced_service, ns, {"metadata": {"name": "1chat"},
                                                                 "spec": {"ports": [{"port": 80}]}})
    assert code == 422
    assert status["message"] == (
        'Service "1chat" is invalid: metadata.name: Invalid value: "1chat": a DNS-1035 label must consist of lower '
        "case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric "
        "character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")
    code, status = refused(core.create_namespace, {"metadata": {"name": "team.a"}})
    assert code == 422 and "a lowercase RFC 1123 label must consist of" in status["message"]
    code, status = refused(core.create_namespaced_config_map, ns, {"metadata": {"name": "Upper"}})
    assert code == 422 and "a lowercase RFC 1123 subdomain must consist of" in status["message"]
    core.create_namespaced_config_map(ns, {"metadata": {"name": "1.config"}})  # a subdomain may start with a digit


def test_service_ports_that_a_real_cluster_refuses(api, ns):
    """A strategic merge patch keys a Service's ports by number: changing the number of the one
    "http" port adds a second "http" port, which ValidateService refuses (a JSON merge patch
    replaces the list); several ports need names; no port, or port 0, is refused on create."""
    core = client.CoreV1Api(api)
    http = {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    core.create_namespaced_service(ns, {"metadata": {"name": "chat"}, "spec": {"selector": {"app": "chat"}, "ports": [http]}})
    moved = {"spec": {"ports": [{**http, "port": 8080}]}}
    code, status = refused(core.patch_namespaced_service, "chat", ns, moved)
    assert code == 422 and status["message"] == 'Service "chat" is invalid: spec.ports[1].name: Duplicate value: "http"'
    assert status["details"]["causes"] == [{"reason": "FieldValueDuplicate", "field": "spec.ports[1].name",
                                            "message": 'Duplicate value: "http"'}]
    core.patch_namespaced_service("chat", ns, moved, _content_type="application/merge-patch+json")
    assert [(p.name, p.port) for p in core.read_namespaced_service("chat", ns).spec.ports] == [("http", 8080)]
    code, status = refused(core.create_namespaced_service, ns, {"metadata": {"name": "two"},
                                                                 "spec": {"ports": [{"port": 80}, {"port": 81}]}})
    assert code == 422 and status["message"] == ('Service "two" is invalid: [spec.ports[0].name: Required value, '
                                                 "spec.ports[1].name: Required value]")
    code, status = refused(core.create_namespaced_service, ns, {"metadata": {"name": "none"}, "spec": {}})
    assert code == 422 and status["message"] == 'Service "none" is invalid: spec.ports: Required value'
    code, status = refused(core.create_namespaced_service, ns, {"metadata": {"name": "zero"}, "spec": {"ports": [{"port": 0}]}})
    assert code == 422 and "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive" in status["message"]


def test_container_resources_that_a_real_cluster_refuses(api, ns):
    """ValidateResourceRequirements: a GPU (an extended resource) is never overcommitted, so its
    request needs a limit it equals and both are whole GPUs; no request may exceed its limit."""
    core = client.CoreV1Api(api)

    def pod(name: str, resources: dict) -> dict:
        return {"metadata": {"name": name}, "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:1", "resources": resources}]}}

    field = "spec.containers[0].resources"
    cases = {
        "gpu-below-limit": ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
                            f'{field}.requests: Invalid value: "1": must be equal to nvidia.com/gpu limit of 2'),
        "gpu-no-limit": ({"requests": {"nvidia.com/gpu": "1"}}, f"{field}.limits: Required value: Limit must be set for non overcommitable resources"),
        "half-gpu": ({"requests": {"nvidia.com/gpu": "500m"}, "limits": {"nvidia.com/gpu": "500m"}},
                     f'{field}.limits[nvidia.com/gpu]: Invalid value: "500m": must be an integer'),
        "cpu-above-limit": ({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}},
                            f'{field}.requests: Invalid value: "2": must be less than or equal to cpu limit of 1'),
    }
    for name, (resources, cause) in cases.items():
        code, status = refused(core.create_namespaced_pod, ns, pod(name, resources))
        assert code == 422 and cause in status["message"], (name, status["message"])
    # what a real cluster accepts: CPU and memory overcommitted (request below limit), a GPU limit alone
    core.create_namespaced_pod(ns, pod("burstable", {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}))
    core.create_namespaced_pod(ns, pod("gpu-limit", {"limits": {"nvidia.com/gpu": "1"}}))


def test_annotations_at_most_256_kib(api, ns):
    core = client.CoreV1Api(api)
    code, status = refused(core.create_namespaced_config_map, ns,
                           {"metadata": {"name": "big", "annotations": {"a": "x" * (256 * 1024)}}})
    assert code == 422
    assert status["message"] == 'ConfigMap "big" is invalid: metadata.annotations: Too long: must have at most 262144 bytes'
    assert status["details"]["causes"][0]["reason"] == "FieldValueTooLong"


def route(backends: list[dict]) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "chat"},
            "spec": {"parentRefs": [{"name": "inference"}], "rules": [{"backendRefs": backends}]}}


def test_httproute_schema_and_no_strategic_merge(api, ns):
    custom = client.CustomObjectsApi(api)
    code, status = refused(custom.create_namespaced_custom_object, *GATEWAY_API, ns, "httproutes",
                           route([{"name": "chat-v1", "weight": -5}, {"name": "chat-v2", "port": 8000, "weight": 2000000}]))
    assert code == 422
    assert status["message"] == (
        'HTTPRoute.gateway.networking.k8s.io "chat" is invalid: ['
        "spec.rules[0].backendRefs[0].weight: Invalid value: -5: spec.rules[0].backendRefs[0].weight in body "
        "should be greater than or equal to 0, "
        'spec.rules[0].backendRefs[0]: Invalid value: "object": Must have port for Service reference, '
        "spec.rules[0].backendRefs[1].weight: Invalid value: 2000000: spec.rules[0].backendRefs[1].weight in body "
        "should be less than or equal to 1000000]")
    custom.create_namespaced_custom_object(*GATEWAY_API, ns, "httproutes",
                                           route([{"name": "chat-v1", "port": 8000, "weight": 100}]))
    path = f"/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes/chat"
    body = {"metadata": {"labels": {"a": "b"}}}
    with pytest.raises(ApiException) as err:
        api.call_api(path, "PATCH", header_params={"Content-Type": "application/strategic-merge-patch+json"},
                     body=body, response_types_map={200: "object"}, _return_http_data_only=True)
    assert err.value.status == 415
    assert json.loads(err.value.body)["message"] == (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
    patched = api.call_api(path, "PATCH", header_params={"Content-Type": "application/merge-patch+json"},
                           body=body, response_types_map={200: "object"}, _return_http_data_only=True)
    assert patched["metadata"]["labels"] == {"a": "b"}


def test_deployment_selector_is_immutable(api, ns):
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(ns, deployment("chat", {}))
    changed = deployment("chat", {"tier": "gpu"})
    changed["spec"]["selector"]["matchLabels"]["tier"] = "gpu"
    code, status = refused(apps.replace_namespaced_deployment, "chat", ns, changed)
    assert code == 422
    assert status["message"] == (
        'Deployment.apps "chat" is invalid: spec.selector: Invalid value: v1.LabelSelector{MatchLabels:'
        'map[string]string{"app":"chat", "tier":"gpu"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: '
        "field is immutable")
    changed["spec"]["selector"]["matchLabels"] = {"app": "chat"}
    apps.replace_namespaced_deployment("chat", ns, changed)  # the template may change


def test_finalizers_hold_the_object_until_removed(api, ns):
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "held", "finalizers": ["tideplane.io/cleanup"]}})
    core.delete_namespaced_config_map("held", ns)
    held = core.read_namespaced_config_map("held", ns)
    assert held.metadata.deletion_timestamp is not None and held.metadata.finalizers == ["tideplane.io/cleanup"]
    code, status = refused(core.patch_namespaced_config_map, "held", ns,
                           {"metadata": {"finalizers": ["tideplane.io/cleanup", "other.io/x"]}})
    assert code == 422 and "no new finalizers can be added if the object is being deleted" in status["message"]
    core.patch_namespaced_config_map("held", ns, {"metadata": {"finalizers": None}})
    code, _ = refused(core.read_namespaced_config_map, "held", ns)
    assert code == 404


def test_namespace_terminates_before_it_goes(api, api_url, tmp_path):
    """`kubectl delete -f` of a Namespace and its Deployment: the namespace is Terminating, its
    Deployment still deletable, nothing new may be created in it, then both are gone."""
    core = client.CoreV1Api(api)
    manifest = tmp_path / "app.yaml"
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", **deployment("chat", {})}
    dep["metadata"]["namespace"] = "doomed"
    manifest.write_text(yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}},
                                            dep]))
    kubeconfig = write_kubeconfig(api_url, tmp_path / "kubeconfig")

    def kubectl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                              timeout=30, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})

    done = kubectl("apply", "-f", str(manifest))
    assert done.returncode == 0, done.stderr
    core.delete_namespace("doomed")
    assert core.read_namespace("doomed").status.phase == "Terminating"
    code, status = refused(core.create_namespaced_config_map, "doomed", {"metadata": {"name": "late"}})
    assert code == 403 and status["message"] == (
        'configmaps "late" is forbidden: unable to create new content in namespace doomed because it is being terminated')
    done = kubectl("delete", "-f", str(manifest))
    assert done.returncode == 0, done.stderr
    kube_wait(lambda: "doomed" not in {n.metadata.name for n in core.list_namespace().items}, "the namespace to go")
