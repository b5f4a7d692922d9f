"""The rollout's Kubernetes activities (and warm_up) against the sandbox's API emulator and fleet simulator.

Both run as their own processes on free ports; RolloutActivities reaches them through a
KubeClient built from a kubeconfig and a service URL template, exactly as a worker would reach a
real cluster.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment

from activities.clients.kube import CONFLICT_RETRIES, apply_service, retry_on_conflict, serving_namespace
from activities.core.deployments import ROUTE_API
from activities.rollout.rollout_activities import RolloutActivities
from infra.sandbox.config import NodePool
from infra.sandbox.kubeclient import api_client as sandbox_client
from infra.sandbox.kubeclient import kubeconfig_yaml
from infra.sandbox.nodes import Instance, node_manifest
from infra.sandbox.ports import free_port, wait_for_port
from workflows.core import naming
from workflows.core.naming import DeploymentRef
from workflows.rollout.contract import (
    EnsureVersionInput,
    RouteWeightsInput,
    ScaleVersionInput,
    WaitReadyInput,
    WarmUpInput,
)

NS = "llm-serving"
TIME_SCALE = 30  # the default 30 s model load takes 1 s
CACHE = "/var/cache/tideplane/models"
GPU_TAINT = {"key": naming.GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


def _start(args: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, timeout=20)
    except TimeoutError:
        proc.kill()
        raise
    return proc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Emulator with one tainted 4-GPU node and the llm-serving namespace, plus the fleet simulator."""
    kube_port, fleet_port = free_port(), free_port()
    url = f"http://127.0.0.1:{kube_port}"
    procs = [_start(["infra.sandbox.kubeapi", "--host", "127.0.0.1", "--port", str(kube_port), "--time-scale", str(TIME_SCALE)], kube_port)]
    try:
        procs.append(_start(["infra.sandbox.fleet_simulator", "--kube-url", url, "--port", str(fleet_port), "--time-scale", str(TIME_SCALE), "--tick", "0.2"], fleet_port))
        core = client.CoreV1Api(sandbox_client(url))
        core.create_namespace(serving_namespace(NS))
        pool = NodePool(name="gpu", count=1, capacity_type="on-demand", gpus=4, taints=[GPU_TAINT])
        node = Instance("i-0123456789abcdef0", "gpu", "us-east-1a", "p5.48xlarge", "ip-10-0-0-1.ec2.internal", "10.0.0.1", "running")
        core.create_node(node_manifest(node, pool))
        kubeconfig = tmp_path_factory.mktemp("kube") / "kubeconfig"
        kubeconfig.write_text(kubeconfig_yaml(url))
        yield {"kubeconfig": str(kubeconfig), "fleet": f"http://127.0.0.1:{fleet_port}", "url": url}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


@pytest.fixture(scope="module")
def rollout(cluster, make_rollout) -> RolloutActivities:
    """The rollout activities pointed at this cluster and its fleet simulator's Services."""
    return make_rollout(
        kubeconfig=cluster["kubeconfig"],
        model_cache_dir=Path(CACHE),
        gateway="gateways/inference-gateway",
        service_url_template=cluster["fleet"] + "/proxy/{namespace}/{service}",
    )


def _ref(name: str) -> DeploymentRef:
    return DeploymentRef(namespace=NS, name=name)


def _version(name: str, version: str, replicas: int = 1, gpus: int = 1, **extra) -> EnsureVersionInput:
    return EnsureVersionInput(
        deployment=_ref(name),
        model="llama-3-8b",
        version=version,
        image="vllm/vllm-openai:v0.8.5",
        gpus_per_replica=gpus,
        replicas=replicas,
        weights_path=f"{CACHE}/llama-3-8b/{version}",
        **extra,
    )


def _run(fn, arg, heartbeats: list | None = None, env: ActivityEnvironment | None = None):
    env = env or ActivityEnvironment()
    if heartbeats is not None:
        env.on_heartbeat = lambda *d: heartbeats.append(d[0])
    return env.run(fn, arg)


def _route(rollout: RolloutActivities, name: str) -> dict:
    return rollout.kube.custom.get_namespaced_custom_object(*ROUTE_API, NS, "httproutes", name)


