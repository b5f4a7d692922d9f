"""The Kubernetes API emulator, driven only through the official kubernetes client (and kubectl).

Each test gets a fresh emulated cluster (fixture `kube_api`, time scale 100: a 30 s model load
takes 0.3 s). GPU nodes are registered through the API, as the sandbox's node provisioner does.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.kube_fixtures import run_kube_api
from tests.sandbox_fixtures import wait_until
from workflows.core.naming import GPU_RESOURCE, NODE_CAPACITY_TYPE, NODE_INSTANCE_TYPE, NODE_ZONE


NS = "llm-serving"


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    return wait_until(predicate, timeout, what, interval=0.05)  # the emulator answers in milliseconds


def add_node(core: client.CoreV1Api, name: str, gpus: int = 4, capacity_type: str = "on-demand",
             zone: str = "us-east-1a", taints: list[dict] | None = None) -> None:
    core.create_node({
        "metadata": {"name": name, "labels": {NODE_CAPACITY_TYPE: capacity_type, NODE_ZONE: zone,
                                              NODE_INSTANCE_TYPE: "p5.48xlarge", "kubernetes.io/hostname": name}},
        "spec": {"providerID": f"aws:///{zone}/i-{name}", "taints": taints or []},
        "status": {"allocatable": {GPU_RESOURCE: str(gpus), "cpu": "32", "memory": "256Gi", "pods": "110"}},
    })


def gpu_deployment(name: str, replicas: int, gpus: int = 1, model: str = "llama-3-8b", version: str = "1.0.0",
                   **pod_spec) -> dict:
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/version": version, "tideplane.io/model": model}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS, "labels": {"app.kubernetes.io/name": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "containers": [{"name": "vllm", "image": f"vllm/vllm-openai:{version}",
                                "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}],
                **pod_spec,
            }},
        },
    }


def set_profiles(core: client.CoreV1Api, profiles: dict[str, dict]) -> None:
    core.create_namespaced_config_map("tideplane-sandbox", {
        "metadata": {"name": "fleet-profiles"}, "data": {k: json.dumps(v) for k, v in profiles.items()}})


def is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def pods_of(core: client.CoreV1Api, name: str) -> list:
    return core.list_namespaced_pod(NS, label_selector=f"app.kubernetes.io/name={name}").items


def ready_replicas(apps: client.AppsV1Api, name: str) -> int:
    return apps.read_namespaced_deployment(name, NS).status.ready_replicas or 0


@pytest.fixture
def cluster(kube_api):
    """(core, apps) clients on a fresh cluster with the test namespace."""
    core, apps = client.CoreV1Api(kube_api), client.AppsV1Api(kube_api)
    core.create_namespace({"metadata": {"name": NS}})
    return core, apps


def test_gpu_deployment_is_scheduled_and_ready_after_its_load_time(cluster):
    core, apps = cluster
    set_profiles(core, {"llama-3-8b@1.0.0": {"load_seconds": 200}, "default": {"load_seconds": 1}})
    add_node(core, "gpu-a")
    add_node(core, "gpu-b")
    add_node(core, "cpu-a", gpus=0)
    apps.create_namespaced_deployment(NS, gpu_deployment("chat", 3, gpus=2))
    started = time.monotonic()

    wait_for(lambda: len([p for p in pods_of(core, "chat") if p.status.phase == "Running"]) == 3, what="3 running")
    pods = pods_of(core, "chat")
    assert not any(is_ready(p) for p in pods), "pods must not be Ready before the model loaded"
    assert {p.spec.node_name for p in pods} == {"gpu-a", "gpu-b"}  # never the CPU node, at most 2 x 2 GPUs per node
    assert all(p.metadata.owner_references[0].kind == "ReplicaSet" for p in pods)
    assert all(p.metadata.name.startswith("chat-") for p in pods)

    wait_for(lambda: ready_replicas(apps, "chat") == 3, what="3 ready replicas")
    assert time.monotonic() - started >= 1.9  # load_seconds 200 at time scale 100
    dep = apps.read_namespaced_deployment("chat", NS)
    assert dep.status.available_replicas == 3 and dep.status.updated_replicas == 3
    assert dep.status.observed_generation == dep.metadata.generation == 1
    assert {c.type: c.status for c in dep.status.conditions} == {"Available": "True", "Progressing": "True"}
    pod = pods_of(core, "chat")[0]
    assert pod.status.container_statuses[0].ready and pod.status.start_time and pod.status.pod_ip
    reasons = {e.reason for e in core.list_namespaced_event(NS).items}
    assert {"Scheduled", "Pulled", "Started", "SuccessfulCreate"} <= reasons


def test_scale_subresource_and_ready_replicas_follow(cluster):
    core, apps = cluster
    add_node(core, "gpu-a", gpus=8)
    apps.create_namespaced_deployment(NS, gpu_deployment("chat", 1))
    wait_for(lambda: ready_replicas(apps, "chat") == 1)

    scale = apps.patch_namespaced_deployment_scale("chat", NS, {"spec": {"replicas": 4}})
    assert scale.spec.replicas == 4
    wait_for(lambda: ready_replicas(apps, "chat") == 4, what="scale up")
    read = apps.read_namespaced_deployment_scale("chat", NS)
    assert read.status.replicas == 4 and "app.kubernetes.io/name=chat" in read.status.selector

    read.spec.replicas = 2
    apps.replace_namespaced_deployment_scale("chat", NS, read)
    wait_for(lambda: len(pods_of(core, "chat")) == 2 and ready_replicas(apps, "chat") == 2, what="scale down")
    assert apps.read_namespaced_deployment("chat", NS).metadata.generation == 3

    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment_scale("chat", NS, {"spec": {"replicas": -1}})
    assert err.value.status == 422


def test_stale_replace_conflicts_and_duplicate_create(cluster):
    core, apps = cluster
    apps.create_namespaced_deployment(NS, gpu_deployment("chat", 0))
    first = apps.read_namespaced_deployment("chat", NS)
    second = apps.read_namespaced_deployment("chat", NS)
    first.spec.replicas = 2
    updated = apps.replace_namespaced_deployment("chat", NS, first)
    assert int(updated.metadata.resource_version) > int(second.metadata.resource_version)

    second.spec.replicas = 5
    with pytest.raises(ApiException) as err:
        apps.replace_namespaced_deployment("chat", NS, second)
    assert err.value.status == 409
    status = json.loads(err.value.body)
    assert status["kind"] == "Status" and status["reason"] == "Conflict"
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment("chat", NS, {"metadata": {"resourceVersion": second.metadata.resource_version},
                                                       "spec": {"replicas": 7}})
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        apps.create_namespaced_deployment(NS, gpu_deployment("chat", 1))
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"
    assert apps.read_namespaced_deployment("chat", NS).spec.replicas == 2


def test_watch_streams_pod_and_event_changes(cluster):
    core, apps = cluster
    add_node(core, "gpu-a")
    start_rv = core.list_namespaced_pod(NS).metadata.resource_version
    apps.create_namespaced_deployment(NS, gpu_deployment("chat", 1))

    seen = []
    for event in watch.Watch().stream(core.list_namespaced_pod, NS, resource_version=start_rv, timeout_seconds=5):
        seen.append((event["type"], event["object"].status.phase, is_ready(event["object"])))
        if is_ready(event["object"]):
            break
    assert seen[0] == ("ADDED", "Pending", False)
    assert ("MODIFIED", "Running", True) in seen

    # A watch without a resourceVersion starts with the current objects as ADDED.
    reasons = set()
    for event in watch.Watch().stream(core.list_namespaced_event, NS, timeout_seconds=1):
        assert event["type"] in ("ADDED", "MODIFIED")
        reasons.add(event["object"].reason)
    assert {"Scheduled", "Started"} <= reasons

    # Label-selected watch: a pod leaving the selector is reported DELETED.
    pod = pods_of(core, "chat")[0]
    stream = watch.Watch().stream(core.list_namespaced_pod, NS, label_selector="tier=gpu",
                                  resource_version=pod.metadata.resource_version, timeout_seconds=3)
    core.patch_namespaced_pod(pod.metadata.name, NS, {"metadata": {"labels": {"tier": "gpu"}}})
    core.patch_namespaced_pod(pod.metadata.name, NS, {"metadata": {"labels": {"tier": None}}})
    assert [next(stream)["type"], next(stream)["type"]] == ["ADDED", "DELETED"]
    stream.close()


def test_watch_resumes_from_a_resource_version_or_is_gone():
    with run_kube_api(100, "--watch-history", "5") as url:
        config = client.Configuration()
        config.host = url
        core = client.CoreV1Api(client.ApiClient(config))
        first = core.create_namespaced_config_map("default", {"metadata": {"name": "cm-0"}}).metadata.resource_version
        for n in range(1, 12):
            core.create_namespaced_config_map("default", {"metadata": {"name": f"cm-{n}"}})
        with pytest.raises(ApiException) as err:
            for _ in watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version=first,
                                          timeout_seconds=2):
                pass
        assert err.value.status == 410 and "Expired" in err.value.reason

        recent = core.list_namespaced_config_map("default").metadata.resource_version
        core.create_namespaced_config_map("default", {"metadata": {"name": "late"}})
        events = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
            core.list_namespaced_config_map, "default", resource_version=recent, timeout_seconds=1)]
        assert events == [("ADDED", "late")]


def test_pods_stay_pending_without_gpus_and_schedule_when_a_node_joins(cluster):
    core, apps = cluster
    add_node(core, "gpu-a", gpus=4)
    add_node(core, "cpu-a", gpus=0)
    apps.create_namespaced_deployment(NS, gpu_deployment("chat", 3, gpus=2))
    wait_for(lambda: ready_replicas(apps, "chat") == 2, what="2 replicas on the only GPU node")
    pending = wait_for(lambda: [p for p in pods_of(core, "chat") if p.status.phase == "Pending"
                                and any(c.reason == "Unschedulable" for c in p.status.conditions or [])])
    assert len(pending) == 1
    cond = next(c for c in pending[0].status.conditions if c.type == "PodScheduled")
    assert cond.status == "False" and "2 Insufficient nvidia.com/gpu" in cond.message and cond.message.startswith("0/2")
    events = core.list_namespaced_event(NS, field_selector=f"involvedObject.name={pending[0].metadata.name}").items
    assert any(e.reason == "FailedScheduling" and e.type == "Warning" for e in events)

    add_node(core, "gpu-b", gpus=4)
    wait_for(lambda: ready_replicas(apps, "chat") == 3, what="the pending replica on the new node")
    assert "gpu-b" in {p.spec.node_name for p in pods_of(core, "chat")}


def test_eviction_replaces_the_pod_and_node_deletion_reschedules(cluster):
    core, apps = cluster
    add_node(core, "gpu-a")
    add_node(core, "gpu-b")
    apps.create_namespaced_deployment(NS, gpu_deployment("chat", 2))
    wait_for(lambda: ready_replicas(apps, "chat") == 2)
    victim = pods_of(core, "chat")[0].metadata.name

    core.create_namespaced_pod_eviction(victim, NS, {"apiVersion": "policy/v1", "kind": "Eviction",
                                                     "metadata": {"name": victim, "namespace": NS}})
    wait_for(lambda: victim not in {p.metadata.name for p in pods_of(core, "chat")}
             and ready_replicas(apps, "chat") == 2, what="a replacement pod")
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_eviction(victim, NS, {"metadata": {"name": victim, "namespace": NS}})
    assert err.value.status == 404

    policy = client.PolicyV1Api(core.api_client)
    policy.create_namespaced_pod_disruption_budget(NS, {"metadata": {"name": "chat"}, "spec": {
        "minAvailable": 2, "selector": {"matchLabels": {"app.kubernetes.io/name": "chat"}}}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_eviction(pods_of(core, "chat")[0].metadata.name, NS, {"metadata": {"name": "x"}})
    assert err.value.status == 429
    policy.delete_namespaced_pod_disruption_budget("chat", NS)

    core.delete_node("gpu-a")
    wait_for(lambda: {p.spec.node_name for p in pods_of(core, "chat")} == {"gpu-b"}
             and ready_replicas(apps, "chat") == 2, what="pods moved off the deleted node")


def test_cordoned_node_is_avoided(cluster):
    core, apps = cluster
    add_node(core, "gpu-a")
    add_node(core, "gpu-b")
    core.patch_node("gpu-a", {"spec": {"unschedulable": True}})
    assert [n.metadata.name for n in core.list_node(field_selector="spec.unschedulable=true").items] == ["gpu-a"]
    assert [n.metadata.name for n in core.list_node(field_selector="spec.unschedulable=false").items] == ["gpu-b"]
    apps.create_namespaced_deployment(NS, gpu_deployment("chat", 4))
    wait_for(lambda: ready_replicas(apps, "chat") == 4)
    assert {p.spec.node_name for p in pods_of(core, "chat")} == {"gpu-b"}

    apps.patch_namespaced_deployment_scale("chat", NS, {"spec": {"replicas": 5}})
    pending = wait_for(lambda: [p for p in pods_of(core, "chat") if p.status.conditions
                                and any(c.reason == "Unschedulable" for c in p.status.conditions)])
    assert "1 node(s) were unschedulable" in pending[0].status.conditions[0].message
    core.patch_node("gpu-a", {"spec": {"unschedulable": False}})
    wait_for(lambda: ready_replicas(apps, "chat") == 5, what="uncordon lets the pod schedule")


def test_readiness_probe_delay_and_not_ready_nodes(cluster):
    core, apps = cluster
    set_profiles(core, {"default": {"load_seconds": 1}})
    add_node(core, "gpu-a")
    dep = gpu_deployment("chat", 1)
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/health", "port": 8000}, "initialDelaySeconds": 60}
    apps.create_namespaced_deployment(NS, dep)
    started = time.monotonic()
    wait_for(lambda: ready_replicas(apps, "chat") == 1)
    assert time.monotonic() - started >= 0.55  # the probe's 60 s delay, not the profile's 1 s

    # A node that stops reporting Ready takes its pods out of service and gets no new ones.
    node = core.read_node_status("gpu-a")
    node.status.conditions[0].status = "False"
    core.replace_node_status("gpu-a", node)
    wait_for(lambda: ready_replicas(apps, "chat") == 0, what="pods not ready on a NotReady node")
    core.create_namespaced_pod(NS, {"metadata": {"name": "late"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    pod = wait_for(lambda: core.read_namespaced_pod("late", NS).status.conditions)
    assert "node.kubernetes.io/not-ready" in pod[0].message


def test_capacity_type_affinity_and_taints(cluster):
    core, apps = cluster
    spot_taint = {"key": "tideplane.io/spot", "value": "true", "effect": "NoSchedule"}
    add_node(core, "od-a", capacity_type="on-demand")
    add_node(core, "spot-a", capacity_type="spot", taints=[spot_taint])
    on_spot = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": NODE_CAPACITY_TYPE, "operator": "In", "values": ["spot"]}]}]}}}

    apps.create_namespaced_deployment(NS, gpu_deployment("batch", 1, affinity=on_spot))
    pod = wait_for(lambda: [p for p in pods_of(core, "batch") if p.status.conditions])[0]
    message = pod.status.conditions[0].message
    assert "untolerated taint {tideplane.io/spot: true}" in message
    assert "node(s) didn't match Pod's node affinity/selector" in message

    apps.patch_namespaced_deployment("batch", NS, {"spec": {"template": {"spec": {"tolerations": [
        {"key": "tideplane.io/spot", "operator": "Exists", "effect": "NoSchedule"}]}}}})
    wait_for(lambda: ready_replicas(apps, "batch") == 1 and len(pods_of(core, "batch")) == 1)
    assert pods_of(core, "batch")[0].spec.node_name == "spot-a"

    apps.create_namespaced_deployment(NS, gpu_deployment("chat", 2, node_selector={NODE_CAPACITY_TYPE: "on-demand"}))
    wait_for(lambda: ready_replicas(apps, "chat") == 2)
    assert {p.spec.node_name for p in pods_of(core, "chat")} == {"od-a"}

    # A NoExecute taint evicts pods that do not tolerate it; their deployment recreates them elsewhere.
    core.patch_node("spot-a", {"spec": {"taints": [spot_taint, {"key": "spot-reclaim", "effect": "NoExecute"}]}})
    wait_for(lambda: not [p for p in pods_of(core, "batch") if p.spec.node_name == "spot-a"], what="NoExecute eviction")


def test_label_and_field_selectors(cluster):
    core, _ = cluster
    for name, labels in [("a", {"tier": "gpu", "pool": "x"}), ("b", {"tier": "cpu"}), ("c", {"pool": "y"})]:
        core.create_namespaced_config_map(NS, {"metadata": {"name": name, "labels": labels}, "data": {"k": name}})

    def names(**kwargs) -> list[str]:
        return [c.metadata.name for c in core.list_namespaced_config_map(NS, **kwargs).items]

    assert names(label_selector="tier=gpu") == ["a"]
    assert names(label_selector="tier==cpu") == ["b"]
    assert names(label_selector="tier!=gpu") == ["b", "c"]
    assert names(label_selector="tier in (gpu, cpu)") == ["a", "b"]
    assert names(label_selector="tier notin (gpu)") == ["b", "c"]
    assert names(label_selector="pool") == ["a", "c"]
    assert names(label_selector="!pool") == ["b"]
    assert names(label_selector="tier=gpu,pool=x") == ["a"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.name!=b") == ["a", "c"]
    assert [c.metadata.name for c in core.list_config_map_for_all_namespaces(
        field_selector=f"metadata.namespace={NS}").items] == ["a", "b", "c"]

    add_node(core, "gpu-a")
    core.create_namespaced_pod(NS, {"metadata": {"name": "bound"}, "spec": {
        "containers": [{"name": "c", "image": "busybox"}]}})
    wait_for(lambda: core.read_namespaced_pod("bound", NS).status.phase == "Running")
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-a").items] == ["bound"]
    assert core.list_namespaced_pod(NS, field_selector="status.phase=Pending").items == []
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map(NS, label_selector="tier in gpu")
    assert err.value.status == 400


def test_errors_are_status_objects(cluster, kube_api):
    core, apps = cluster

    def status_of(call) -> tuple[int, dict]:
        with pytest.raises(ApiException) as err:
            call()
        return err.value.status, json.loads(err.value.body)

    code, body = status_of(lambda: core.read_namespaced_pod("nope", NS))
    assert code == 404 and body["reason"] == "NotFound" and body["status"] == "Failure" and body["kind"] == "Status"
    code, body = status_of(lambda: core.create_namespaced_config_map(NS, {"metadata": {}}))
    assert code == 422 and body["reason"] == "Invalid" and body["details"]["causes"][0]["field"] == "metadata.name"
    dep = gpu_deployment("chat", 1)
    dep["spec"]["replicas"] = -1
    code, body = status_of(lambda: apps.create_namespaced_deployment(NS, dep))
    assert code == 422 and "spec.replicas" in body["message"]
    dep = gpu_deployment("chat", 1)
    dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] = "lots"
    code, body = status_of(lambda: apps.create_namespaced_deployment(NS, dep))
    assert code == 422 and "nvidia.com/gpu" in body["details"]["causes"][0]["field"]
    code, body = status_of(lambda: core.create_namespaced_config_map(NS, {"kind": "Secret", "metadata": {"name": "x"}}))
    assert code == 422 and body["details"]["causes"][0]["field"] == "kind"
    code, body = status_of(lambda: core.create_namespaced_config_map("missing-ns", {"metadata": {"name": "x"}}))
    assert code == 404
    code, body = status_of(lambda: kube_api.rest_client.request(
        "POST", f"{kube_api.configuration.host}/api/v1/namespaces/{NS}/configmaps",
        headers={"Content-Type": "application/json"}, body="{not json"))
    assert code == 400 and body["reason"] == "BadRequest"


def test_patch_formats(cluster):
    _, apps = cluster
    dep = gpu_deployment("chat", 0)
    dep["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "envoy:1"})
    apps.create_namespaced_deployment(NS, dep)

    # strategic merge (the client's default for dicts): containers merge by name
    apps.patch_namespaced_deployment("chat", NS, {"metadata": {"labels": {"team": "ml"}}, "spec": {"template": {"spec": {
        "containers": [{"name": "vllm", "image": "vllm/vllm-openai:2.0.0"}]}}}})
    got = apps.read_namespaced_deployment("chat", NS)
    assert [(c.name, c.image) for c in got.spec.template.spec.containers] == [
        ("vllm", "vllm/vllm-openai:2.0.0"), ("sidecar", "envoy:1")]
    assert got.metadata.labels["team"] == "ml" and got.metadata.generation == 2

    # JSON merge patch: lists are replaced, null deletes
    apps.patch_namespaced_deployment("chat", NS, {"metadata": {"labels": {"team": None}}, "spec": {"template": {
        "spec": {"containers": [{"name": "only", "image": "x:1"}]}}}}, _content_type="application/merge-patch+json")
    got = apps.read_namespaced_deployment("chat", NS)
    assert [c.name for c in got.spec.template.spec.containers] == ["only"] and "team" not in got.metadata.labels

    # JSON patch (the client picks it for list bodies)
    apps.patch_namespaced_deployment("chat", NS, [
        {"op": "replace", "path": "/spec/replicas", "value": 0},
        {"op": "add", "path": "/metadata/annotations", "value": {"tideplane.io/stage": "canary"}},
        {"op": "add", "path": "/metadata/labels/app.kubernetes.io~1version", "value": "2.0.0"},
    ])
    got = apps.read_namespaced_deployment("chat", NS)
    assert got.metadata.annotations["tideplane.io/stage"] == "canary"  # (the controller adds its revision)
    assert got.metadata.labels["app.kubernetes.io/version"] == "2.0.0"
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment("chat", NS, [{"op": "test", "path": "/spec/replicas", "value": 9}])
    assert err.value.status == 422


def test_rolling_update_replaces_pods_and_deletes_cascade(cluster):
    core, apps = cluster
    add_node(core, "gpu-a", gpus=8)
    apps.create_namespaced_deployment(NS, gpu_deployment("chat", 3))
    wait_for(lambda: ready_replicas(apps, "chat") == 3)
    old = {p.metadata.name for p in pods_of(core, "chat")}
    apps.patch_namespaced_deployment("chat", NS, {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "image": "vllm/vllm-openai:1.1.0"}]}}}})

    def rolled() -> bool:
        dep = apps.read_namespaced_deployment("chat", NS)
        pods = pods_of(core, "chat")
        return (dep.status.observed_generation == 2 and dep.status.updated_replicas == 3
                and (dep.status.ready_replicas or 0) == 3 and len(pods) == 3 and not old & {p.metadata.name for p in pods})

    wait_for(rolled, what="rollout to the new template")
    assert {p.spec.containers[0].image for p in pods_of(core, "chat")} == {"vllm/vllm-openai:1.1.0"}

    apps.delete_namespaced_deployment("chat", NS)
    wait_for(lambda: not pods_of(core, "chat"), what="pods deleted with their deployment")
    core.create_namespaced_config_map(NS, {"metadata": {"name": "x"}})
    core.delete_namespace(NS)

    def gone() -> bool:
        try:
            core.read_namespaced_config_map("x", NS)
        except ApiException as err:
            return err.status == 404
        return False

    wait_for(gone, what="the namespace controller to empty the Terminating namespace")


def test_httproute_crud_with_weights(kube_api, cluster):
    custom = client.CustomObjectsApi(kube_api)
    args = ("gateway.networking.k8s.io", "v1", NS, "httproutes")
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "chat"},
             "spec": {"parentRefs": [{"name": "gateway"}], "rules": [{"backendRefs": [
                 {"name": "chat-v1-0-0", "port": 8000, "weight": 100}]}]}}
    created = custom.create_namespaced_custom_object(*args, route)
    assert created["metadata"]["generation"] == 1

    route = custom.get_namespaced_custom_object(*args, "chat")
    route["spec"]["rules"][0]["backendRefs"] = [{"name": "chat-v1-0-0", "port": 8000, "weight": 95},
                                                {"name": "chat-v1-1-0", "port": 8000, "weight": 5}]
    replaced = custom.replace_namespaced_custom_object(*args, "chat", route)
    assert replaced["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as err:
        custom.replace_namespaced_custom_object(*args, "chat", route)  # route's resourceVersion is now stale
    assert err.value.status == 409

    patched = custom.patch_namespaced_custom_object(*args, "chat", [
        {"op": "replace", "path": "/spec/rules/0/backendRefs/1/weight", "value": 50},
        {"op": "replace", "path": "/spec/rules/0/backendRefs/0/weight", "value": 50}],
        _content_type="application/json-patch+json")
    assert [b["weight"] for b in patched["spec"]["rules"][0]["backendRefs"]] == [50, 50]
    merged = custom.patch_namespaced_custom_object(*args, "chat", {"metadata": {"labels": {"stage": "canary"}}})
    assert merged["metadata"]["labels"] == {"stage": "canary"} and merged["metadata"]["generation"] == 3
    listed = custom.list_cluster_custom_object("gateway.networking.k8s.io", "v1", "httproutes")
    assert [r["metadata"]["name"] for r in listed["items"]] == ["chat"]
    custom.delete_namespaced_custom_object(*args, "chat")
    assert custom.list_namespaced_custom_object(*args)["items"] == []


def test_fault_injection(kube_api):
    core = client.CoreV1Api(kube_api)
    url = f"{kube_api.configuration.host}/sandbox/faults"

    def put(settings: dict) -> dict:
        request = urllib.request.Request(url, data=json.dumps(settings).encode(), method="PUT",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as response:
            return json.loads(response.read())

    assert put({"rate": 1.0, "kinds": ["500"]})["rate"] == 1.0
    with pytest.raises(ApiException) as err:
        core.list_namespace()
    assert err.value.status == 500
    put({"rate": 1.0, "kinds": ["409"], "methods": ["POST"]})
    assert core.list_namespace().items  # GETs are spared
    with pytest.raises(ApiException) as err:
        core.create_namespace({"metadata": {"name": "x"}})
    assert err.value.status == 409
    put({"rate": 1.0, "kinds": ["delay"], "delay_seconds": 0.3})
    started = time.monotonic()
    core.list_namespace()
    assert time.monotonic() - started >= 0.3
    put({"rate": 0})
    core.create_namespace({"metadata": {"name": "x"}})


def test_kubectl_works_unchanged(cluster, kube_kubeconfig, tmp_path):
    core, _ = cluster
    add_node(core, "gpu-a", capacity_type="spot")
    add_node(core, "gpu-b")

    def kubectl(*args: str) -> str:
        done = subprocess.run(["kubectl", "--kubeconfig", str(kube_kubeconfig), *args],
                              capture_output=True, text=True, timeout=30, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr
        return done.stdout

    nodes = kubectl("get", "nodes").splitlines()
    assert nodes[0].split()[:2] == ["NAME", "STATUS"]
    assert [line.split()[:2] for line in nodes[1:]] == [["gpu-a", "Ready"], ["gpu-b", "Ready"]]
    manifest = tmp_path / "deploy.yaml"
    manifest.write_text(json.dumps(gpu_deployment("web", 1)))
    assert "created" in kubectl("apply", "-f", str(manifest))
    changed = gpu_deployment("web", 1)  # a new image; the selector stays (it is immutable)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:1.1.0"
    manifest.write_text(json.dumps(changed))
    assert "configured" in kubectl("apply", "-f", str(manifest))  # a three-way strategic merge patch
    kubectl("scale", "deployment/web", "-n", NS, "--replicas=2")
    kubectl("rollout", "status", "deployment/web", "-n", NS, "--timeout=20s")
    assert kubectl("get", "deploy", "-n", NS).splitlines()[1].split()[:4] == ["web", "2/2", "2", "2"]
    assert "cordoned" in kubectl("cordon", "gpu-a")
    assert "SchedulingDisabled" in kubectl("get", "node", "gpu-a")
    pods = kubectl("get", "pods", "-A").splitlines()
    assert len(pods) == 3 and all("Running" in line for line in pods[1:])
