"""apply_request_classes on a cluster without the Gateway API Inference Extension: Services per pool
and an HTTPRoute on the class header, idempotent, the route's references resolved."""

from __future__ import annotations

from kubernetes import client
from temporalio.testing import ActivityEnvironment

from activities.classes.request_class_activities import RequestClassActivities
from activities.clients.kube import KubeClient, serving_namespace
from tests.kube_fixtures import kube_wait
from workflows.classes.manifests import RequestClassesInput
from workflows.core.routes import inference_matches

CLASSES = RequestClassesInput(namespace="llm-serving", route="chat-classes", default_class="batch", classes=[
    {"name": "realtime", "deployment": "chat", "priority": 10}, {"name": "batch", "deployment": "chat-batch", "priority": 0}])


def test_without_the_extension_classes_are_header_matches_to_services(kube_api):
    client.CoreV1Api(kube_api).create_namespace(serving_namespace("llm-serving"))
    activities = RequestClassActivities(KubeClient(kube_api), "gateways/inference-gateway")
    first = ActivityEnvironment().run(activities.apply_request_classes, CLASSES)
    assert first.mode == "httproute"
    assert first.changed == ["Service/chat-pool", "Service/chat-batch-pool", "HTTPRoute/chat-classes"]
    assert ActivityEnvironment().run(activities.apply_request_classes, CLASSES).changed == []

    service = client.CoreV1Api(kube_api).read_namespaced_service("chat-batch-pool", "llm-serving")
    assert service.spec.selector == {"app.kubernetes.io/name": "chat-batch"}
    custom = client.CustomObjectsApi(kube_api)
    route = custom.get_namespaced_custom_object("gateway.networking.k8s.io", "v1", "llm-serving", "httproutes", "chat-classes")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway",
                                            "namespace": "gateways"}]
    # Each class is a header match on every inference path, the default rule the inference paths
    # alone: no rule lets an admin path (/v1/load_lora_adapter) through.
    assert [r.get("matches") for r in route["spec"]["rules"]] == [
        inference_matches([{"type": "Exact", "name": "x-request-class", "value": "realtime"}]),
        inference_matches([{"type": "Exact", "name": "x-request-class", "value": "batch"}]), inference_matches()]
    assert route["spec"]["rules"][-1]["backendRefs"] == [{"kind": "Service", "name": "chat-batch-pool", "port": 8000}]

    def resolved():
        got = custom.get_namespaced_custom_object("gateway.networking.k8s.io", "v1", "llm-serving", "httproutes", "chat-classes")
        conditions = {c["type"]: c["status"] for p in (got.get("status") or {}).get("parents") or [] for c in p["conditions"]}
        return conditions.get("ResolvedRefs") == "True"

    kube_wait(resolved, "the gateway controller to resolve the route's Services")
