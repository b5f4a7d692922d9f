"""GPU inventory: NVML on this machine (a clear non-retryable error without a GPU), the pure NVML
conversion, and the DCGM path against the sandbox's real Prometheus."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client, config
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.gpu import nvml_reading, read_gpus, read_gpus_from_dcgm
from infra.sandbox.config import Profile
from infra.sandbox.knobs import set_profile
from tests.sandbox_fixtures import create_logical_deployment, wait_until
from workflows.scaling.gpu_inventory import GpuInventory, ReadGpusFromDcgmInput, ReadGpusInput
from workflows.naming import GPU_RESOURCE, LABEL_APP

GIB = 1024 * 1024 * 1024
HAS_GPU = Path("/dev/nvidiactl").exists()  # the driver's control device: NVML can only work with it


def test_nvml_reads_this_machines_devices_or_fails_clearly():
    env = ActivityEnvironment()
    if HAS_GPU:  # a lent GPU machine: the real devices, with consistent memory figures
        inventory = env.run(read_gpus, ReadGpusInput(node="gpu-check"))
        [node] = inventory.nodes
        assert node.node == "gpu-check" and node.source == "nvml" and node.gpus
        for gpu in node.gpus:
            assert gpu.uuid.startswith("GPU-") and gpu.name
            assert gpu.memory_total_mib > 0
            assert abs(gpu.memory_used_mib + gpu.memory_free_mib - gpu.memory_total_mib) <= 0.01 * gpu.memory_total_mib
        return
    with pytest.raises(ApplicationError) as caught:
        env.run(read_gpus, ReadGpusInput(node="cpu-box"))
    err = caught.value
    assert err.type == "NvmlUnavailable"
    assert err.non_retryable
    assert "NVML could not be initialised on cpu-box" in str(err) and "DCGM" in str(err)


def test_nvml_reading_converts_bytes_to_mib_and_decodes_names():
    reading = nvml_reading(1, b"NVIDIA H200", b"GPU-1234", 141 * GIB, 40 * GIB, 101 * GIB, 37)
    assert (reading.index, reading.name, reading.uuid) == (1, "NVIDIA H200", "GPU-1234")
    assert (reading.memory_total_mib, reading.memory_used_mib, reading.memory_free_mib) == (141 * 1024, 40 * 1024, 101 * 1024)
    assert reading.utilisation_percent == 37.0 and reading.holder is None
    assert nvml_reading(0, "A100", "GPU-0", GIB, 0, GIB, None).utilisation_percent is None  # not supported by the device


NAMESPACE = "e2e-gpu-inventory"
MODEL = "gpu-inventory-model"
MODEL_GIB = 30  # per GPU, from the fleet profile: what DCGM reports as used on each held GPU


def test_dcgm_inventory_shows_pods_memory_on_their_nodes_gpus(sandbox_env):
    api = config.new_client_from_config(config_file=str(sandbox_env.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    set_profile(api, MODEL, None, Profile(load_seconds=1, gpu_memory_gib=MODEL_GIB))
    deployment = create_logical_deployment(api, NAMESPACE, "inventory", "1.0.0", MODEL, replicas=2, gpus=2)
    env = ActivityEnvironment()
    try:
        def bound():
            pods = [p for p in core.list_namespaced_pod(NAMESPACE, label_selector=f"{LABEL_APP}=inventory").items if p.spec.node_name]
            return pods if len(pods) == 2 else None

        pods = wait_until(bound, 20, "both pods bound")
        holders = {f"{NAMESPACE}/{p.metadata.name}": p.spec.node_name for p in pods}

        def held() -> GpuInventory | None:
            inv = env.run(read_gpus_from_dcgm, ReadGpusFromDcgmInput())
            mine = [g for n in inv.nodes for g in n.gpus if g.holder in holders]
            return inv if len(mine) == 4 and all(g.memory_used_mib == MODEL_GIB * 1024 for g in mine) else None

        inventory = wait_until(held, 20, "DCGM series of the pods' GPUs in Prometheus", interval=0.5)

        gpu_nodes = {n.metadata.name: int(n.status.allocatable.get(GPU_RESOURCE, 0))
                     for n in core.list_node().items if int(n.status.allocatable.get(GPU_RESOURCE, 0))}
        # Every GPU node, every GPU, from DCGM. Series of nodes that left the cluster may linger up
        # to Prometheus' 5-minute lookback when it could not mark them stale (a sandbox restarted
        # by another test): only the nodes in the cluster now are compared.
        current = [n for n in inventory.nodes if n.node in gpu_nodes]
        assert {n.node: len(n.gpus) for n in current} == gpu_nodes
        for node in current:
            assert node.source == "dcgm" and [g.index for g in node.gpus] == list(range(gpu_nodes[node.node]))
            for gpu in node.gpus:
                assert gpu.memory_total_mib == 80 * 1024  # the sandbox pools' 80 GiB GPUs
                assert gpu.memory_used_mib + gpu.memory_free_mib == gpu.memory_total_mib
                assert gpu.uuid.startswith("GPU-") and gpu.utilisation_percent is not None
                if gpu.holder in holders:
                    assert holders[gpu.holder] == node.node  # the memory shows on the pod's own node
                    assert gpu.memory_free_mib == (80 - MODEL_GIB) * 1024
        per_pod = {h: sum(1 for n in inventory.nodes for g in n.gpus if g.holder == h) for h in holders}
        assert per_pod == {h: 2 for h in holders}

        # One node only, and the planner's view of it: the held GPUs are allocated, the rest free.
        node_name = next(iter(holders.values()))
        [node] = env.run(read_gpus_from_dcgm, ReadGpusFromDcgmInput(nodes=[node_name])).nodes
        assert node.node == node_name
        planner = node.placement_gpus()
        assert [g.allocated for g in planner] == [g.holder is not None for g in node.gpus]
        assert {g.free_gib for g in planner if g.allocated and node.gpus[g.index].holder in holders} == {80 - MODEL_GIB}
        assert env.run(read_gpus_from_dcgm, ReadGpusFromDcgmInput(nodes=["no-such-node"])).nodes == []
    finally:
        apps.patch_namespaced_deployment_scale(deployment, NAMESPACE, {"spec": {"replicas": 0}})
