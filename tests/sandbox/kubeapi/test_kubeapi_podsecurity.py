"""Pod Security admission as the API server applies it: a namespace's enforce level refuses a pod
that violates it (403, the same message), a Deployment's pods with a FailedCreate event; warn and
audit levels give Warning headers. And the levels docs/getting-started.md ("Pod Security levels")
gives for tideplane's own pods, checked against the emulator's checks and its admission under the
serving-namespace kit's labels.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from activities.clients.kube import KubeClient
from activities.node_cache.node_cache_activities import NodeCacheActivities
from activities.rollout.serving_pods import ServingPods, deployment_manifest
from infra.sandbox.kubeapi.podsecurity import violations
from infra.sandbox.worker_identity import enable_serving_namespace
from tests.kube_fixtures import emulated_cluster, kube_wait as wait
from workers.config import Settings
from workers.worker import serving_pods
from workflows.core.naming import NODE_POOL, DeploymentRef
from workflows.core.versions import WeightFile
from workflows.node_cache.contract import NodeCacheRequest, StartNodeCacheInput
from workflows.rollout.contract import EnsureVersionInput

ROOT = Path(__file__).resolve().parents[3]
FILES = [WeightFile(uri="s3://weights/m/1.0.0/model.safetensors", sha256="a" * 64)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(tmp_path_factory.mktemp("kubectl")) as cluster:
        client.CoreV1Api(cluster.api).create_node({"metadata": {"name": "n"}, "status": {"allocatable": {"pods": "110"}}})
        yield cluster


def namespace(cluster, name: str, **levels: str) -> str:
    labels = {f"pod-security.kubernetes.io/{mode}": level for mode, level in levels.items()}
    client.CoreV1Api(cluster.api).create_namespace({"metadata": {"name": name, "labels": labels}})
    return name


PLAIN = {"containers": [{"name": "app", "image": "nginx:1"}]}
HOSTPATH = {"containers": [{"name": "app", "image": "nginx:1"}], "volumes": [{"name": "data", "hostPath": {"path": "/data"}}]}
RESTRICTED = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
              "containers": [{"name": "app", "image": "nginx:1", "securityContext": {
                  "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}


def post(cluster, path: str, body: dict) -> tuple[int, dict, list[str]]:
    request = urllib.request.Request(cluster.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.load(response), response.headers.get_all("Warning") or []
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc), exc.headers.get_all("Warning") or []


def test_restricted_enforce_refuses_a_pod_that_violates_it_with_the_api_servers_message(cluster):
    ns = namespace(cluster, "psa-restricted", enforce="restricted")
    code, status, _ = post(cluster, f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": "web"}, "spec": PLAIN})
    assert code == 403 and status["reason"] == "Forbidden"
    assert status["message"] == (
        'pods "web" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
        '(container "app" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
        '(container "app" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container '
        '"app" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "app" must set '
        'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    code, _, _ = post(cluster, f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": "ok"}, "spec": RESTRICTED})
    assert code == 201


def test_baseline_refuses_hostpath_and_privileged_only(cluster):
    ns = namespace(cluster, "psa-baseline", enforce="baseline")
    assert post(cluster, f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": "plain"}, "spec": PLAIN})[0] == 201
    code, status, _ = post(cluster, f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": "disk"}, "spec": HOSTPATH})
    assert (code, status["message"]) == (403, 'pods "disk" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "data")')


def test_a_deployments_refused_pods_are_a_failed_create_event_and_warn_gives_headers(cluster):
    ns = namespace(cluster, "psa-deploy", enforce="restricted", warn="restricted")
    body = {"metadata": {"name": "web"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": PLAIN}}}
    code, _, warnings = post(cluster, f"/apis/apps/v1/namespaces/{ns}/deployments", body)
    assert code == 201, "the workload itself is admitted"
    assert warnings and warnings[0].startswith('299 - "would violate PodSecurity \\"restricted:latest\\": allowPrivilegeEscalation != false')
    core = client.CoreV1Api(cluster.api)

    def refused():
        return [e for e in core.list_namespaced_event(ns).items if e.reason == "FailedCreate"]

    [event] = wait(refused, "the ReplicaSet's FailedCreate")
    assert event.involved_object.kind == "ReplicaSet"
    assert 'is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false' in event.message
    assert not core.list_namespaced_pod(ns).items


def test_kubectl_prints_the_warning(cluster):
    ns = namespace(cluster, "psa-warn", warn="baseline")
    manifest = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "disk", "namespace": ns}, "spec": HOSTPATH})
    tmp = Path("/tmp") / f"psa-warn-{cluster.url.rsplit(':', 1)[-1]}.json"
    tmp.write_text(manifest)
    try:
        result = cluster.kubectl("create", "-f", str(tmp))
    finally:
        tmp.unlink()
    assert result.returncode == 0, result.stderr
    assert 'Warning: would violate PodSecurity "baseline:latest": hostPath volumes (volume "data")' in result.stderr


# -- the levels tideplane's pods meet (the table in docs/getting-started.md) --------------------------

DEFAULT = serving_pods(Settings.model_validate({}))  # the worker's defaults: model and engine cache on claims
KIT_LABELS = yaml.safe_load((ROOT / "infra/k8s/serving-namespace/namespace.yaml").read_text())["metadata"]["labels"]


def serving_spec(pods: ServingPods, **extra) -> dict:
    req = EnsureVersionInput(deployment=DeploymentRef(namespace="x", name="chat"), model="m", version="1.0.0", image="vllm:1",
                             gpus_per_replica=1, replicas=1, weights_path="/models/m/1.0.0", **extra)
    return deployment_manifest(req, pods)["spec"]["template"]["spec"]


def strictest(spec: dict) -> str:
    return next((level for level in ("restricted", "baseline") if not violations(spec, level)), "privileged")


def staging_job_spec() -> dict:
    job = NodeCacheActivities(kube=None, image="tideplane:1", cache_dir=Path("/node-cache"))._job(
        StartNodeCacheInput(namespace="x", model="m", version="1.0.0", files=FILES, run_id="r", image="vllm:1"), "n",
        NodeCacheRequest(model="m", version="1.0.0", files=FILES, node="n", stagers=["n"]))
    return job["spec"]["template"]["spec"]


def test_the_levels_tideplanes_pods_meet_are_the_documented_ones():
    assert DEFAULT.engine_cache_dir is not None and DEFAULT.engine_cache_pvc and DEFAULT.model_cache_pvc, "caches on by default"
    assert strictest(serving_spec(DEFAULT)) == "restricted"
    assert strictest(serving_spec(replace(DEFAULT, engine_cache_dir=None))) == "restricted"  # no cache
    host_model_cache = replace(DEFAULT, model_cache_pvc=None)  # TIDEPLANE_MODEL_CACHE_PVC=""
    assert violations(serving_spec(host_model_cache), "baseline") == ['hostPath volumes (volume "model-cache")']
    host_engine_cache = replace(DEFAULT, engine_cache_pvc=None)  # TIDEPLANE_ENGINE_CACHE_PVC=""
    assert violations(serving_spec(host_engine_cache), "baseline") == ['hostPath volumes (volume "engine-cache")']
    assert violations(serving_spec(DEFAULT, node_cache_files=FILES), "baseline") == [
        'hostPath volumes (volumes "node-cache", "node-cache-version")']
    # the staging Job's pod is restricted but for the node cache's hostPath
    assert violations(staging_job_spec(), "restricted") == [
        'hostPath volumes (volume "node-cache")', 'restricted volume types (volume "node-cache" uses restricted volume type "hostPath")']
    daemonset = next(d for d in yaml.safe_load_all((ROOT / "infra/k8s/node-cache/daemonset.yaml").read_text())
                     if d and d.get("kind") == "DaemonSet")
    assert violations(daemonset["spec"]["template"]["spec"], "baseline") == [
        'hostPath volumes (volume "node-cache")', 'hostPort (container "chunks" uses hostPort 8470)']


def test_the_serving_namespace_kit_enforces_baseline_and_warns_at_restricted():
    assert KIT_LABELS["pod-security.kubernetes.io/enforce"] == "baseline"
    assert KIT_LABELS["pod-security.kubernetes.io/warn"] == KIT_LABELS["pod-security.kubernetes.io/audit"] == "restricted"
    component = yaml.safe_load((ROOT / "infra/k8s/serving-namespace/node-cache/kustomization.yaml").read_text())
    [patch] = yaml.safe_load(component["patches"][0]["patch"])
    assert (patch["path"], patch["value"]) == ("/metadata/labels/pod-security.kubernetes.io~1enforce", "privileged")


def kit_namespace(cluster, name: str, enforce: str) -> str:
    client.CoreV1Api(cluster.api).create_namespace(
        {"metadata": {"name": name, "labels": KIT_LABELS | {"pod-security.kubernetes.io/enforce": enforce}}})
    return name


def test_the_api_servers_admission_takes_the_default_serving_pod_and_refuses_a_host_path_cache(cluster):
    ns = kit_namespace(cluster, "psa-kit", "baseline")
    code, _, warnings = post(cluster, f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": "cached"}, "spec": serving_spec(DEFAULT)})
    assert (code, warnings) == (201, []), "caches on: admitted under enforce baseline, no restricted warning"
    code, status, _ = post(cluster, f"/api/v1/namespaces/{ns}/pods",
                           {"metadata": {"name": "host-cache"}, "spec": serving_spec(replace(DEFAULT, engine_cache_pvc=None))})
    assert (code, status["message"]) == (
        403, 'pods "host-cache" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "engine-cache")')
    strict = kit_namespace(cluster, "psa-kit-restricted", "restricted")
    for name, pods in (("uncached", replace(DEFAULT, engine_cache_dir=None)), ("cached", DEFAULT)):
        code, _, warnings = post(cluster, f"/api/v1/namespaces/{strict}/pods", {"metadata": {"name": name}, "spec": serving_spec(pods)})
        assert (code, warnings) == (201, []), f"{name}: admitted under enforce restricted"


def test_a_staging_job_in_a_namespace_with_the_node_cache_component_runs_and_baseline_refuses_its_pod(cluster):
    job = {"metadata": {"name": "stage"}, "spec": {"template": {"spec": staging_job_spec()}}}
    for ns, expected in ((kit_namespace(cluster, "psa-stage", "baseline"), "refused"),
                         (kit_namespace(cluster, "psa-stage-node-cache", "privileged"), "created")):
        assert post(cluster, f"/apis/batch/v1/namespaces/{ns}/jobs", job)[0] == 201
        core = client.CoreV1Api(cluster.api)
        if expected == "refused":
            [event] = wait(lambda: [e for e in core.list_namespaced_event(ns).items if e.reason == "FailedCreate"], "FailedCreate")
            assert 'violates PodSecurity "baseline:latest": hostPath volumes (volume "node-cache")' in event.message
        else:
            wait(lambda: core.list_namespaced_pod(ns).items, "the staging pod")


def test_pre_staging_in_a_baseline_namespace_fails_the_node_at_once_saying_why(cluster):
    ns = kit_namespace(cluster, "psa-prestage", "baseline")
    client.CoreV1Api(cluster.api).create_node({"metadata": {"name": "gpu-p", "labels": {NODE_POOL: "p"}}, "spec": {}, "status": {
        "allocatable": {"pods": "110"}, "conditions": [{"type": "Ready", "status": "True"}]}})
    staging = NodeCacheActivities(KubeClient(cluster.api), image="tideplane:1", cache_dir=Path("/node-cache"))
    req = StartNodeCacheInput(namespace=ns, model="m", version="1.0.0", files=FILES, run_id="r", pool="p")
    staging.start_node_staging(req)
    [node] = wait(lambda: [n for n in staging.node_staging_status(req).nodes if n.state == "failed"], "the node failed")
    assert node.node == "gpu-p" and 'violates PodSecurity "baseline:latest": hostPath volumes (volume "node-cache")' in node.message
    assert node.message.endswith("(a namespace that pre-stages needs enforce privileged: infra/k8s/serving-namespace/node-cache)")


def test_the_sandbox_enables_serving_namespaces_with_the_kits_pod_security_levels(cluster):
    enable_serving_namespace(cluster.api, "psa-sandbox")
    enable_serving_namespace(cluster.api, "psa-sandbox-prestage", enforce="privileged")
    core = client.CoreV1Api(cluster.api)
    assert core.read_namespace("psa-sandbox").metadata.labels == KIT_LABELS
    assert core.read_namespace("psa-sandbox-prestage").metadata.labels == KIT_LABELS | {"pod-security.kubernetes.io/enforce": "privileged"}
    code, status, _ = post(cluster, "/api/v1/namespaces/psa-sandbox/pods", {"metadata": {"name": "disk"}, "spec": HOSTPATH})
    assert code == 403 and 'violates PodSecurity "baseline:latest"' in status["message"]