def _backends(rollout: RolloutActivities, name: str) -> dict[str, int]:
    return {b["name"]: b["weight"] for b in _route(rollout, name)["spec"]["rules"][0]["backendRefs"]}


def test_first_deploy_then_canary_and_promote(rollout):
    ref = _ref("chat")
    state = _run(rollout.describe_deployment, ref)
    assert not state.route_exists and state.versions == [] and state.stable is None

    # Start the stable version; applying it twice changes nothing and duplicates nothing.
    stable = _version("chat", "1.2.0", replicas=2, env={"VLLM_LOGGING_LEVEL": "INFO"})
    _run(rollout.ensure_version, stable)
    apps, core = rollout.kube.apps, rollout.kube.core
    generation = apps.read_namespaced_deployment("chat-v1-2-0", NS).metadata.generation
    _run(rollout.ensure_version, stable)
    assert apps.read_namespaced_deployment("chat-v1-2-0", NS).metadata.generation == generation
    selector = f"{naming.LABEL_APP}=chat"
    assert [d.metadata.name for d in apps.list_namespaced_deployment(NS, label_selector=selector).items] == ["chat-v1-2-0"]
    assert [s.metadata.name for s in core.list_namespaced_service(NS, label_selector=selector).items] == ["chat-v1-2-0"]

    beats: list = []
    ready = _run(rollout.wait_ready, WaitReadyInput(deployment=ref, version="1.2.0", replicas=2, poll_seconds=0.2), beats)
    assert ready.ready_replicas == 2 and 0 < ready.seconds < 15
    assert beats and beats[0]["desired"] == 2 and beats[0]["ready"] < 2

    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.2.0": 100}))
    route = _route(rollout, "chat")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway", "namespace": "gateways"}]
    assert route["metadata"]["labels"][naming.LABEL_APP] == "chat"
    assert _backends(rollout, "chat") == {"chat-v1-2-0": 100}

    # The canary joins at weight 0, then takes 5 %.
    _run(rollout.ensure_version, _version("chat", "1.3.0", replicas=1))
    _run(rollout.wait_ready, WaitReadyInput(deployment=ref, version="1.3.0", replicas=1, poll_seconds=0.2))
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.2.0": 100, "1.3.0": 0}))
    assert _backends(rollout, "chat") == {"chat-v1-2-0": 100, "chat-v1-3-0": 0}
    rv = _route(rollout, "chat")["metadata"]["resourceVersion"]
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.2.0": 100, "1.3.0": 0}))
    assert _route(rollout, "chat")["metadata"]["resourceVersion"] == rv  # idempotent: no write at all

    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.2.0": 95, "1.3.0": 5}))
    state = _run(rollout.describe_deployment, ref)
    assert state.route_exists and state.stable.version == "1.2.0"
    by_version = {v.version: v for v in state.versions}
    assert by_version["1.2.0"].replicas == 2 and by_version["1.2.0"].ready_replicas == 2
    assert by_version["1.3.0"].route_weight == 5 and by_version["1.3.0"].model == "llama-3-8b"

    # Promote: traffic first, then the old version scales down through the scale subresource.
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.2.0": 0, "1.3.0": 100}))
    _run(rollout.scale_version, ScaleVersionInput(deployment=ref, version="1.2.0", replicas=0))
    assert apps.read_namespaced_deployment_scale("chat-v1-2-0", NS).spec.replicas == 0
    state = _run(rollout.describe_deployment, ref)
    assert state.stable.version == "1.3.0"
    assert {v.version: (v.replicas, v.route_weight) for v in state.versions} == {"1.2.0": (0, 0), "1.3.0": (1, 100)}


