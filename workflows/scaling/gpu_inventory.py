"""GPU inventory: what each GPU of each node holds and has free, read by NVML or from DCGM.

The two sources give the same shape so the placement planner does not care which one it got:
NVML (activities/gpu.py ``read_gpus``) reads the devices of the node the worker runs on; the
control plane sees the whole fleet only through Prometheus' DCGM series (``read_gpus_from_dcgm``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from workflows.scaling.placement import Gpu

READ_GPUS = "read_gpus"
READ_GPUS_FROM_DCGM = "read_gpus_from_dcgm"


class GpuReading(BaseModel):
    index: int = Field(ge=0)
    uuid: str
    name: str = ""
    memory_total_mib: float = Field(ge=0)
    memory_used_mib: float = Field(ge=0)
    memory_free_mib: float = Field(ge=0)
    utilisation_percent: float | None = Field(None, description="None: the device does not report it")
    holder: str | None = Field(None, description="namespace/pod holding the GPU (DCGM only; NVML sees processes, not pods)")


class NodeGpus(BaseModel):
    node: str
    source: Literal["nvml", "dcgm"]
    gpus: list[GpuReading]

    def placement_gpus(self) -> list[Gpu]:
        """The planner's view: free memory per GPU; a GPU held by a pod is not shared."""
        return [Gpu(index=g.index, free_gib=g.memory_free_mib / 1024, allocated=g.holder is not None) for g in self.gpus]


class GpuInventory(BaseModel):
    nodes: list[NodeGpus]


class ReadGpusInput(BaseModel):
    node: str = Field("", description="name to report the devices under (default: this host's name)")


class DcgmQueries(BaseModel):
    """PromQL templates (``${nodes}``: a regex of node names); each must return Hostname, gpu, UUID."""

    free_mib: str = 'DCGM_FI_DEV_FB_FREE{Hostname=~"${nodes}"}'
    used_mib: str = 'DCGM_FI_DEV_FB_USED{Hostname=~"${nodes}"}'
    utilisation_percent: str = 'DCGM_FI_DEV_GPU_UTIL{Hostname=~"${nodes}"}'


class ReadGpusFromDcgmInput(BaseModel):
    nodes: list[str] = Field(default_factory=list, description="node names to read (default: every node)")
    at: datetime | None = Field(None, description="evaluation time (default: now)")
    queries: DcgmQueries = Field(default_factory=DcgmQueries)
