"""What ModelRollout and RegistryRetention ask of the model registry and the cluster.

The contract class ``RegistryActivities`` (implemented in activities/registry/registry_activities.py) and its pydantic
inputs and outputs, in a module without I/O so workflows reference them deterministically:
``workflow.execute_activity_method(RegistryActivities.resolve_registry_weights, ...)``. The
activity names are a stable API (recorded histories refer to them). Every activity is idempotent.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from temporalio import activity

from workflows.core.versions import ModelName, SemVer, Status, WeightFile
from workflows.registry.schema import BenchmarkResult, VersionSummary

# --- for the rollout ---------------------------------------------------------------------------


class RegistryWeightsInput(BaseModel):
    """Used when a rollout names only model and version: the registry says where the weights are."""

    model: str
    version: str


class RegistryWeights(BaseModel):
    files: list[WeightFile] = Field(min_length=1)


class SetRegistryStatusInput(BaseModel):
    """Record a version's status on one deployment (canary -> stable; rollback -> testing or
    deprecated), from which its overall status follows (workflows.registry.schema.place).
    Idempotent: the same status twice records one history entry."""

    model: str
    version: str
    status: Status = Field(description='e.g. {"state": "canary", "percent": 5, "since": "..."}')
    reason: str = ""
    at: datetime | None = Field(None, description="workflow.now(), so a retry records the same time")
    demote_previous: bool = Field(True, description="a new stable takes the model's other versions off the deployment")
    deployment: str | None = Field(
        None, description="NAMESPACE/NAME it is about; None (histories recorded before): an unrecorded deployment"
    )


class RegistryStatusResult(BaseModel):
    status: Status
    demoted: list[str] = Field(default_factory=list, description="versions this stable took off the deployment")


class RecordRegistryBenchmarkInput(BaseModel):
    model: str
    version: str
    benchmark: BenchmarkResult


# --- for retention -----------------------------------------------------------------------------


class ListVersionsInput(BaseModel):
    models: list[str] | None = Field(None, description="None: every model in the registry")


class VersionList(BaseModel):
    versions: list[VersionSummary]


class ListReferencesInput(BaseModel):
    namespaces: list[str] | None = Field(None, description="None: every namespace")


class ModelVersionRef(BaseModel):
    model: str
    version: str


class ReferencedVersions(BaseModel):
    refs: list[ModelVersionRef] = Field(default_factory=list)
    where: dict[str, list[str]] = Field(
        default_factory=dict, description="model@version -> what uses it, e.g. ['Deployment ns/chat-v1-3-0 (2 replicas)']"
    )


class DeleteWeightsInput(BaseModel):
    model: ModelName
    version: SemVer
    reason: str
    at: datetime | None = Field(None, description="recorded as weights.deleted_at (workflow time); default now")


class DeleteWeightsResult(BaseModel):
    deleted: bool
    reason: str = Field(description="why not, when deleted is False")
    files: int = 0
    bytes: int = 0


class RegistryActivities:
    """The registry in S3 and the Deployments that use its versions (activities/registry/registry_activities.py)."""

    @activity.defn(name="resolve_registry_weights")
    def resolve_registry_weights(self, req: RegistryWeightsInput) -> RegistryWeights:
        """The weight files and their sha256 a rollout stages; missing or rewritten files fail here."""
        raise NotImplementedError

    @activity.defn(name="set_registry_status")
    def set_registry_status(self, req: SetRegistryStatusInput) -> RegistryStatusResult:
        raise NotImplementedError

    @activity.defn(name="record_registry_benchmark")
    def record_registry_benchmark(self, req: RecordRegistryBenchmarkInput) -> None:
        raise NotImplementedError

    @activity.defn(name="list_registry_versions")
    def list_registry_versions(self, req: ListVersionsInput) -> VersionList:
        raise NotImplementedError

    @activity.defn(name="list_referenced_versions")
    async def list_referenced_versions(self, req: ListReferencesInput) -> ReferencedVersions:
        """Versions that can still serve (Deployments with replicas, route backends with weight) or
        that a running rollout may be staging: retention never deletes them."""
        raise NotImplementedError

    @activity.defn(name="delete_registry_weights")
    async def delete_registry_weights(self, req: DeleteWeightsInput) -> DeleteWeightsResult:
        """Delete a deprecated version's weights; refused (deleted=False) if it is no longer
        deprecated or a rollout of it runs. Heartbeats; a retry resumes after the last deleted key."""
        raise NotImplementedError
