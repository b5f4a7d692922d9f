"""The product and the Kubernetes API emulator agree, as evidence: the emulator owns its rules (it
imports no product code, a contract in pyproject.toml keeps it so) and these tests show the
product's names, pods and placement meet them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from activities.node_cache.node_cache_activities import NodeCacheActivities
from activities.rollout.serving_pods import ServingPods, deployment_manifest
from activities.scaling.node_pool_activities import node_gpus
from infra.sandbox.fleet_simulator import vllm_args
from infra.sandbox.kubeapi import gpushare, kubelet
from workflows.core.batching_settings import engine_overrides
from workflows.core import gpu_shares, naming
from workflows.core.naming import DeploymentRef
from workflows.core.versions import WeightFile
from workflows.node_cache.chunks import cached_version_label
from workflows.node_cache.contract import NodeCacheRequest, StartNodeCacheInput
from workflows.rollout.contract import EnsureVersionInput


def test_the_device_plugin_names_are_the_products():
    assert (gpushare.GPU_RESOURCE, gpushare.SHARED_GPU_RESOURCE) == (naming.GPU_RESOURCE, gpu_shares.SHARED_GPU_RESOURCE)
    assert (gpushare.SHARING_STRATEGY_LABEL, gpushare.GPU_COUNT_LABEL) == (gpu_shares.SHARING_STRATEGY_LABEL, gpu_shares.GPU_COUNT_LABEL)
    assert gpushare.SHARING_STRATEGIES == gpu_shares.SHARING_STRATEGIES


@pytest.mark.parametrize("args", [[], ["--gpu-memory-utilization", "0.45"], ["--gpu-memory-utilization=0.3"],
                                  ["--gpu-memory-utilization", "0.2", "--gpu-memory-utilization", "0.6"],
                                  ["--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization", "x"]])
def test_the_product_reads_a_claim_as_the_emulator_reads_vllms_flag(args):
    assert gpushare.memory_fraction(args) == gpu_shares.container_share("1", args)


@pytest.mark.parametrize("claims", [[0.45, 0.45, 0.3], [0.5, 0.3, 0.3, 0.2, 0.6], [0.9, 0.1, 0.45, 0.45]])
def test_the_node_layer_predicts_placement_as_a_binpack_scheduler_places_shares(claims):
    """node_gpus (what the node layer thinks each GPU has free) places the shares the emulator's
    scheduler placed under HAMi's binpack GPU policy (claims in descending order, as the product
    sorts them); under spread they would disagree, which is why docs/scaling.md asks for binpack."""

    used = [0.0, 0.0]
    for claim in sorted(claims, reverse=True):
        index = gpushare.pick_gpu(used, claim, "binpack")
        if index is not None:
            used[index] += claim
    node = client.V1Node(metadata=client.V1ObjectMeta(name="n", labels={
        gpu_shares.SHARING_STRATEGY_LABEL: "time-slicing", gpu_shares.GPU_COUNT_LABEL: "2"}),
        status=client.V1NodeStatus(allocatable={gpu_shares.SHARED_GPU_RESOURCE: "8"}))
    pods = [client.V1Pod(spec=client.V1PodSpec(containers=[client.V1Container(
        name="vllm", args=["--gpu-memory-utilization", str(c)],
        resources=client.V1ResourceRequirements(limits={gpu_shares.SHARED_GPU_RESOURCE: "1"}))])) for c in claims]
    predicted = [round(80 * (1 - u), 6) for u in used]
    assert [round(g.free_gib, 6) for g in node_gpus(node, pods, 80)] == predicted


def serving_pod(**extra) -> dict:
    files = [WeightFile(uri="s3://weights/m/1.0.0/model.safetensors", sha256="a" * 64)]
    req = EnsureVersionInput(deployment=DeploymentRef(namespace="x", name="chat"), model="m", version="1.0.0",
                             image="vllm:1", gpus_per_replica=0, replicas=1, weights_path="/models/m/1.0.0", **extra)
    return deployment_manifest(req, ServingPods(Path("/models"), node_cache_dir=Path("/node-cache")))["spec"]["template"]


def test_serving_pods_carry_the_labels_the_fleet_profiles_are_keyed_by():
    labels = serving_pod()["metadata"]["labels"]
    assert labels[kubelet.PROFILE_MODEL_LABEL] == "m" and labels[kubelet.PROFILE_VERSION_LABEL] == "1.0.0"


def test_a_node_cached_pod_prefers_the_node_the_node_cache_labels_and_stages_with_the_agents_command():
    files = [WeightFile(uri="s3://weights/m/1.0.0/model.safetensors", sha256="a" * 64)]
    template = serving_pod(node_cache_files=files)
    pod = {"metadata": template["metadata"], "spec": template["spec"]}
    label = cached_version_label("m", "1.0.0")  # what NodeCacheActivities.label_nodes puts on a node holding it
    assert kubelet.node_cache_stager(pod)
    assert kubelet.prefers_node(pod, {"name": "n", "labels": {label: "true"}})
    assert not kubelet.prefers_node(pod, {"name": "n", "labels": {}})


def test_the_staging_jobs_pods_are_the_ones_the_node_agent_runs():
    files = [WeightFile(uri="s3://weights/m/1.0.0/model.safetensors", sha256="a" * 64)]
    activities = NodeCacheActivities(kube=None, image="tideplane:1", cache_dir=Path("/node-cache"))
    req = StartNodeCacheInput(namespace="x", model="m", version="1.0.0", files=files, run_id="r")
    job = activities._job(req, "node-a", NodeCacheRequest(model="m", version="1.0.0", files=files, node="node-a", stagers=["node-a"]))
    template = job["spec"]["template"]
    assert kubelet.agent_run({"metadata": template["metadata"], "spec": template["spec"]})
    assert not kubelet.agent_run({"metadata": {}, "spec": serving_pod()["spec"]})


@pytest.mark.parametrize("args", [[], ["--max-num-seqs", "64"], ["--max-num-batched-tokens=8192", "--enable-chunked-prefill"],
                                  ["--max-num-seqs", "0", "--no-enable-chunked-prefill"], ["--max-num-seqs"]])
def test_the_fleet_simulator_reads_batching_arguments_as_the_product_writes_them(args):
    assert vllm_args.batching(args) == engine_overrides(args)


def test_the_fleet_simulator_keys_replicas_by_the_products_labels():
    assert (vllm_args.LABEL_APP, vllm_args.LABEL_MODEL, vllm_args.LABEL_VERSION) == (
        naming.LABEL_APP, naming.LABEL_MODEL, naming.LABEL_VERSION)
    assert vllm_args.gpu_memory_utilization(["--gpu-memory-utilization", "0.45"]) == gpu_shares.gpu_memory_utilization(
        ["--gpu-memory-utilization", "0.45"])