def test_deployment_serves_the_staged_weights_read_only_on_gpus(rollout):
    _run(rollout.ensure_version, _version("embed", "2.0.0", gpus=2, args=["--max-model-len", "8192"], env={"OTEL_SERVICE_NAME": "custom"}))
    dep = rollout.kube.apps.read_namespaced_deployment("embed-v2-0-0", NS)
    pod = dep.spec.template
    assert pod.metadata.labels == {
        naming.LABEL_APP: "embed",
        naming.LABEL_VERSION: "2.0.0",
        naming.LABEL_MODEL: "llama-3-8b",
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
        naming.LABEL_CLASS: "realtime",  # the default priority class
    }
    (container,) = pod.spec.containers
    assert container.args[:2] == ["--model", f"{CACHE}/llama-3-8b/2.0.0"] and container.args[-2:] == ["--max-model-len", "8192"]
    assert container.resources.limits == {naming.GPU_RESOURCE: "2"}
    assert container.readiness_probe.http_get.path == "/health"
    (mount,) = container.volume_mounts
    assert mount.mount_path == CACHE and mount.read_only
    (volume,) = pod.spec.volumes
    assert volume.name == mount.name and volume.host_path is None  # the model cache's claim by default, no hostPath
    assert volume.persistent_volume_claim.claim_name == naming.MODEL_CACHE_CLAIM and volume.persistent_volume_claim.read_only
    env = {e.name: e.value for e in container.env}
    assert env["OTEL_SERVICE_NAME"] == "custom" and "service.version=2.0.0" in env["OTEL_RESOURCE_ATTRIBUTES"]
    service = rollout.kube.core.read_namespaced_service("embed-v2-0-0", NS)
    assert service.spec.selector == {naming.LABEL_APP: "embed", naming.LABEL_VERSION: "2.0.0"}


def test_route_keeps_its_matches_and_rejects_bad_weights(rollout):
    ref = _ref("rag")
    _run(rollout.ensure_version, _version("rag", "1.0.0", gpus=0))
    routes = rollout.kube.custom
    chat_only = [{"path": {"type": "Exact", "value": "/v1/chat/completions"}}]
    rule = {"matches": chat_only, "backendRefs": [{"name": "old", "port": 8000, "weight": 100}]}
    routes.create_namespaced_custom_object(*ROUTE_API, NS, "httproutes", {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "rag"}, "spec": {"parentRefs": [{"name": "edge"}], "rules": [rule]},
    })
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 100}))
    route = _route(rollout, "rag")
    assert route["spec"]["rules"][0]["matches"] == chat_only and route["spec"]["parentRefs"] == [{"name": "edge"}]
    # matches that let more than the inference paths through (vLLM's admin endpoints) are closed
    route["spec"]["rules"][0]["matches"] = [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    routes.replace_namespaced_custom_object(*ROUTE_API, NS, "httproutes", "rag", route)
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 100}))
    assert [m["path"]["value"] for m in _route(rollout, "rag")["spec"]["rules"][0]["matches"]] == [
        "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/models"]
    assert _backends(rollout, "rag") == {"rag-v1-0-0": 100}

    for weights in ({"1.0.0": 60}, {"1.0.0": 120, "0.9.0": -20}, {}):
        with pytest.raises(ApplicationError) as err:
            _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights=weights))
        assert err.value.non_retryable and "sum to 100" in str(err.value)
    with pytest.raises(ApplicationError) as err:
        _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 50, "4.0.0": 50}))
    assert err.value.non_retryable and "rag-v4-0-0" in str(err.value)
    assert _backends(rollout, "rag") == {"rag-v1-0-0": 100}


def _calls_in(rollout: RolloutActivities, ref: DeploymentRef) -> list[tuple]:
    """Every rollout activity that reads or changes ``ref``'s namespace, with a valid input."""
    return [
        (rollout.describe_deployment, ref),
        (rollout.ensure_version, _version(ref.name, "1.0.0").model_copy(update={"deployment": ref})),
        (rollout.scale_version, ScaleVersionInput(deployment=ref, version="1.0.0", replicas=1)),
        (rollout.wait_ready, WaitReadyInput(deployment=ref, version="1.0.0", replicas=1)),
        (rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 100})),
    ]


def test_a_namespace_the_operator_did_not_enable_is_refused(rollout):
    """kube-system exists but lacks the tideplane.io/serving label: nothing is read or written there."""
    for fn, arg in _calls_in(rollout, DeploymentRef(namespace="kube-system", name="evil")):
        with pytest.raises(ApplicationError) as err:
            _run(fn, arg)
        assert err.value.non_retryable and err.value.type == "NamespaceNotEnabled", fn.__name__
        assert "namespace 'kube-system' is not enabled" in str(err.value) and "tideplane.io/serving=true" in str(err.value)
    assert rollout.kube.apps.list_namespaced_deployment("kube-system").items == []


