"""What a simulated replica reads from its pod, owned by the fleet simulator (a stand-in imports no
product code): vLLM's engine arguments as vLLM reads them, and the pod labels the sandbox keys its
replicas by. tests/sandbox/kubeapi/test_emulator_agreement.py shows the product writes the same.
"""

from __future__ import annotations

from infra.sandbox.kubeapi.gpushare import GPU_RESOURCE, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, memory_fraction
from infra.sandbox.kubeapi.kubelet import PROFILE_MODEL_LABEL, PROFILE_VERSION_LABEL

__all__ = ["GPU_RESOURCE", "LABEL_APP", "LABEL_MODEL", "LABEL_VERSION", "batching", "gpu_memory_utilization"]

LABEL_APP = "app.kubernetes.io/name"  # Kubernetes' recommended label: the logical deployment a pod serves
LABEL_MODEL, LABEL_VERSION = PROFILE_MODEL_LABEL, PROFILE_VERSION_LABEL
_VALUED = {"--max-num-seqs": "max_num_seqs", "--max-num-batched-tokens": "max_num_batched_tokens"}
_CHUNKED = {"--enable-chunked-prefill": True, "--no-enable-chunked-prefill": False}


def gpu_memory_utilization(args: list[str]) -> float:
    """vLLM's ``--gpu-memory-utilization`` (default 0.9; a value vLLM refuses counts as the default)."""
    return memory_fraction(args) or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION


def batching(args: list[str]) -> dict[str, int | bool]:
    """The batching engine arguments given (``--max-num-seqs N``, ``--max-num-batched-tokens N``, the
    last of ``--[no-]enable-chunked-prefill``); absent ones keep the engine's defaults."""
    out: dict[str, int | bool] = {}
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in _VALUED:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            if value.isdigit() and int(value) > 0:
                out[_VALUED[name]] = int(value)
        elif name in _CHUNKED:
            out["enable_chunked_prefill"] = _CHUNKED[name]
    return out
