"""End to end against the sandbox: two models share one time-sliced GPU, a third does not fit
until the node layer grows the shared pool.

Real parts: the Kubernetes API emulator's scheduler with VRAM accounting on shared GPUs, its
kubelet, the fleet simulator's OpenAI-compatible proxy and its DCGM series in Prometheus. The shared node is registered the way
the sandbox's cloud registers its nodes (``node_manifest`` of a pool with ``gpu_sharing:
time-slicing``) but outside its Auto Scaling group: the sandbox's ``gpu-shared`` pool, empty at
start, is grown by the node layer's production activity at the end.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import httpx
import pytest
from kubernetes import client

from temporalio.testing import ActivityEnvironment

from activities.clients.prometheus import PrometheusClient
from activities.cost.cost_activities import CostActivities
from infra.sandbox.config import SandboxConfig
from infra.sandbox.kubeapi.gpushare import GPU_INDEX_ANNOTATION
from infra.sandbox.nodes import Instance, node_manifest
from tests.e2e.scaling.test_scaling_layers import node_pool_activities
from tests.sandbox_fixtures import TEST_CONFIG, create_logical_deployment, wait_until
from workflows.cost.contract import CollectCostInput
from workflows.core.naming import NODE_POOL
from workflows.scaling.contract import PendingReplica, PoolRef, SetCapacityInput
from workflows.core.gpu_shares import GPU_MEMORY_UTILIZATION_FLAG, SHARED_GPU_RESOURCE, SHARING_STRATEGY_LABEL
from workflows.scaling.placement import ModelNeed, PoolSizing, plan_pending

NAMESPACE = "e2e-gpu-sharing"
CLAIM = 0.45  # two fit on one GPU, a third does not (although the GPU has 4 time-slicing replicas)
SHARED_POOL = next(p for p in SandboxConfig.model_validate(TEST_CONFIG).node_pools if p.gpu_sharing == "time-slicing")


@pytest.fixture(scope="module")
def shared_node(kube):
    core = client.CoreV1Api(kube)
    pool = SHARED_POOL
    body = node_manifest(Instance("i-0shared0000000001", pool.name, "us-east-1a", pool.instance_type,
                                  "ip-10-0-99-1.ec2.internal", "10.0.99.1", "running"), pool)
    body["spec"]["providerID"] = "sandbox:///e2e/gpu-shared"  # not an instance of the cloud: it leaves the node alone
    core.create_node(body)
    yield body["metadata"]["name"]
    core.delete_node(body["metadata"]["name"])
    wait_until(lambda: not core.list_node(field_selector=f"metadata.name={body['metadata']['name']}").items, 10, "the shared node to go")


def shared_model(kube, name: str, model: str) -> str:
    return create_logical_deployment(kube, NAMESPACE, name, "1.0.0", model, replicas=1, container={
        "resources": {"limits": {SHARED_GPU_RESOURCE: "1"}},
        "args": ["--model", f"/models/{model}", "--served-model-name", model, GPU_MEMORY_UTILIZATION_FLAG, str(CLAIM)],
    })


def pods_of(core, versioned: str) -> list:
    return [p for p in core.list_namespaced_pod(NAMESPACE).items if p.metadata.name.startswith(versioned + "-")]


@pytest.fixture(scope="module")
def three_models(kube, shared_node):
    """Two models on the shared GPU (Running), then a third that does not fit (Pending)."""
    core = client.CoreV1Api(kube)
    served = {"chat": shared_model(kube, "chat", "llama-3-8b"), "embed": shared_model(kube, "embed", "bge-m3")}

    def running() -> list | None:
        pods = [p for v in served.values() for p in pods_of(core, v)]
        ready = [p for p in pods if p.status.phase == "Running"
                 and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        return ready if len(ready) == 2 else None

    pods = wait_until(running, 15, "both models Running")
    third = shared_model(kube, "rerank", "bge-reranker")

    def refused():
        pod = next(iter(pods_of(core, third)), None)
        cond = next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None) if pod else None
        return (pod, cond) if cond is not None and cond.status == "False" else None

    pod, cond = wait_until(refused, 10, "the third model's pod to be refused")
    return served, pods, pod, cond


def test_two_models_share_a_gpu_and_a_third_that_does_not_fit_waits(sandbox, kube, shared_node, three_models):
    core = client.CoreV1Api(kube)
    served, pods, pod, cond = three_models
    assert {p.spec.node_name for p in pods} == {shared_node}
    assert {(p.metadata.annotations or {}).get(GPU_INDEX_ANNOTATION) for p in pods} == {"0"}  # the same GPU
    assert pod.status.phase == "Pending" and pod.spec.node_name is None and cond.reason == "Unschedulable"
    nodes = len(core.list_node().items)
    assert cond.message.startswith(f"0/{nodes} nodes are available: ")
    assert f"1 Insufficient GPU memory (no shared GPU has {CLAIM:g} of its memory free" in cond.message
    assert f"Insufficient {SHARED_GPU_RESOURCE}" in cond.message  # the unshared GPU nodes advertise no shares
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={pod.metadata.name}").items
    assert any(e.reason == "FailedScheduling" and e.type == "Warning" and e.message == cond.message for e in events)

    for name, versioned in served.items():
        url = f"{sandbox.urls['fleet']}/proxy/{NAMESPACE}/{versioned}/v1/completions"
        answer = wait_until(lambda: (r := httpx.post(url, json={"prompt": "tide", "max_tokens": 4}, timeout=10)).status_code == 200 and r,
                            10, f"{name} to answer through the gateway")
        assert answer.json()["model"] == {"chat": "llama-3-8b", "embed": "bge-m3"}[name]


def test_the_node_layer_sees_the_claimed_share_and_asks_a_node_for_the_waiting_replica(sandbox, three_models):
    """NodePoolScaling's observation of the shared pool (its Auto Scaling group at 0 in moto): the
    node's one GPU with 0.9 of it claimed, and the waiting third replica asking for a 0.45 share, which
    the planner puts on a new node. The node layer once counted nvidia.com/gpu only: no GPU on the
    node, nothing pending, the pool never grew."""
    seen = ActivityEnvironment().run(node_pool_activities(sandbox).observe_node_pool, PoolRef(pool=SHARED_POOL.name, takes_unconstrained=True))
    (node,) = seen.nodes
    assert [(g.index, round(g.free_gib, 6), g.allocated) for g in node.gpus] == [(0, 8.0, False)]
    pending = three_models[2]
    assert seen.pending == [PendingReplica(pod=f"{NAMESPACE}/{pending.metadata.name}", model="bge-reranker", gpus=1, gpu_share=CLAIM)]
    assert seen.pending_gpus == 1
    (waiting,) = seen.pending
    need = ModelNeed(model=waiting.model, gpu_memory_gib=waiting.gpu_memory_gib(seen.gpu_memory_gib))
    plan = plan_pending(seen.nodes, [need], PoolSizing(gpus_per_node=1, max_nodes=2), "on-demand", seen.gpu_memory_gib)
    assert (plan.fits_existing, plan.new_nodes) == (0, 1)


def test_the_cost_report_pays_the_shared_gpu_once_split_between_its_two_models(sandbox, three_models):
    """The cost activity's default GPU occupancy over the sandbox's Prometheus: the fleet exports the
    time-sliced GPU as dcgm-exporter with --kubernetes-virtual-gpus does (a copy per pod on it), and
    each Running model holds half of it. Counted per series, as before, each held a whole GPU; with no
    pod on the series, as the exporter's default, nobody paid for it."""
    served, pods, _, _ = three_models
    cost = CostActivities(PrometheusClient(sandbox.urls["prometheus"]))
    window = 4

    def occupancy() -> dict[str, float]:
        end = datetime.fromtimestamp(math.floor(time.time()) - 1, tz=timezone.utc)
        inputs = ActivityEnvironment().run(cost.collect_cost_inputs, CollectCostInput(end=end, window_seconds=window, step_seconds=1))
        return {g.pod: g.gpu_seconds / window for g in inputs.gpu if g.namespace == NAMESPACE and g.pod in names}

    names = {p.metadata.name for p in pods}

    seen: list[dict[str, float]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # until both pods' series span the whole window
        seen.append(occupancy())
        if len(seen) > 1 and seen[-1] == seen[-2] and len(seen[-1]) == 2:
            break
        time.sleep(1)
    assert seen[-1] == {p.metadata.name: pytest.approx(0.5) for p in pods}


def test_the_grown_pool_takes_the_waiting_replica_on_a_new_time_sliced_node(sandbox, kube, shared_node, three_models):
    """The node layer's production activity sets the shared pool's Auto Scaling group (moto) to the
    one node the planner asked for; the sandbox's cloud launches it as a time-sliced node, and the
    third model's replica, Pending so far, is scheduled there and runs."""
    core = client.CoreV1Api(kube)
    acts = node_pool_activities(sandbox)
    waiting = three_models[2]
    ActivityEnvironment().run(acts.set_pool_capacity, SetCapacityInput(pool=SHARED_POOL.name, desired=1))
    try:
        def running_elsewhere():
            pod = core.read_namespaced_pod(waiting.metadata.name, NAMESPACE)
            return pod if pod.status.phase == "Running" and pod.spec.node_name not in (None, shared_node) else None

        pod = wait_until(running_elsewhere, 60, "the waiting replica to run on a new node")
        node = core.read_node(pod.spec.node_name)
        assert node.spec.provider_id.startswith("aws:///")  # an instance of the group, not the hand-made node
        assert node.metadata.labels[NODE_POOL] == SHARED_POOL.name
        assert node.metadata.labels[SHARING_STRATEGY_LABEL] == "time-slicing"
        assert node.status.allocatable[SHARED_GPU_RESOURCE] == str(SHARED_POOL.gpu_replicas)
        assert (pod.metadata.annotations or {}).get(GPU_INDEX_ANNOTATION) == "0"
    finally:
        ActivityEnvironment().run(acts.set_pool_capacity, SetCapacityInput(pool=SHARED_POOL.name, desired=0))
        wait_until(lambda: not [n for n in core.list_node(label_selector=f"{NODE_POOL}={SHARED_POOL.name}").items
                                if n.metadata.name != shared_node], 60, "the grown node to go")