def test_an_image_from_another_registry_is_refused_before_anything_is_created(cluster, make_rollout):
    strict = make_rollout(kubeconfig=cluster["kubeconfig"], model_cache_dir=Path(CACHE), image_prefixes=["registry.example.com/ml/"])
    with pytest.raises(ApplicationError) as err:
        _run(strict.ensure_version, _version("elsewhere", "1.0.0"))
    assert err.value.non_retryable and err.value.type == "ImageNotAllowed"
    assert "'vllm/vllm-openai:v0.8.5' is not from an allowed registry" in str(err.value)
    assert "registry.example.com/ml/" in str(err.value)
    assert strict.kube.apps.list_namespaced_deployment(NS, label_selector=f"{naming.LABEL_APP}=elsewhere").items == []


def test_unknown_namespace_and_missing_version_are_non_retryable(rollout):
    for fn, arg in _calls_in(rollout, DeploymentRef(namespace="no-such-ns", name="chat")):
        with pytest.raises(ApplicationError) as err:
            _run(fn, arg)
        assert err.value.non_retryable and "no-such-ns" in str(err.value), fn.__name__
    for fn, arg in [
        (rollout.scale_version, ScaleVersionInput(deployment=_ref("chat"), version="9.9.9", replicas=1)),
        (rollout.wait_ready, WaitReadyInput(deployment=_ref("chat"), version="9.9.9", replicas=1)),
    ]:
        with pytest.raises(ApplicationError) as err:
            _run(fn, arg)
        assert err.value.non_retryable and "chat-v9-9-9" in str(err.value)
    with pytest.raises(ApplicationError) as err:
        _run(rollout.ensure_version, _version("chat", "1.0.0").model_copy(update={"weights_path": "/tmp/weights"}))
    assert err.value.non_retryable and "/tmp/weights" in str(err.value)


def test_wait_ready_reports_unschedulable_pods_and_is_cancellable(rollout):
    ref = _ref("huge")
    _run(rollout.ensure_version, _version("huge", "1.0.0", replicas=1, gpus=8))  # the only node has 4
    env = ActivityEnvironment()
    beats: list = []
    env.on_heartbeat = lambda *d: beats.append(d[0])
    # A retried attempt keeps the first attempt's start (from its heartbeat) for the cold-start time.
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[{"started_at": time.time() - 100}])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(env.run, rollout.wait_ready, WaitReadyInput(deployment=ref, version="1.0.0", replicas=1, poll_seconds=0.1))
        deadline = time.monotonic() + 15
        while not any("Unschedulable" in w for b in beats for w in b["waiting"]):
            assert time.monotonic() < deadline, beats[-1:]
            time.sleep(0.1)
        assert beats[-1]["started_at"] < time.time() - 99
        env.cancel()
        with pytest.raises(CancelledError):
            fut.result(timeout=10)
    assert any("nvidia.com/gpu" in w for w in beats[-1]["waiting"])


def test_warm_up_benchmarks_the_new_version_through_its_service(rollout):
    ref = _ref("bench")
    _run(rollout.ensure_version, _version("bench", "1.0.0", replicas=1))
    _run(rollout.wait_ready, WaitReadyInput(deployment=ref, version="1.0.0", replicas=1, poll_seconds=0.2))
    beats: list = []
    deadline = time.monotonic() + 10
    while True:  # the fleet simulator notices the Ready pod on its next tick
        try:
            result = _run(rollout.warm_up, WarmUpInput(deployment=ref, version="1.0.0", requests=8, max_tokens=16, model="llama-3-8b"), beats)
            break
        except ApplicationError:
            assert time.monotonic() < deadline
            time.sleep(0.3)
    assert result.requests == 8 and result.errors <= 2
    assert result.tokens_per_second > 0 and 0 < result.p50_latency_seconds <= result.p99_latency_seconds
    assert beats[-1]["done"] == 8

    with pytest.raises(ApplicationError) as err:  # no Ready pod behind that Service: every request fails
        _run(rollout.warm_up, WarmUpInput(deployment=ref, version="7.0.0", requests=2))
    assert not err.value.non_retryable and "bench-v7-0-0" in str(err.value)


