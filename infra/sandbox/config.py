"""The sandbox's declared cluster: GPU node pools, fleet behaviour profiles and demand.

Validated with pydantic so an impossible node (zero GPU memory, unknown capacity type) fails
at ``tideplane sandbox up`` with the field named, before any process starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


DEFAULT_CONFIG = Path(__file__).with_name("sandbox.yaml")

# Where the sandbox keeps its runtime knobs inside the emulated cluster, so that tests and the
# demo change them with the ordinary kubernetes client (patch a ConfigMap).
SANDBOX_NAMESPACE = "tideplane-sandbox"
PROFILES_CONFIGMAP = "fleet-profiles"  # data: "<model>@<version>" | "<model>" | "default" -> Profile JSON
DEMAND_CONFIGMAP = "fleet-demand"  # data: "<namespace>/<name>" -> Demand JSON
# What a node's disk holds beyond its image list (status.images): the engine cache directories
# (VLLM_CACHE_ROOT hostPaths) vLLM has filled, a JSON list the emulator's kubelet reads and adds to;
# and how the node came up (the sandbox's cloud writes it: seconds from start to Ready, and whether
# the instance came from the warm pool), which the kubelet reports as the node part of a cold start.
ENGINE_CACHES_ANNOTATION = "sandbox.tideplane.io/engine-caches"
NODE_START_ANNOTATION = "sandbox.tideplane.io/node-start"  # "<seconds> <launched|warm-pool>"
IMAGE_SIZE_BYTES = 10 * 1024**3  # a vLLM serving image, as a node's status.images reports it


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NodePool(_Strict):
    """A group of identical nodes, labelled the way Karpenter and EKS label them."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    count: int = Field(ge=0)
    capacity_type: Literal["on-demand", "spot"]
    instance_type: str = "p5.48xlarge"
    zones: list[str] = Field(default_factory=lambda: ["us-east-1a"], min_length=1)
    max_nodes: int | None = Field(
        None, ge=0, description="capacity: the Auto Scaling group's MaxSize, launches beyond it fail (None: 64)"
    )
    gpus: int = Field(ge=0, description="nvidia.com/gpu allocatable per node")
    gpu_memory_gib: float = Field(80, gt=0, description="memory of one GPU")
    cpu: int = Field(32, gt=0)
    memory_gib: int = Field(256, gt=0)
    taints: list[dict] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    gpu_sharing: Literal["none", "time-slicing"] = Field(
        "none", description="the NVIDIA device plugin's sharing: time-slicing advertises gpu_replicas shares per GPU"
        " as nvidia.com/gpu.shared (renameByDefault), so only pods asking for a share land there",
    )
    gpu_replicas: int = Field(1, ge=1, description="shares per GPU with time-slicing (sharing.timeSlicing.resources[].replicas)")

    @model_validator(mode="after")
    def _fits(self) -> NodePool:
        if self.max_nodes is not None and self.count > self.max_nodes:
            raise ValueError(f"count {self.count} exceeds max_nodes {self.max_nodes}")
        return self


class Profile(_Strict):
    """How one model version behaves when served: lets a test declare a good or bad release."""

    load_seconds: float = Field(30, ge=0, description="weights load (and warm-up, unless warmup_seconds says it apart)")
    # The other parts of a cold start (the emulator's kubelet adds them; infra/sandbox/kubeapi/kubelet.py):
    image_pull_seconds: float = Field(0, ge=0, description="pulling the image onto a node that lacks it")
    compile_seconds: float = Field(0, ge=0, description="torch.compile and CUDA graphs, skipped with the node's engine cache")
    warmup_seconds: float = Field(0, ge=0, description="warm-up after the engine is up")
    error_rate: float = Field(0.001, ge=0, le=1)
    ttft_seconds: float = Field(0.15, gt=0)
    tpot_seconds: float = Field(0.025, gt=0)
    output_tokens: int = Field(200, gt=0)
    prompt_tokens: int = Field(500, gt=0)
    capacity_rps: float = Field(4, gt=0, description="requests/s one replica serves at its SLO (it saturates half as much again)")
    gpu_memory_gib: float = Field(40, gt=0)
    golden_failures: list[str] = Field(
        default_factory=list, description="prompts (case-insensitive substrings) this version answers wrongly"
    )
    drift: float = Field(0, ge=0, le=1, description="share of prompts answered differently from the reference")
    # How a bad release fails (the emulator's kubelet acts on these; see infra/sandbox/kubeapi/kubelet.py).
    crash_on_start: bool = Field(False, description="the server exits at once: CrashLoopBackOff")
    never_ready: bool = Field(False, description="Running, the readiness probe never passes")
    oom_after_requests: int | None = Field(None, ge=1, description="OOMKilled after serving this many requests")
    shutdown_seconds: float = Field(5, ge=0, description="drain after SIGTERM: how long a deleted pod is Terminating")
    engine: str | None = Field(
        None,
        description="a calibrated engine of infra/fleetmodel/calibration.yaml (e.g. llama-3.1-8b/H200x1): its step"
        " times and KV cache replace ttft_seconds, tpot_seconds and capacity_rps",
    )

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, name: str | None) -> str | None:
        from infra.fleetmodel.engine import engine_names

        if name is not None and name not in engine_names():
            raise ValueError(f"unknown engine {name!r}; calibrated: {engine_names()}")
        return name


class Demand(_Strict):
    """Requests per second offered to a logical deployment (split by its HTTPRoute).

    A ``curve`` of (sandbox seconds, rps) points, linear in between, replaces the constant ``rps``
    (a rate curve, or a trace resampled to one); its clock starts when the fleet first sees this
    demand, and ``period_seconds`` repeats it (86400: a daily tide).
    """

    rps: float = Field(0, ge=0)
    curve: list[tuple[float, float]] = Field(default_factory=list)
    period_seconds: float | None = Field(None, gt=0)

    @field_validator("curve")
    @classmethod
    def _curve(cls, points: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if any(t < 0 or rps < 0 for t, rps in points):
            raise ValueError("curve points are (seconds >= 0, rps >= 0)")
        return sorted(points)


class SandboxConfig(_Strict):
    time_scale: float = Field(10, gt=0, description="sandbox seconds per real second")
    node_pools: list[NodePool]
    profiles: dict[str, Profile] = Field(default_factory=lambda: {"default": Profile()})
    demand: dict[str, Demand] = Field(default_factory=dict)


class SandboxConfigError(ValueError):
    """The sandbox config is invalid; the message names the field."""


def load_config(path: Path | str = DEFAULT_CONFIG) -> SandboxConfig:
    raw = yaml.safe_load(Path(path).read_text())
    try:
        return SandboxConfig.model_validate(raw)
    except ValidationError as exc:
        raise SandboxConfigError(f"invalid sandbox config {path}: {_field_errors(exc)}") from None


def _field_errors(exc: ValidationError) -> str:
    """Every problem, each naming its field (``node_pools.0.gpus: ...``), joined by ``; ``."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['msg']}" for e in exc.errors())
