"""Public input, output, signal, update and query types of the ModelRollout workflow.

These models are the API the ``temporal`` CLI speaks in JSON (``--input '{...}'``): fields are
stable, unknown fields are refused (``extra="forbid"``) and every validation error names the field.
"""

from __future__ import annotations

import string
from datetime import datetime
from enum import Enum
from itertools import pairwise
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import to_json

from workflows.rollout.gates import (
    ERROR_RATE,
    P99_LATENCY,
    REQUEST_COUNT,
    STABLE_P99_LATENCY,
    TPOT_P99,
    TTFT_P99,
    AnalysisLimits,
    Evaluation,
    GateCheck,
    Gates,
    StepAnalysis,
    required_passes,
)
from workflows.rollout.diagnosis import Cause, Diagnosis
from workflows.core.bounds import (
    MAX_GPUS_PER_REPLICA,
    MAX_REPLICAS,
    MAX_WINDOW_SECONDS,
    MIN_WINDOW_SECONDS,
    Seconds,
    SecondsOrZero,
    gate_window,
)
from workflows.core.engine_metrics import E2E_REQUEST_LATENCY, HTTP_REQUESTS, REQUEST_TIME_PER_OUTPUT_TOKEN, TIME_TO_FIRST_TOKEN
from workflows.core.naming import DeploymentName, DeploymentRef, ModelLabel, VersionLabel
from workflows.core.transfer import DownloadProgress
from workflows.rollout.contract import Benchmark, EnvFromSecret, StagedWeights, plain_credential_args, plain_credentials
from workflows.rollout.batching import BatchingSweep, SweepChoice
from workflows.core.gpu_shares import GPU_MEMORY_UTILIZATION_FLAG
from workflows.core.verdicts import GoldenVerdict
from workflows.quality.shadow import ShadowSettings, ShadowVerdict
from workflows.node_cache.contract import NodeCacheProgress, NodeCacheSettings