def test_versions_differing_in_punctuation_get_their_own_objects(rollout):
    """Issue 20 defect 1: 1.3.0-rc.1 (stable) and 1.3.0-rc-1 once shared one name, and the second
    overwrote the stable Deployment and listed one backend twice in the route."""
    ref = _ref("punct")
    stable, new = "1.3.0-rc.1", "1.3.0-rc-1"
    _run(rollout.ensure_version, _version("punct", stable, replicas=1))
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={stable: 100}))
    _run(rollout.ensure_version, _version("punct", new, replicas=1).model_copy(update={"image": "vllm/vllm-openai:v0.9.0"}))
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={stable: 100, new: 0}))

    apps = rollout.kube.apps
    deployments = apps.list_namespaced_deployment(NS, label_selector=f"{naming.LABEL_APP}=punct").items
    held = {d.metadata.labels[naming.LABEL_VERSION]: d for d in deployments}
    assert sorted(held) == sorted([stable, new]) and len({d.metadata.name for d in deployments}) == 2
    assert held[stable].spec.template.spec.containers[0].image == "vllm/vllm-openai:v0.8.5"  # untouched
    backends = _backends(rollout, "punct")
    assert backends == {ref.versioned(stable): 100, ref.versioned(new): 0}
    state = _run(rollout.describe_deployment, ref)
    assert state.stable.version == stable and state.stable.replicas == 1


def test_ensure_version_never_rewrites_another_versions_deployment(rollout):
    """A Deployment whose name a version maps to but that serves another version is refused, named."""
    ref = _ref("taken")
    _run(rollout.ensure_version, _version("taken", "2.0.0"))
    apps = rollout.kube.apps
    apps.patch_namespaced_deployment(ref.versioned("2.0.0"), NS, {"metadata": {"labels": {naming.LABEL_VERSION: "2-0-0"}}})
    with pytest.raises(ApplicationError, match=r"version 2.0.0: Deployment llm-serving/taken-v2-0-0 already serves version 2-0-0") as err:
        _run(rollout.ensure_version, _version("taken", "2.0.0"))
    assert err.value.non_retryable


def test_one_rollout_owns_the_route_until_it_releases_it(rollout):
    """Issue 20: two rollouts under other workflow IDs both ran on one deployment. The route carries
    its rollout's ID; another rollout is refused at once, naming it, until the first gives it up."""
    ref = _ref("owned")
    first, second = "rollout/llm-serving/owned", "rollout/elsewhere/x"
    _run(rollout.ensure_version, _version("owned", "1.0.0").model_copy(update={"owner": first}))
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 100}, owner=first))
    assert _route(rollout, "owned")["metadata"]["annotations"][naming.ANNOTATION_OWNER] == first
    for refused in (
        lambda: _run(rollout.ensure_version, _version("owned", "1.1.0").model_copy(update={"owner": second})),
        lambda: _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 100}, owner=second)),
    ):
        with pytest.raises(ApplicationError, match=f"HTTPRoute llm-serving/owned is owned by {first}") as err:
            refused()
        assert err.value.non_retryable and err.value.type == "DeploymentOwned"
    assert not rollout.kube.apps.list_namespaced_deployment(NS, label_selector=f"{naming.LABEL_VERSION}=1.1.0").items

    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 100}, owner=first, release=True))
    assert naming.ANNOTATION_OWNER not in (_route(rollout, "owned")["metadata"].get("annotations") or {})
    _run(rollout.ensure_version, _version("owned", "1.1.0").model_copy(update={"owner": second}))
    assert _route(rollout, "owned")["metadata"]["annotations"][naming.ANNOTATION_OWNER] == second


