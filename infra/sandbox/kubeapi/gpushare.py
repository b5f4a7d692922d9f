"""Memory on shared GPUs: the VRAM accounting of a GPU-sharing-aware scheduler.

Owned by the emulator, from the documentation of the parts it stands in for (no product code):

- The NVIDIA device plugin's time-slicing (or MPS) advertises each physical GPU as ``replicas``
  extended resources (k8s-device-plugin README, "Shared Access to GPUs with CUDA Time-Slicing"):
  ``nvidia.com/gpu.shared`` with ``renameByDefault: true``, else still ``nvidia.com/gpu``; GPU
  feature discovery labels the node ``nvidia.com/gpu.sharing-strategy`` (``time-slicing``, ``mps``
  or ``none``), ``nvidia.com/gpu.replicas`` and ``nvidia.com/gpu.count`` (physical GPUs).
- The replicas isolate no memory, and each vLLM server preallocates ``--gpu-memory-utilization``
  of its GPU (vLLM's engine argument, default 0.9), so a stock kube-scheduler, which counts only
  replicas, would bind a pod that then fails at start. The emulator schedules as a VRAM-aware
  scheduler does (HAMi: its scheduler extender filters by device memory): a pod asking for a
  share goes to a GPU whose claims leave room for its own, the GPU is recorded on the pod, and a
  pod that fits on no GPU stays Pending with a FailedScheduling event naming the memory.
- Which GPU of a node: HAMi's GPU scheduler policy, ``binpack`` (the most used GPU that holds it)
  or ``spread`` (the least used), chosen per pod by the ``hami.io/gpu-scheduler-policy``
  annotation, else ``binpack``, the emulator's stand-in for a HAMi installed with
  ``scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy: binpack`` (the policy docs/scaling.md
  asks production to set; HAMi's own default is ``spread``). Ties go to the lower GPU index.
"""

from __future__ import annotations

from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"  # the device plugin's resource (whole GPUs, or replicas without renameByDefault)
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"  # time-slicing / MPS replicas with renameByDefault: true
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"  # GFD: none | time-slicing | mps
SHARING_STRATEGIES = ("time-slicing", "mps")
GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # GFD: physical GPUs of the node
GPU_MEMORY_UTILIZATION_FLAG = "--gpu-memory-utilization"  # vLLM engine argument
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
GPU_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"  # HAMi's per-pod override
GPU_POLICIES = ("binpack", "spread")
DEFAULT_GPU_POLICY = "binpack"
GPU_INDEX_ANNOTATION = "sandbox.tideplane.io/gpu-index"  # the physical GPU a shared pod was given
EPSILON = 1e-9


def shared_resource(node: dict[str, Any]) -> str | None:
    """The resource a node advertises GPU shares under (None: its GPUs are not shared)."""
    labels = node["metadata"].get("labels") or {}
    if labels.get(SHARING_STRATEGY_LABEL) not in SHARING_STRATEGIES:
        return None
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return next((r for r in (SHARED_GPU_RESOURCE, GPU_RESOURCE) if r in allocatable), None)


def physical_gpus(node: dict[str, Any]) -> int:
    return int((node["metadata"].get("labels") or {}).get(GPU_COUNT_LABEL, 0))


def memory_fraction(args: list[str]) -> float | None:
    """What a vLLM server preallocates of its GPU, read from its arguments as vLLM reads them
    (``--gpu-memory-utilization X`` or ``=X``, the last wins; default 0.9); None for a value vLLM
    refuses at start (outside (0, 1]): nothing to place."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == GPU_MEMORY_UTILIZATION_FLAG and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(GPU_MEMORY_UTILIZATION_FLAG + "="):
            value = arg.partition("=")[2]
    if value is None:
        return VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    try:
        fraction = float(value)
    except ValueError:
        return None
    return fraction if 0 < fraction <= 1 else None


def claim(pod_spec: dict[str, Any], resource: str) -> float | None:
    """The fraction of one GPU the pod's container claims, if it asks for a share of ``resource``."""
    for container in pod_spec.get("containers") or []:
        res = container.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}.get(resource)
        if asked not in (None, 0, "0"):
            return memory_fraction([str(a) for a in container.get("args") or []])
    return None


def policy(pod: dict[str, Any], default: str = DEFAULT_GPU_POLICY) -> str:
    asked = (pod["metadata"].get("annotations") or {}).get(GPU_POLICY_ANNOTATION)
    return asked if asked in GPU_POLICIES else default


def pick_gpu(used: list[float], fraction: float, how: str) -> int | None:
    """The GPU a share of ``fraction`` goes to under ``how`` (binpack: the most used that holds it;
    spread: the least used); None when none holds it."""
    fitting = [i for i, u in enumerate(used) if u + fraction <= 1 + EPSILON]
    if how == "spread":
        return min(fitting, key=lambda i: (used[i], i), default=None)
    return min(fitting, key=lambda i: (-used[i], i), default=None)


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