MAX_OBSERVATIONS = 3000  # ~11 history events each: well under Temporal's 51,200-event limit
# The input travels in the history, the status query and activity inputs (args/env): keep it far below
# Temporal's 2 MiB payload limit, which fails a run late and confusingly (PayloadsTooLarge).
MAX_INPUT_BYTES = 64 * 1024
TEMPLATE_VARIABLES = frozenset({"namespace", "deployment", "model", "version", "stable_version", "window"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _selector(version_var: str, extra: str = "") -> str:
    return f'namespace="${{namespace}}",deployment="${{deployment}}",version="${{{version_var}}}"{extra}'


_5XX = ',status=~"5.."'


def _p99(metric: str, version_var: str = "version") -> str:
    return f"histogram_quantile(0.99, sum by (le) (rate({metric}_bucket{{{_selector(version_var)}}}[${{window}}])))"


class _Templates(_Strict):
    """PromQL templates: every field is one, with only the known ${...} variables."""

    @field_validator("*")
    @classmethod
    def _known_variables(cls, template: str) -> str:
        parsed = string.Template(template)
        if not parsed.is_valid():
            raise ValueError("invalid ${...} placeholder")
        unknown = set(parsed.get_identifiers()) - TEMPLATE_VARIABLES
        if unknown:
            raise ValueError(f"unknown variables {sorted(unknown)}; allowed: {sorted(TEMPLATE_VARIABLES)}")
        return template


class GateQueries(_Templates):
    """PromQL templates (string.Template) for each gate, like an Argo Rollouts AnalysisTemplate.

    Defaults read vLLM's histograms and the HTTP server's ``http_requests_total{status}`` (the families of
    the metric contract, workflows/core/engine_metrics.py); a user with
    another gateway edits a query here, not the code. Variables: ${namespace} ${deployment} ${model}
    ${version} (the canary) ${stable_version} ${window} (a Prometheus duration, e.g. ``60s``).
    """

    request_count: str = f"sum(increase({HTTP_REQUESTS.name}{{{_selector('version')}}}[${{window}}]))"
    error_rate: str = (
        f"(sum(rate(http_requests_total{{{_selector('version', _5XX)}}}[${{window}}])) or vector(0))"
        f" / sum(rate(http_requests_total{{{_selector('version')}}}[${{window}}]))"
    )
    p99_latency: str = _p99(E2E_REQUEST_LATENCY.name)
    stable_p99_latency: str = _p99(E2E_REQUEST_LATENCY.name, "stable_version")
    ttft_p99: str = _p99(TIME_TO_FIRST_TOKEN.name)
    # vLLM's per-request TPOT, not inter-token latency (why: workflows/core/engine_metrics.py)
    tpot_p99: str = _p99(REQUEST_TIME_PER_OUTPUT_TOKEN.name)

    def by_gate(self) -> dict[str, str]:
        return {
            REQUEST_COUNT: self.request_count,
            ERROR_RATE: self.error_rate,
            P99_LATENCY: self.p99_latency,
            STABLE_P99_LATENCY: self.stable_p99_latency,
            TTFT_P99: self.ttft_p99,
            TPOT_P99: self.tpot_p99,
        }


class CanaryStep(_Strict):
    weight: int = Field(ge=1, le=100, description="percent of traffic routed to the new version")
    window_seconds: Seconds = Field(description="observation window (ignored for 100: that step promotes)")


DEFAULT_STEPS = [
    CanaryStep(weight=1, window_seconds=600),
    CanaryStep(weight=5, window_seconds=1800),
    CanaryStep(weight=50, window_seconds=1800),
    CanaryStep(weight=100, window_seconds=1800),
]


class WarmUp(_Strict):
    """Warm-up of the new version before it sees users; its deadline also covers waiting for Ready."""

    requests: int = Field(20, ge=1, le=10_000)
    max_tokens: int = Field(64, ge=1, le=1_000_000)
    prompt: str = "Summarise the plot of Hamlet in one paragraph."
    deadline_seconds: Seconds = Field(900, description="large models take 5-10 minutes to load")
    max_error_rate: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="warm-up fails (and is retried within the deadline) above this share of failed requests; "
        "sporadic errors are for the canary's error-rate gate to judge, not a reason to roll back before it",
    )


class FleetQueries(_Templates):
    """PromQL templates for what the canary's cause is read from beside its gates (the diagnosis,
    workflows/rollout/diagnosis.py): each version's served request rate (a replica's load is it over
    its Ready pods) and the gateway's requests for the canary that found no healthy upstream (Envoy's
    ``envoy_cluster_upstream_cx_none_healthy``; a gateway that does not export it reads as none)."""

    canary_rps: str = f"sum(rate({HTTP_REQUESTS.name}{{{_selector('version')}}}[${{window}}]))"
    stable_rps: str = f"sum(rate({HTTP_REQUESTS.name}{{{_selector('stable_version')}}}[${{window}}]))"
    no_healthy_upstream: str = f"sum(increase(envoy_cluster_upstream_cx_none_healthy{{{_selector('version')}}}[${{window}}]))"


class Deadlines(_Strict):
    stage_weights_seconds: Seconds = Field(7200, description="download and verification of the weights")
    step_ready_seconds: Seconds = Field(900, description="canary scale-up per step, and scale-up at promotion")
    pause_seconds: Seconds | None = Field(
        None, description="a pause longer than this rolls back (never promotes); None waits for a human"
    )
    lost_capacity_seconds: Seconds = Field(
        900, description="a canary short of Ready pods holds its analysis clock this long for them, then pauses for a human"
    )


SERVING_PORT = 8000  # the engine's port the worker, its NetworkPolicy and the probes assume


class RolloutInput(_Strict):
    """What to roll out where, and how carefully. Weights: ``weights_uri`` + ``sha256``, or neither:
    then they are resolved from the model registry by model and version, and the rollout also
    moves the version's registry status (testing -> canary -> stable, or back) and records its
    warm-up benchmark there."""

    # A refused value is never repeated in the error: a credential in ``env`` would land in the failure.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    deployment: DeploymentName = Field(description="NAMESPACE/NAME of the logical deployment (one HTTPRoute)")
    model: ModelLabel = Field(description="the served model's name; a Kubernetes label value (tideplane.io/model)")
    version: VersionLabel
    image: str = Field(min_length=1, description="serving image, e.g. vllm/vllm-openai:v0.6.3")
    weights_uri: str | None = Field(None, pattern=r"^s3://[^/]+/.+", description="s3://bucket/key")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    gpus_per_replica: int = Field(1, ge=0, le=MAX_GPUS_PER_REPLICA)
    replicas: int | None = Field(
        None, ge=1, le=MAX_REPLICAS, description="size of the promoted version; default: the stable's size"
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1,
        description="share a GPU with other models: each replica requests nvidia.com/gpu.shared: 1 and vLLM claims this"
        " fraction of the GPU's memory (--gpu-memory-utilization); None: whole GPUs (nvidia.com/gpu)",
    )
    port: int = Field(SERVING_PORT, ge=1, le=65535, description="the engine's port: 8000 only (refused otherwise)")
    priority_class: Literal["realtime", "batch"] = Field(
        "realtime", description="realtime: on-demand nodes; batch: spot"
    )
    args: list[str] = Field(default_factory=list)
    env: dict[str, str | EnvFromSecret] = Field(
        default_factory=dict,
        description='NAME: value, or NAME: {"valueFrom": {"secretKeyRef": {"name": SECRET, "key": KEY}}} (credentials must)',
    )
    steps: list[CanaryStep] = Field(default_factory=lambda: list(DEFAULT_STEPS), min_length=1)
    gate_interval_seconds: Seconds = 60
    query_window_seconds: float | None = Field(
        None,
        ge=MIN_WINDOW_SECONDS,
        le=MAX_WINDOW_SECONDS,
        description="${window} of the queries (at least twice the scrape interval); default: the gate interval",
    )
    gates: Gates = Field(default_factory=Gates)
    analysis: AnalysisLimits = Field(default_factory=AnalysisLimits)
    queries: GateQueries = Field(default_factory=GateQueries)
    fleet_queries: FleetQueries = Field(default_factory=FleetQueries)
    warm_up: WarmUp = Field(default_factory=WarmUp)
    deadlines: Deadlines = Field(default_factory=Deadlines)
    replace_model: bool = Field(
        False, description="allow replacing a stable version that serves another model (refused otherwise)"
    )
    scale_down_delay_seconds: SecondsOrZero = Field(600, description="old (or failed) version kept warm this long")
    shadow: ShadowSettings | None = Field(
        None, description="mirror live requests to the canary and gate on answer drift (workflows/quality/golden_set.py)"
    )
    batching: BatchingSweep | None = Field(
        None, description="tune vLLM's batching at warm-up: sweep settings, keep the best within the SLO (workflows/rollout/batching.py)"
    )
    prestage: NodeCacheSettings | None = Field(
        None, description="stage the weights into the pool's node caches, peer to peer, before the version starts"
    )


    @field_validator("sha256", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("env")
    @classmethod
    def _credentials_from_secrets(cls, env: dict[str, str | EnvFromSecret]) -> dict[str, str | EnvFromSecret]:
        """A credential in clear would be written to the Deployment and to the workflow history."""
        if names := plain_credentials(env):
            raise ValueError(
                f"{', '.join(names)} looks like a credential: pass it as"
                ' {"valueFrom": {"secretKeyRef": {"name": SECRET, "key": KEY}}}, not as a plain value'
            )
        return env

    @field_validator("image")
    @classmethod
    def _pinned_image(cls, image: str) -> str:
        """``latest`` or no tag moves under a rollout: the canary, and the stable a rollback returns to, would run whatever it is now."""
        last = image.rsplit("/", 1)[-1]
        if "@" not in image and (":" not in last or last.endswith(":latest")):
            raise ValueError("image has no tag or the tag latest, which moves: pin a version tag or a digest (IMAGE@sha256:...)")
        return image

    @field_validator("args")
    @classmethod
    def _no_credentials_in_args(cls, args: list[str]) -> list[str]:
        """As in env: args are written to the Deployment and to the workflow history."""
        if flags := plain_credential_args(args):
            raise ValueError(
                f"{', '.join(flags)} carries a credential in clear: put it in env as"
                ' {"valueFrom": {"secretKeyRef": {"name": SECRET, "key": KEY}}} and pass "$(NAME)"'
                " in args (vLLM reads VLLM_API_KEY itself)"
            )
        return args

    @field_validator("port")
    @classmethod
    def _served_port(cls, port: int) -> int:
        if port != SERVING_PORT:
            raise ValueError(
                f"only {SERVING_PORT} is supported: the worker's service_url_template"
                f" (TIDEPLANE_SERVICE_URL_TEMPLATE) and the serving NetworkPolicy (infra/k8s) reach the engine"
                f" on {SERVING_PORT}; leave port out"
            )
        return port

    @field_validator("steps")
    @classmethod
    def _ladder(cls, steps: list[CanaryStep]) -> list[CanaryStep]:
        weights = [s.weight for s in steps]
        if any(b <= a for a, b in pairwise(weights)):
            raise ValueError(f"weights must be strictly increasing, got {weights}")
        if weights[-1] != 100:  # 100 % is the promotion, implied when not written
            steps = [*steps, CanaryStep(weight=100, window_seconds=steps[-1].window_seconds)]
        return steps

    @model_validator(mode="after")
    def _bounded_history(self) -> RolloutInput:
        observations = sum(
            required_passes(s.window_seconds, self.gate_interval_seconds) for s in self.steps if s.weight < 100
        )
        if observations > MAX_OBSERVATIONS:
            raise ValueError(
                f"steps/gate_interval_seconds: {observations} gate observations exceed {MAX_OBSERVATIONS}"
                " (workflow history limit); lengthen the interval or shorten the windows"
            )
        return self

    @model_validator(mode="after")
    def _bounded_size(self) -> RolloutInput:
        sizes = {name: len(to_json(getattr(self, name))) for name in type(self).model_fields}
        if sum(sizes.values()) > MAX_INPUT_BYTES:
            largest = max(sizes, key=sizes.__getitem__)
            raise ValueError(
                f"input is {sum(sizes.values())} bytes, over the {MAX_INPUT_BYTES}-byte limit (largest field:"
                f" {largest}, {sizes[largest]} bytes); pass large data by reference (S3, a ConfigMap)"
            )
        return self

    @model_validator(mode="after")
    def _weights_pair(self) -> RolloutInput:
        if (self.weights_uri is None) != (self.sha256 is None):
            missing = "sha256" if self.sha256 is None else "weights_uri"
            raise ValueError(f"{missing} is required when the other of weights_uri/sha256 is given")
        return self

    @model_validator(mode="after")
    def _one_shared_gpu(self) -> RolloutInput:
        if self.gpu_memory_utilization is None:
            return self
        if self.gpus_per_replica != 1:
            raise ValueError(
                f"gpu_memory_utilization: a replica shares one GPU; gpus_per_replica must be 1, got {self.gpus_per_replica}"
            )
        if any(a == GPU_MEMORY_UTILIZATION_FLAG or a.startswith(GPU_MEMORY_UTILIZATION_FLAG + "=") for a in self.args):
            raise ValueError(f"gpu_memory_utilization: also given in args as {GPU_MEMORY_UTILIZATION_FLAG}; give it once")
        return self

    @property
    def ref(self) -> DeploymentRef:
        """``deployment`` as the activities take it."""
        return DeploymentRef.from_name(self.deployment)

    @property
    def query_window(self) -> str:
        """``${window}`` rendered from a number (never user text), within the window bounds."""
        return gate_window(self.query_window_seconds, self.gate_interval_seconds)


class Stage(str, Enum):
    RESOLVING = "resolving"
    STAGING = "staging"
    STARTING = "starting"
    WARMING_UP = "warming_up"
    CANARY = "canary"
    PAUSED = "paused"
    PROMOTING = "promoting"
    PROMOTED = "promoted"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"


class Outcome(str, Enum):
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"  # a gate failed, or the new version could not start
    ABORTED = "aborted"  # a human aborted (or cancelled); rolled back


class VerdictRecord(BaseModel):
    at: datetime
    weight: int
    evaluation: Evaluation
    diagnosis: Diagnosis | None = Field(None, description="the cause behind it (None: the canary fleet was not read)")


class PauseInput(_Strict):
    reason: str = "paused by operator"


class ResumeInput(_Strict):
    pass


class AbortInput(_Strict):
    reason: str = "aborted by operator"


class PromoteInput(_Strict):
    full: bool = Field(False, description="skip every remaining step and go to 100 %")
    force: bool = Field(False, description="promote a paused rollout (ends the pause); refused without it")


class PromoteAck(BaseModel):
    accepted: str
    weight: int


class RolloutStatus(BaseModel):
    deployment: str
    version: str
    stable_version: str | None
    stage: Stage
    weight: int
    step: int | None = Field(None, description="index into steps of the current canary step")
    steps: list[int]
    paused: bool
    pause_reason: str | None
    analysis: StepAnalysis
    last_verdict: VerdictRecord | None
    verdicts: list[VerdictRecord] = Field(description="most recent observations (bounded)")
    timings: dict[str, float] = Field(description="seconds spent per stage, and cold start")
    golden: GoldenVerdict | None = Field(None, description="the golden-set gate's verdict at warm-up")
    shadow: ShadowVerdict | None = Field(None, description="the last shadow comparison's verdict")
    batching: SweepChoice | None = Field(None, description="the batching setting the warm-up's sweep kept")
    nodes: list[NodeCacheProgress] = Field(default_factory=list, description="pre-staging: each node's progress")
    replicas: dict[str, int] = Field(
        default_factory=dict, description="replicas by version as the rollout last sized them (stable's total, the canary's share)"
    )
    diagnosis: Diagnosis | None = Field(None, description="the last observation's cause: regression, overload, lost capacity or healthy")
    holding: str | None = Field(None, description="why the analysis clock is held or the canary re-sized now (None: it runs)")
    download: DownloadProgress | None = Field(None, description="the weights download as stage_weights last reported it")


class RolloutResult(BaseModel):
    deployment: str
    version: str
    previous_version: str | None
    outcome: Outcome
    reason: str
    weight_reached: int
    failing_verdict: VerdictRecord | None = None
    failed_gates: list[GateCheck] = Field(default_factory=list)
    cause: Cause | None = Field(None, description="the failing verdict's cause (regression: the version is deprecated)")
    route_reverted_seconds: float | None = Field(
        None, description="from the failing verdict to the route pointing back at stable"
    )
    cold_start_seconds: float | None = None
    benchmark: Benchmark | None = None
    staged: StagedWeights | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    golden: GoldenVerdict | None = Field(None, description="the golden-set gate's verdict (names failing cases)")
    shadow: ShadowVerdict | None = Field(None, description="the last shadow comparison's verdict (with examples)")
    batching: SweepChoice | None = Field(None, description="the batching setting the warm-up's sweep kept, and why")
