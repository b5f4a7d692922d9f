"""The contract between the ModelRollout workflow and the activities that act for it.

Activity names and their pydantic inputs/outputs live here, in a module with no I/O imports, so
the workflow can reference them deterministically and the activities (activities/storage.py,
activities/kube.py, activities/metrics.py, activities/serving.py) implement exactly this.
Every activity is idempotent: calling it twice with the same input leaves the same state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from workflows.registry import schema as registry_types

# Activity names (stable API: histories refer to them).
STAGE_WEIGHTS = "stage_weights"  # activities/storage.py
DESCRIBE_DEPLOYMENT = "describe_deployment"  # activities/kube.py
ENSURE_VERSION = "ensure_version"  # activities/kube.py
SCALE_VERSION = "scale_version"  # activities/kube.py
WAIT_READY = "wait_ready"  # activities/kube.py
SET_ROUTE_WEIGHTS = "set_route_weights"  # activities/kube.py
WARM_UP = "warm_up"  # activities/serving.py
QUERY_GATES = "query_gates"  # activities/metrics.py
RESOLVE_REGISTRY_WEIGHTS = "resolve_registry_weights"  # activities/registry.py (model registry issue)
SET_REGISTRY_STATUS = "set_registry_status"  # activities/registry.py
RECORD_REGISTRY_BENCHMARK = "record_registry_benchmark"  # activities/registry.py


class WeightFile(BaseModel):
    uri: str = Field(description="s3://bucket/key of one weights file")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class StageWeightsInput(BaseModel):
    model: str
    version: str
    files: list[WeightFile] = Field(min_length=1)


class StagedWeights(BaseModel):
    path: str = Field(description="directory in the model cache that serving pods mount")
    size_bytes: int
    resumed_bytes: int = Field(0, description="bytes already verified by an earlier attempt, not fetched again")
    seconds: float


class DeploymentRef(BaseModel):
    namespace: str
    name: str = Field(description="logical deployment name, e.g. 'chat'")


class VersionInfo(BaseModel):
    version: str
    model: str
    replicas: int
    ready_replicas: int
    route_weight: int


class DeploymentState(BaseModel):
    """What is in the cluster now for one logical deployment."""

    route_exists: bool
    versions: list[VersionInfo] = Field(default_factory=list)

    @property
    def stable(self) -> VersionInfo | None:
        """The version carrying the most traffic (None on a first deploy)."""
        serving = [v for v in self.versions if v.route_weight > 0]
        return max(serving, key=lambda v: v.route_weight) if serving else None


class EnsureVersionInput(BaseModel):
    deployment: DeploymentRef
    model: str
    version: str
    image: str
    gpus_per_replica: int = Field(ge=0)
    replicas: int = Field(ge=0)
    weights_path: str
    port: int = 8000
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    priority_class: Literal["realtime", "batch"] = Field(
        "realtime",
        description="realtime: on-demand nodes; batch: spot nodes (labels the pods, selects their nodes)",
    )


class ScaleVersionInput(BaseModel):
    deployment: DeploymentRef
    version: str
    replicas: int = Field(ge=0)


class WaitReadyInput(BaseModel):
    deployment: DeploymentRef
    version: str
    replicas: int = Field(ge=0)
    poll_seconds: float = 2.0


class ReadyResult(BaseModel):
    ready_replicas: int
    seconds: float = Field(description="from the call to all replicas Ready (cold start)")


class RouteWeightsInput(BaseModel):
    deployment: DeploymentRef
    weights: dict[str, int] = Field(description="version -> weight; weights sum to 100")
    port: int = Field(8000, description="the versions' Service port (EnsureVersionInput.port)")


class WarmUpInput(BaseModel):
    deployment: DeploymentRef
    version: str
    requests: int = Field(20, ge=1)
    max_tokens: int = 64
    prompt: str = "Summarise the plot of Hamlet in one paragraph."
    model: str | None = Field(None, description="served model name sent as 'model' (ensure_version serves it under the model name)")


class Benchmark(BaseModel):
    requests: int
    errors: int
    tokens_per_second: float
    p50_latency_seconds: float
    p99_latency_seconds: float


class GateQueriesInput(BaseModel):
    """Rendered per observation: the activity substitutes ${...} and runs each query."""

    queries: dict[str, str] = Field(description="gate name -> PromQL template")
    variables: dict[str, str] = Field(description="template variables: namespace, deployment, version, stable_version, window")


class GateQueriesResult(BaseModel):
    values: dict[str, float | None] = Field(description="gate name -> scalar result (None: no data)")


class RegistryWeightsInput(BaseModel):
    """Used when a rollout names only model and version: the registry says where the weights are."""

    model: str
    version: str


class RegistryWeights(BaseModel):
    files: list[WeightFile] = Field(min_length=1)


class SetRegistryStatusInput(BaseModel):
    """Move a version's registry status (testing -> canary -> stable; rollback -> testing or
    deprecated). Idempotent: the same status twice records one history entry."""

    model: str
    version: str
    status: registry_types.Status = Field(description='e.g. {"state": "canary", "percent": 5, "since": "..."}')
    reason: str = ""
    at: datetime | None = Field(None, description="workflow.now(), so a retry records the same time")
    demote_previous: bool = Field(True, description="a new stable deprecates the model's other stable versions")


class RegistryStatusResult(BaseModel):
    status: registry_types.Status
    demoted: list[str] = Field(default_factory=list, description="versions moved stable -> deprecated")


class RecordRegistryBenchmarkInput(BaseModel):
    model: str
    version: str
    benchmark: registry_types.BenchmarkResult
