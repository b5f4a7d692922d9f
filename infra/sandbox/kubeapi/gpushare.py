"""Memory on shared GPUs: the VRAM accounting of a GPU-sharing-aware scheduler.

The NVIDIA device plugin's time-slicing (or MPS) advertises each GPU as several replicas
(``nvidia.com/gpu.shared`` with ``renameByDefault``, else ``nvidia.com/gpu``) and GPU feature
discovery labels the node (``nvidia.com/gpu.sharing-strategy``, ``nvidia.com/gpu.replicas``). The
replicas isolate no memory, and each vLLM server preallocates ``--gpu-memory-utilization`` of its
GPU, so a stock kube-scheduler would bind a pod that then fails at start. The emulator schedules as
a VRAM-aware scheduler (HAMi, a scheduler extender) does: a pod asking for a share goes to a GPU
whose claims leave room for its own, the GPU is recorded on the pod, and a pod that fits on no GPU
stays Pending with a FailedScheduling event naming the memory.
"""

from __future__ import annotations

from typing import Any

from workflows.core.naming import GPU_RESOURCE
from workflows.core.gpu_shares import (
    GPU_COUNT_LABEL,
    SHARED_GPU_RESOURCE,
    SHARING_STRATEGIES,
    SHARING_STRATEGY_LABEL,
    container_share,
)

GPU_INDEX_ANNOTATION = "sandbox.tideplane.io/gpu-index"  # the physical GPU a shared pod was given


def shared_resource(node: dict[str, Any]) -> str | None:
    """The resource a node advertises GPU shares under (None: its GPUs are not shared)."""
    labels = node["metadata"].get("labels") or {}
    if labels.get(SHARING_STRATEGY_LABEL) not in SHARING_STRATEGIES:
        return None
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return next((r for r in (SHARED_GPU_RESOURCE, GPU_RESOURCE) if r in allocatable), None)


def physical_gpus(node: dict[str, Any]) -> int:
    return int((node["metadata"].get("labels") or {}).get(GPU_COUNT_LABEL, 0))


def claim(pod_spec: dict[str, Any], resource: str) -> float | None:
    """The fraction of one GPU the pod's vLLM container claims, if it asks for a share of ``resource``."""
    for container in pod_spec.get("containers") or []:
        res = container.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}.get(resource)
        if asked not in (None, 0, "0"):
            return container_share(asked, container.get("args") or [])
    return None


def gpu_index(pod: dict[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(GPU_INDEX_ANNOTATION)
    return int(value) if value is not None and value.isdigit() else None


def used_fractions(node: dict[str, Any], pods: list[dict[str, Any]]) -> list[float]:
    """Claimed fraction of each physical GPU of a shared node, from the pods bound to it."""
    used = [0.0] * physical_gpus(node)
    resource = shared_resource(node)
    for pod in pods:
        index = gpu_index(pod)
        fraction = claim(pod["spec"], resource) if resource else None
        if index is not None and index < len(used) and fraction:
            used[index] += fraction
    return used


def no_room_message(fraction: float) -> str:
    return f"Insufficient GPU memory (no shared GPU has {fraction:g} of its memory free for --gpu-memory-utilization {fraction:g})"
