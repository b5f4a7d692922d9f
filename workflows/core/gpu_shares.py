"""What a replica claims of a GPU: whole GPUs (``nvidia.com/gpu``) or a share of one
(``nvidia.com/gpu.shared``, claiming vLLM's ``--gpu-memory-utilization`` of its memory), and where a
share lands (the fullest GPU that holds it).

The names are the NVIDIA device plugin's and GPU feature discovery's (k8s-device-plugin README,
"Shared Access to GPUs"; sharing.timeSlicing.renameByDefault: true advertises the replicas as
``nvidia.com/gpu.shared`` so that only pods asking for a share land there). The rollout writes the
claim into a replica's pod, and the scaling node layer counts shares on a node, placing them as a
VRAM-aware scheduler with a binpack GPU policy does (HAMi's ``gpuSchedulerPolicy: binpack``; the
sandbox's emulator implements that policy itself, tests/sandbox/kubeapi/test_emulator_agreement.py
shows they agree). Pure.
"""

from __future__ import annotations

SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"  # none | time-slicing | mps
SHARING_STRATEGIES = ("time-slicing", "mps")  # the label's values for a node whose GPUs are shared
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"  # shares per physical GPU
GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # physical GPUs
SHARED_PRODUCT_SUFFIX = "-SHARED"  # GFD appends it to nvidia.com/gpu.product on shared nodes
GPU_MEMORY_UTILIZATION_FLAG = "--gpu-memory-utilization"
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM EngineArgs default
EPSILON = 1e-9


def gpu_memory_utilization(args: list[str]) -> float:
    """The fraction of its GPU a vLLM server claims, from its command-line arguments (vLLM's default
    when absent); ``ValueError`` for a value vLLM itself would refuse."""
    value: str | None = None
    for i, arg in enumerate(args):
        if arg == GPU_MEMORY_UTILIZATION_FLAG and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(GPU_MEMORY_UTILIZATION_FLAG + "="):
            value = arg.partition("=")[2]
    if value is None:
        return VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    fraction = float(value)
    if not 0 < fraction <= 1:
        raise ValueError(f"{GPU_MEMORY_UTILIZATION_FLAG} must be in (0, 1], got {value}")
    return fraction


def container_share(asked: object, args: list[str]) -> float | None:
    """The fraction of one GPU a container asking for ``asked`` GPU shares claims (its vLLM
    ``--gpu-memory-utilization``); None when it asks for none, or for a value vLLM refuses at start
    (nothing to place)."""
    if asked in (None, 0, "0"):
        return None
    try:
        return gpu_memory_utilization([str(a) for a in args])
    except ValueError:
        return None


def fullest_fit(used: list[float], fraction: float) -> int | None:
    """Where a share goes, as a VRAM-aware scheduler (HAMi, binpack GPU policy) puts it: the fullest GPU that still
    holds ``fraction`` (``used``: each GPU's claimed fraction; None: none holds it)."""
    fitting = [i for i, u in enumerate(used) if u + fraction <= 1 + EPSILON]
    return min(fitting, key=lambda i: (1 - used[i], i), default=None)
