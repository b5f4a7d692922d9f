"""What the node layer reads from nodes and pods: whole GPUs, GPU shares, pending replicas.

Plain kubernetes client objects, as the API returns them, through the pure helpers
``observe_node_pool`` is made of; then the placement planner on what they produce.
"""

from __future__ import annotations

from kubernetes import client

from activities.scaling.node_pool_activities import gpu_share, node_gpus, pending_replica
from workflows.core.naming import GPU_RESOURCE, LABEL_MODEL
from workflows.scaling.contract import PendingReplica
from workflows.core.gpu_shares import GPU_COUNT_LABEL, SHARED_GPU_RESOURCE, SHARING_STRATEGY_LABEL
from workflows.scaling.placement import ModelNeed, Node, PoolSizing, plan_pending

MEMORY = 80.0


def pod(name: str, limits: dict[str, str], args: list[str] | None = None) -> client.V1Pod:
    container = client.V1Container(name="vllm", image="vllm/vllm-openai:v0.8.5", args=args,
                                   resources=client.V1ResourceRequirements(limits=limits))
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, namespace="llm-serving", labels={LABEL_MODEL: name}),
                        spec=client.V1PodSpec(containers=[container]))


def shared(name: str, fraction: float) -> client.V1Pod:
    return pod(name, {SHARED_GPU_RESOURCE: "1"}, ["--model", "/models/x", "--gpu-memory-utilization", str(fraction)])


def time_sliced_node(gpus: int, replicas: int = 4) -> client.V1Node:
    """As the device plugin (renameByDefault) and GPU feature discovery show a time-sliced node."""
    return client.V1Node(
        metadata=client.V1ObjectMeta(name="shared-1", labels={SHARING_STRATEGY_LABEL: "time-slicing", GPU_COUNT_LABEL: str(gpus)}),
        status=client.V1NodeStatus(allocatable={SHARED_GPU_RESOURCE: str(gpus * replicas), "cpu": "8"}),
    )


def test_a_time_sliced_node_shows_its_physical_gpus_less_the_shares_its_pods_claim():
    gpus = node_gpus(time_sliced_node(2), [shared("chat", 0.45), shared("embed", 0.45), shared("rerank", 0.3)], MEMORY)
    # first fit from the fullest: both 0.45 shares on GPU 0 (8 GiB left), 0.3 on GPU 1
    assert [(g.index, round(g.free_gib, 6), g.allocated) for g in gpus] == [(0, 8.0, False), (1, 56.0, False)]


def test_whole_gpus_are_held_and_counted_from_allocatable():
    node = client.V1Node(metadata=client.V1ObjectMeta(name="gpu-1", labels={}),
                         status=client.V1NodeStatus(allocatable={GPU_RESOURCE: "4"}))
    gpus = node_gpus(node, [pod("llama-70b", {GPU_RESOURCE: "2"})], MEMORY)
    assert [(g.free_gib, g.allocated) for g in gpus] == [(0, True), (0, True), (MEMORY, False), (MEMORY, False)]


def test_a_pending_pod_on_a_gpu_share_asks_the_pool_for_its_share_of_a_gpu():
    assert pending_replica(shared("rerank", 0.45)) == PendingReplica(pod="llm-serving/rerank", model="rerank", gpus=1, gpu_share=0.45)
    assert pending_replica(pod("llama-70b", {GPU_RESOURCE: "2"})).gpus == 2
    assert pending_replica(pod("cpu-only", {"cpu": "2"})) is None
    assert gpu_share(pod("cpu-only", {"cpu": "2"})) is None
    assert gpu_share(pod("bad", {SHARED_GPU_RESOURCE: "1"}, ["--gpu-memory-utilization", "1.5"])) is None  # vLLM refuses it


def test_a_shared_replica_that_fits_no_gpu_share_gets_a_new_node():
    """A third 0.45 share does not fit the GPU two already claim: the pool grows by one node (the
    node layer once counted shared pods as needing no GPU, so it never grew for them)."""
    full = Node(name="shared-1", gpus=node_gpus(time_sliced_node(1), [shared("chat", 0.45), shared("embed", 0.45)], MEMORY), replicas=2)
    need = pending_replica(shared("rerank", 0.45))
    plan = plan_pending([full], [ModelNeed(model=need.model, gpu_memory_gib=need.gpu_memory_gib(MEMORY))],
                        PoolSizing(gpus_per_node=1, max_nodes=4), "on-demand", MEMORY)
    assert (plan.fits_existing, plan.new_nodes) == (0, 1)
    roomy = Node(name="shared-1", gpus=node_gpus(time_sliced_node(1), [shared("chat", 0.45)], MEMORY), replicas=1)
    plan = plan_pending([roomy], [ModelNeed(model=need.model, gpu_memory_gib=need.gpu_memory_gib(MEMORY))],
                        PoolSizing(gpus_per_node=1, max_nodes=4), "on-demand", MEMORY)
    assert (plan.fits_existing, plan.new_nodes) == (1, 0)