def test_one_scaling_loop_owns_the_deployment_it_scales(rollout):
    """Issue 20: two scaling loops fought (24 vs 8 replicas). The scaled Deployment carries its
    loop's ID (kept across continue-as-new: the same workflow ID); a second loop is refused."""
    from activities.scaling.scaling_activities import ScalingActivities
    from workflows.scaling.contract import ScaleTarget

    ref = _ref("looped")
    _run(rollout.ensure_version, _version("looped", "1.0.0"))
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 100}))
    scaling = ScalingActivities(rollout.kube, rollout.prometheus)
    target = ScaleTarget(namespace=NS, deployment="looped", owner="scaling/llm-serving/looped")
    assert _run(scaling.get_scale, target).version == "1.0.0"
    assert _run(scaling.get_scale, target).version == "1.0.0"  # its own claim: still fine
    with pytest.raises(ApplicationError, match="Deployment llm-serving/looped-v1-0-0 is owned by scaling/llm-serving/looped") as err:
        _run(scaling.get_scale, target.model_copy(update={"owner": "scaling/other/id"}))
    assert err.value.non_retryable
    held = rollout.kube.apps.read_namespaced_deployment("looped-v1-0-0", NS).metadata.annotations
    assert held[naming.ANNOTATION_OWNER] == "scaling/llm-serving/looped"


def test_replicas_and_gpus_past_the_clusters_maximum_are_refused(rollout):
    """Issue 20 defect 5: 2,147,483,648 replicas were accepted. The worker's configured maxima
    (TIDEPLANE_MAX_REPLICAS, TIDEPLANE_MAX_GPUS_PER_REPLICA) bound what it ever asks the cluster for."""
    import copy

    limited = copy.copy(rollout)
    limited.max_replicas, limited.max_gpus_per_replica = 4, 2
    ref = _ref("capped")
    for call, match in (
        (lambda: _run(limited.ensure_version, _version("capped", "1.0.0", replicas=5)), r"replicas: 5 exceeds the cluster's maximum 4 \(TIDEPLANE_MAX_REPLICAS\)"),
        (lambda: _run(limited.ensure_version, _version("capped", "1.0.0", gpus=3)), r"gpus_per_replica: 3 exceeds the cluster's maximum 2 \(TIDEPLANE_MAX_GPUS_PER_REPLICA\)"),
        (lambda: _run(limited.scale_version, ScaleVersionInput(deployment=ref, version="1.0.0", replicas=5)), "replicas: 5 exceeds"),
    ):
        with pytest.raises(ApplicationError, match=match) as err:
            call()
        assert err.value.non_retryable
    assert not rollout.kube.apps.list_namespaced_deployment(NS, label_selector=f"{naming.LABEL_APP}=capped").items
    _run(limited.ensure_version, _version("capped", "1.0.0", replicas=4, gpus=1))


def test_a_write_that_conflicts_is_read_again_and_one_that_keeps_conflicting_is_named():
    """409 Conflict: the object changed since it was read; the attempt (read, change, write) runs again."""
    attempts = []

    def conflicts_twice() -> str:
        attempts.append(1)
        if len(attempts) <= 2:
            raise ApiException(status=409, reason="Conflict")
        return "written"

    assert retry_on_conflict("HTTPRoute llm-serving/chat", conflicts_twice) == "written" and len(attempts) == 3

    def always_conflicts() -> None:
        raise ApiException(status=409, reason="Conflict")

    with pytest.raises(ApplicationError, match=rf"^HTTPRoute llm-serving/chat kept changing under us \({CONFLICT_RETRIES} conflicts\)$") as err:
        retry_on_conflict("HTTPRoute llm-serving/chat", always_conflicts)
    assert not err.value.non_retryable  # another activity attempt reads it afresh

    def forbidden() -> None:
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApplicationError, match="^HTTPRoute llm-serving/chat: HTTP 403 Forbidden") as err:
        retry_on_conflict("HTTPRoute llm-serving/chat", forbidden)
    assert err.value.non_retryable


