"""What AdapterRollout asks of the registry, the serving replicas and the HTTPRoute (activities/adapters/adapter_activities.py).

The contract class ``AdapterActivities`` and its pydantic inputs and outputs, without I/O, so the
workflow references them deterministically. Every activity is idempotent: loading an adapter a
replica already holds and unloading one it does not hold are successes.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from workflows.core.naming import DeploymentRef
from workflows.core.versions import WeightFile


class ResolveAdapterInput(BaseModel):
    adapter: str
    version: str


class ResolvedAdapter(BaseModel):
    files: list[WeightFile] = Field(min_length=1)
    base_model: str
    base_version: str


class AdapterOnReplicasInput(BaseModel):
    """Load (with ``lora_path``) or unload one adapter version on every Ready replica of a base version."""

    deployment: DeploymentRef
    base_version: str = Field(description="the base Deployment's version whose pods get the adapter")
    lora_name: str = Field(description="the name requests select it by (vLLM's lora_name)")
    lora_path: str | None = Field(None, description="where the pods read its files; None for an unload")


class AdapterReplicas(BaseModel):
    pods: list[str] = Field(default_factory=list, description="NAMESPACE/POD of every replica now in the asked state")


class AdapterRouteInput(BaseModel):
    """The HTTPRoute rule that takes requests for ``adapter`` (by model name) and splits them by
    ``weights`` between adapter versions' served names, all on the base version's Service."""

    deployment: DeploymentRef
    adapter: str
    base_version: str
    weights: dict[str, int] = Field(description="served name -> weight; weights sum to 100, or empty: the rule removed")
    port: int = 8000


class LoraModuleInput(BaseModel):
    """Make ``adapter@version`` the one version of the adapter in the base Deployment's
    ``--lora-modules``, so every replica started from now on holds it."""

    deployment: DeploymentRef
    base_version: str
    adapter: str
    version: str
    lora_path: str


class AdapterActivities:
    """The adapters' registry entries, replicas and route (activities/adapters/adapter_activities.py)."""

    @activity.defn(name="resolve_adapter")
    def resolve_adapter(self, req: ResolveAdapterInput) -> ResolvedAdapter:
        """The adapter version's files and the base model version it was registered against."""
        raise NotImplementedError

    @activity.defn(name="load_lora_adapter")
    def load_lora_adapter(self, req: AdapterOnReplicasInput) -> AdapterReplicas:
        """``POST /v1/load_lora_adapter`` on every Ready replica of the base version."""
        raise NotImplementedError

    @activity.defn(name="unload_lora_adapter")
    def unload_lora_adapter(self, req: AdapterOnReplicasInput) -> AdapterReplicas:
        """``POST /v1/unload_lora_adapter`` on every Ready replica of the base version."""
        raise NotImplementedError

    @activity.defn(name="set_adapter_route")
    def set_adapter_route(self, req: AdapterRouteInput) -> None:
        """Write the adapter's model-name rule into the deployment's HTTPRoute (its other rules kept)."""
        raise NotImplementedError

    @activity.defn(name="set_lora_module")
    def set_lora_module(self, req: LoraModuleInput) -> None:
        """Write the adapter version into the base Deployment's ``--lora-modules`` (a rolling restart)."""
        raise NotImplementedError
