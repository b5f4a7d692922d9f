"""AdapterRollout's input, status and result (pure pydantic, shared by the workflow, CLI and tests)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from workflows.core.bounds import Seconds, gate_window
from workflows.core.engine_metrics import REQUEST_TIME_PER_OUTPUT_TOKEN, TIME_TO_FIRST_TOKEN
from workflows.core.naming import DeploymentName, DeploymentRef
from workflows.core.versions import ModelName, SemVer
from workflows.rollout.gates import AnalysisLimits, Gates
from workflows.rollout.types import CanaryStep, GateQueries, Outcome, Stage, VerdictRecord

# Per adapter version: the gateway's (endpoint picker's) counts by served name; TTFT/TPOT from the
# base's vLLM histograms (adapters share the engine, vLLM does not label by adapter).
_TARGET = 'namespace="${namespace}",target_model_name="${model}-${version}"'
_STABLE = 'namespace="${namespace}",target_model_name="${model}-${stable_version}"'
_BASE = 'namespace="${namespace}",deployment="${deployment}"'


def _p99(metric: str, selector: str) -> str:
    return f"histogram_quantile(0.99, sum by (le) (rate({metric}_bucket{{{selector}}}[${{window}}])))"


ADAPTER_QUERIES = GateQueries(
    request_count=f"sum(increase(inference_objective_request_total{{{_TARGET}}}[${{window}}]))",
    error_rate=(
        f"(sum(rate(inference_objective_request_error_total{{{_TARGET}}}[${{window}}])) or vector(0))"
        f" / sum(rate(inference_objective_request_total{{{_TARGET}}}[${{window}}]))"
    ),
    p99_latency=_p99("inference_objective_request_duration_seconds", _TARGET),
    stable_p99_latency=_p99("inference_objective_request_duration_seconds", _STABLE),
    ttft_p99=_p99(TIME_TO_FIRST_TOKEN.name, _BASE),
    tpot_p99=_p99(REQUEST_TIME_PER_OUTPUT_TOKEN.name, _BASE),
    gateway_error_rate="",  # the error rate above already is the gateway's (the endpoint picker's count)
)

ADAPTER_STEPS = [CanaryStep(weight=10, window_seconds=600), CanaryStep(weight=50, window_seconds=600), CanaryStep(weight=100, window_seconds=600)]


class AdapterRolloutInput(BaseModel):
    """Canary ``adapter@version`` on the base model ``deployment`` serves, by model name."""

    model_config = ConfigDict(extra="forbid")

    deployment: DeploymentName = Field(description="NAMESPACE/NAME of the base model's deployment")
    adapter: ModelName = Field(description="the adapter's registry name; clients send it as 'model'")
    version: SemVer
    port: int = Field(8000, ge=1, le=65535)
    steps: list[CanaryStep] = Field(default_factory=lambda: list(ADAPTER_STEPS), min_length=1)
    gate_interval_seconds: Seconds = 60
    query_window_seconds: float | None = Field(None, gt=0)
    gates: Gates = Field(default_factory=Gates)
    analysis: AnalysisLimits = Field(default_factory=AnalysisLimits)
    queries: GateQueries = Field(default_factory=lambda: ADAPTER_QUERIES.model_copy())
    drain_seconds: float = Field(
        5, ge=0, le=600, description="after traffic left a version, before it is unloaded: the gateway's config to propagate"
    )
    registry_status: bool = Field(True, description="move the adapter version's registry status as the model rollout does")

    @property
    def ref(self) -> DeploymentRef:
        return DeploymentRef.from_name(self.deployment)

    @property
    def query_window(self) -> str:
        return gate_window(self.query_window_seconds, self.gate_interval_seconds)


class AdapterAbortInput(BaseModel):
    reason: str = "aborted by operator"


class AdapterRolloutStatus(BaseModel):
    deployment: str
    adapter: str
    version: str
    stable_version: str | None
    base_version: str | None
    stage: Stage
    weight: int
    paused: bool
    pause_reason: str | None
    last_verdict: VerdictRecord | None
    loaded_on: list[str] = Field(default_factory=list, description="pods holding the new version")


class AdapterRolloutResult(BaseModel):
    deployment: str
    adapter: str
    version: str
    previous_version: str | None
    outcome: Outcome
    reason: str
    weight_reached: int
    failing_verdict: VerdictRecord | None = None
    unloaded_from: list[str] = Field(default_factory=list, description="pods the version left without traffic was unloaded from")