def test_a_create_answered_409_conflict_is_written_again_not_taken_for_existing(rollout, monkeypatch):
    """Only 409 AlreadyExists says the object is there; a create answered 409 Conflict (a write that
    raced another one) left nothing behind, so the Service is read and created again: a rollout
    under API faults once went on to patch a Service that did not exist and rolled back on the 404."""
    core = rollout.kube.core
    create, answered = core.create_namespaced_service, []

    def conflict_once(*args, **kwargs):
        if not answered:
            answered.append(409)
            raise ApiException(status=409, reason="Conflict")
        return create(*args, **kwargs)

    monkeypatch.setattr(core, "create_namespaced_service", conflict_once)
    _run(rollout.ensure_version, _version("raced", "1.0.0"))
    assert answered == [409]
    assert core.read_namespaced_service(_ref("raced").versioned("1.0.0"), NS).spec.selector[naming.LABEL_VERSION]


def test_a_service_is_created_left_alone_when_it_matches_and_patched_keeping_its_cluster_ip(rollout):
    """The one Service write the rollout and the request classes share: a second apply of the same
    body writes nothing, a changed port is patched onto the Service there (its clusterIP stays)."""
    core = rollout.kube.core
    body = {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "applied", "namespace": NS, "labels": {naming.LABEL_MANAGED_BY: naming.MANAGED_BY}},
            "spec": {"selector": {naming.LABEL_APP: "applied"}, "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]}}
    assert apply_service(core, body) is True
    first = core.read_namespaced_service("applied", NS)
    assert apply_service(core, body) is False
    assert core.read_namespaced_service("applied", NS).metadata.resource_version == first.metadata.resource_version
    body["spec"]["ports"][0]["port"] = 8080
    assert apply_service(core, body) is True
    now = core.read_namespaced_service("applied", NS)
    assert [p.port for p in now.spec.ports] == [8080] and now.spec.cluster_ip == first.spec.cluster_ip


def test_at_a_50_50_tie_the_scaling_loop_scales_the_recorded_stable_not_the_one_that_sorts_first(rollout):
    """Issue 32: ``stable`` was ``max()`` by route weight over Deployments sorted by name, so at a
    50/50 step the loop claimed ``chat-v1-10-0`` (the canary) because it sorts before
    ``chat-v1-9-0``. The rollout records the stable version on the route; both readers follow it."""
    from activities.scaling.scaling_activities import ScalingActivities
    from workflows.scaling.contract import ScaleTarget

    ref = _ref("tied")
    _run(rollout.ensure_version, _version("tied", "1.9.0", replicas=2))
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.9.0": 100}, stable="1.9.0"))
    _run(rollout.ensure_version, _version("tied", "1.10.0", replicas=1))
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.9.0": 50, "1.10.0": 50}, stable="1.9.0"))
    assert _route(rollout, "tied")["metadata"]["annotations"][naming.ANNOTATION_STABLE_VERSION] == "1.9.0"
    assert [v.version for v in _run(rollout.describe_deployment, ref).versions] == ["1.10.0", "1.9.0"]  # the name order
    assert _run(rollout.describe_deployment, ref).stable.version == "1.9.0"
    scaling = ScalingActivities(rollout.kube, rollout.prometheus)
    tied = _run(scaling.get_scale, ScaleTarget(namespace=NS, deployment="tied"))
    assert (tied.version, tied.canary) == ("1.9.0", "1.10.0")  # the loop freezes scale-in meanwhile

    # promotion moves the record with the traffic
    _run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.9.0": 0, "1.10.0": 100}, stable="1.10.0"))
    promoted = _run(scaling.get_scale, ScaleTarget(namespace=NS, deployment="tied"))
    assert (promoted.version, promoted.canary) == ("1.10.0", None)

    # a tie on a route that records no stable version is refused, naming it, never settled by a sort
    route = _route(rollout, "tied")
    del route["metadata"]["annotations"][naming.ANNOTATION_STABLE_VERSION]
    route["spec"]["rules"][0]["backendRefs"] = [{**b, "weight": 50} for b in route["spec"]["rules"][0]["backendRefs"]]
    rollout.kube.custom.replace_namespaced_custom_object(*ROUTE_API, NS, "httproutes", "tied", route)
    with pytest.raises(ApplicationError, match="equal traffic to 1.10.0 and 1.9.0 and records no stable version") as err:
        _run(scaling.get_scale, ScaleTarget(namespace=NS, deployment="tied"))
    assert err.value.non_retryable
