"""The fleet simulator's ``GET /metrics``: Prometheus text with vLLM's and DCGM's metric names and labels."""

from __future__ import annotations

import uuid

from infra.fleetmodel.metrics import Histogram
from infra.sandbox.fleet_simulator.cluster import GPU_PRODUCT_LABEL


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + "n").replace(chr(34), chr(92) + chr(34))}"' for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


class Exposition:
    """Prometheus text format 0.0.4, grouped per metric family."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def sample(self, family: str, kind: str, help_text: str, labels: dict[str, str], value: float, suffix: str = "") -> None:
        entry = self._families.setdefault(family, (kind, help_text, []))
        entry[2].append(f"{family}{suffix}{_labels(labels)} {float(value)!r}")

    def histogram(self, family: str, help_text: str, labels: dict[str, str], hist: Histogram) -> None:
        for le, count in hist.cumulative():
            self.sample(family, "histogram", help_text, {**labels, "le": le}, count, "_bucket")
        self.sample(family, "histogram", help_text, labels, hist.sum, "_sum")
        self.sample(family, "histogram", help_text, labels, hist.count, "_count")

    def text(self) -> str:
        lines = []
        for name, (kind, help_text, samples) in self._families.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(lines) + "\n"


def _device_labels(node: str, index: int, node_labels: dict[str, str]) -> dict[str, str]:
    """dcgm-exporter's labels of GPU ``index`` of ``node`` (a stable UUID per node and index)."""
    return {"gpu": str(index), "UUID": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}')}", "device": f"nvidia{index}",
            "modelName": node_labels.get(GPU_PRODUCT_LABEL, "NVIDIA H100 80GB HBM3"), "Hostname": node}


def _dcgm_samples(out: Exposition, labels: dict[str, str], util: float, used: int, total: int) -> None:
    out.sample("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", labels, util)
    out.sample("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", labels, used)
    out.sample("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", labels, total - used)


def _pod_labels(holder: str) -> dict[str, str]:
    """The labels dcgm-exporter's pod mapping adds to a GPU's series for the pod ``namespace/name``."""
    namespace, _, pod = holder.partition("/")
    return {"namespace": namespace, "pod": pod, "container": "vllm"}
