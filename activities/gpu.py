"""GPU side: the devices of this node through NVML, or every node's GPUs from Prometheus' DCGM series.

NVML answers only for the machine the worker runs on, so it serves a per-node agent and the GPU
check (``python -m activities.gpu`` prints this node's inventory as JSON). The control plane runs
off the GPU nodes and reads the whole fleet from the DCGM exporter's series in Prometheus: without
a GPU or driver ``read_gpus`` fails non-retryably (``NvmlUnavailable``) to say so.

NodePoolScaling does not read this inventory: model pods hold whole GPUs, so the planner's free
memory is that of the GPUs no pod holds, which Kubernetes allocation and the node's GPU memory
label already give without a Prometheus dependency in the pool loop.
"""

from __future__ import annotations

import json
import re
import socket
import sys

import httpx
import pynvml
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.metrics import HTTP_TIMEOUT, api, render
from workflows.scaling.gpu_inventory import (
    READ_GPUS,
    READ_GPUS_FROM_DCGM,
    GpuInventory,
    GpuReading,
    NodeGpus,
    ReadGpusFromDcgmInput,
    ReadGpusInput,
)

MIB = 1024 * 1024


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older pynvml returns bytes


def nvml_reading(
    index: int, name: str | bytes, uuid: str | bytes, total_bytes: int, used_bytes: int, free_bytes: int, gpu_util: int | None
) -> GpuReading:
    """One device's NVML values (bytes, percent) as the inventory's reading (MiB, like DCGM)."""
    return GpuReading(
        index=index,
        uuid=_text(uuid),
        name=_text(name),
        memory_total_mib=total_bytes / MIB,
        memory_used_mib=used_bytes / MIB,
        memory_free_mib=free_bytes / MIB,
        utilisation_percent=None if gpu_util is None else float(gpu_util),
    )


def _utilisation(handle) -> int | None:
    try:
        return pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except pynvml.NVMLError_NotSupported:
        return None


def nvml_inventory(node: str = "") -> GpuInventory:
    """This node's devices; ``NvmlUnavailable`` (non-retryable) where there is no GPU or driver."""
    node = node or socket.gethostname()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise ApplicationError(
            f"NVML could not be initialised on {node} ({exc}): no NVIDIA GPU or driver here; "
            "the planner should use DCGM data from Prometheus (read_gpus_from_dcgm)",
            type="NvmlUnavailable",
            non_retryable=True,
        ) from None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(nvml_reading(
                index, pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle),
                memory.total, memory.used, memory.free, _utilisation(handle),
            ))
    except pynvml.NVMLError as exc:
        raise ApplicationError(f"NVML on {node}: {exc}", type="NvmlError") from None
    finally:
        pynvml.nvmlShutdown()
    return GpuInventory(nodes=[NodeGpus(node=node, source="nvml", gpus=gpus)])


@activity.defn(name=READ_GPUS)
def read_gpus(req: ReadGpusInput) -> GpuInventory:
    return nvml_inventory(req.node)


def _node_regex(nodes: list[str]) -> str:
    """Exact names as an RE2 alternation inside a PromQL string (whose backslashes are escaped)."""
    if not nodes:
        return ".+"
    return "|".join(re.escape(n) for n in nodes).replace("\\", "\\\\")


@activity.defn(name=READ_GPUS_FROM_DCGM)
def read_gpus_from_dcgm(req: ReadGpusFromDcgmInput) -> GpuInventory:
    """Join the free/used/utilisation series per (Hostname, gpu, UUID) into per-node GPU lists."""
    variables = {"nodes": _node_regex(req.nodes)}
    params = {"time": f"{req.at.timestamp():.3f}"} if req.at else {}
    readings: dict[tuple[str, int, str], dict] = {}
    with httpx.Client(timeout=HTTP_TIMEOUT) as http:
        for field, template in req.queries.model_dump().items():
            promql = render(field, template, variables)
            data = api(http, field, "/api/v1/query", {"query": promql, **params})
            if data.get("resultType") != "vector":
                raise ApplicationError(f"DCGM query {field!r}: expected a vector, got a {data.get('resultType')}", non_retryable=True)
            for series in data["result"]:
                labels = series["metric"]
                missing = [k for k in ("Hostname", "gpu", "UUID") if k not in labels]
                if missing:
                    raise ApplicationError(f"DCGM query {field!r} must return Hostname, gpu, UUID; {labels} lacks {missing}",
                                           non_retryable=True)
                entry = readings.setdefault((labels["Hostname"], int(labels["gpu"]), labels["UUID"]), {
                    "name": labels.get("modelName", ""),
                    "holder": f"{labels['namespace']}/{labels['pod']}" if labels.get("pod") else None,
                })
                entry[field] = float(series["value"][1])
    nodes: dict[str, list[GpuReading]] = {}
    for (host, index, uuid), entry in sorted(readings.items()):
        if "free_mib" not in entry or "used_mib" not in entry:
            activity.logger.warning("GPU %s/%s (%s) has no framebuffer series; left out", host, index, uuid)
            continue
        nodes.setdefault(host, []).append(GpuReading(
            index=index, uuid=uuid, name=entry["name"], holder=entry["holder"],
            memory_total_mib=entry["free_mib"] + entry["used_mib"], memory_used_mib=entry["used_mib"],
            memory_free_mib=entry["free_mib"], utilisation_percent=entry.get("utilisation_percent"),
        ))
    return GpuInventory(nodes=[NodeGpus(node=host, source="dcgm", gpus=gpus) for host, gpus in nodes.items()])


ACTIVITIES = [read_gpus, read_gpus_from_dcgm]


if __name__ == "__main__":
    try:
        inventory = nvml_inventory()
    except ApplicationError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
    print(json.dumps(inventory.model_dump(), indent=2))
