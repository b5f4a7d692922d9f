"""The contract between the ModelRollout workflow and the activities that act for it.

The contract class ``RolloutActivities`` (implemented in activities/rollout/rollout_activities.py), its activity
names and pydantic inputs/outputs live here, in a module with no I/O imports, so the workflow
references them deterministically: ``workflow.execute_activity_method(RolloutActivities.x, ...)``.
Every activity is idempotent: calling it twice with the same input leaves the same state.
"""

from __future__ import annotations

import re

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity

from workflows.core.batching_settings import BatchingSetting, SweepPoint
from workflows.core.naming import DeploymentName, DeploymentRef, rollout_workflow_id
from workflows.core.versions import DeploymentState, WeightFile
from workflows.rollout.diagnosis import CanaryFleet

# Activity names (stable API: histories refer to them).
STAGE_WEIGHTS = "stage_weights"
DESCRIBE_DEPLOYMENT = "describe_deployment"
ENSURE_VERSION = "ensure_version"
SCALE_VERSION = "scale_version"
WAIT_READY = "wait_ready"
SET_ROUTE_WEIGHTS = "set_route_weights"
WARM_UP = "warm_up"
QUERY_GATES = "query_gates"
SWEEP_BATCHING = "sweep_batching"
SET_ENGINE_ARGS = "set_engine_args"
MOVE_ADAPTER_RULES = "move_adapter_rules"
CHECK_SEARCH_ATTRIBUTES = "check_search_attributes"
READ_CANARY_FLEET = "read_canary_fleet"

# The signal stage_weights sends its own rollout with a DownloadProgress (workflows/core/transfer.py).
STAGING_PROGRESS = "staging_progress"

NOTIFY = "notify"

SCHEDULE_RETIRE = "schedule_retire"
CANCEL_RETIRE = "cancel_retire"


class StageWeightsInput(BaseModel):
    model: str
    version: str
    files: list[WeightFile] = Field(min_length=1)
    image: str | None = Field(None, description="the serving image: refused before anything is read when not allowed")
    report_progress: bool = Field(
        False, description="signal the calling workflow (staging_progress) with the download's progress, at a bounded rate"
    )


class StagedWeights(BaseModel):
    path: str = Field(description="directory in the model cache that serving pods mount")
    size_bytes: int
    resumed_bytes: int = Field(0, description="bytes already verified by an earlier attempt, not fetched again")
    seconds: float


class SecretKeyRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="a Secret in the deployment's namespace")
    key: str = Field(min_length=1)


class EnvSource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    secretKeyRef: SecretKeyRef  # noqa: N815 - the Kubernetes field name


class EnvFromSecret(BaseModel):
    """``{"valueFrom": {"secretKeyRef": {"name": ..., "key": ...}}}``: the kubelet reads the value when
    the pod starts, so only the reference is written to the Deployment and the workflow history."""

    model_config = ConfigDict(extra="forbid")

    valueFrom: EnvSource  # noqa: N815 - the Kubernetes field name


# Parts of a variable name (split at "_" and "-") that make it a credential: its value must come
# from a Secret. Whole parts, so TOKENIZERS_PARALLELISM or KEYWORDS stay plain.
CREDENTIAL_WORDS = frozenset(
    {"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "KEYS", "APIKEY",
     "CREDENTIAL", "CREDENTIALS"}
)


def plain_credentials(env: dict[str, str | EnvFromSecret]) -> list[str]:
    """Names in ``env`` that look like credentials but carry their value in clear."""
    return sorted(
        name for name, value in env.items()
        if isinstance(value, str) and CREDENTIAL_WORDS & set(name.upper().replace("-", "_").split("_"))
    )


# Values that are credentials whatever flag carries them (OpenAI, Hugging Face, AWS access key ids, GitHub).
CREDENTIAL_VALUE = re.compile(r"^(sk-|hf_|AKIA|ghp_|xox[bp]-)[A-Za-z0-9_-]{4,}")
# A value written as $(NAME) is expanded by the kubelet from the container's env (a secretKeyRef).
ENV_REFERENCE = re.compile(r"^\$\([A-Za-z_][A-Za-z0-9_]*\)$")


def plain_credential_args(args: list[str]) -> list[str]:
    """Flags in ``args`` whose value is a credential in clear: a flag named like one (``--api-key``,
    ``--hf-token``) with a value other than ``$(NAME)``, or any flag with a value shaped like a key."""
    found = []
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        flag, eq, value = arg.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else ""
        if not value or ENV_REFERENCE.match(value):
            continue
        named = CREDENTIAL_WORDS & set(flag.lstrip("-").upper().replace("-", "_").split("_"))
        if named or CREDENTIAL_VALUE.match(value):
            found.append(flag)
    return found


class EnsureVersionInput(BaseModel):
    deployment: DeploymentRef
    model: str
    version: str
    image: str
    gpus_per_replica: int = Field(ge=0)
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="a share of one GPU (nvidia.com/gpu.shared) claiming this fraction of its memory"
    )
    replicas: int = Field(ge=0)
    weights_path: str
    port: int = 8000
    args: list[str] = Field(default_factory=list)
    env: dict[str, str | EnvFromSecret] = Field(default_factory=dict)
    priority_class: Literal["realtime", "batch"] = Field(
        "realtime",
        description="realtime: on-demand nodes; batch: spot nodes (labels the pods, selects their nodes)",
    )
    owner: str | None = Field(None, description="the rollout's workflow ID: claims the deployment's HTTPRoute first")
    node_cache_files: list[WeightFile] = Field(
        default_factory=list,
        description="the version's files when it was pre-staged onto the nodes: the pods load it from their node's cache"
        " (an init container stages what the node lacks) and prefer nodes that hold it; empty: the shared model cache",
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


class RouteMirror(BaseModel):
    """Gateway API ``RequestMirror`` on the route's first rule: copy ``percent`` % of its requests
    to one version's Service; the gateway discards the mirrored answers."""

    version: str
    percent: int = Field(ge=1, le=100)


class RouteWeightsInput(BaseModel):
    deployment: DeploymentRef
    weights: dict[str, int] = Field(description="version -> weight; weights sum to 100")
    port: int = Field(8000, description="the versions' Service port (EnsureVersionInput.port)")
    owner: str | None = Field(None, description="the rollout's workflow ID: the route is written only by its owner")
    release: bool = Field(False, description="the rollout's last route change: give the route's ownership up")
    mirror: RouteMirror | None = Field(None, description="shadow traffic to a version; None removes tideplane's mirror")
    stable: str | None = Field(
        None, description="the stable version after this change, recorded on the route (tideplane.io/stable-version); None: left as recorded"
    )


class WarmUpInput(BaseModel):
    deployment: DeploymentRef
    version: str
    requests: int = Field(20, ge=1)
    max_tokens: int = 64
    prompt: str = "Summarise the plot of Hamlet in one paragraph."
    model: str | None = Field(None, description="served model name sent as 'model' (ensure_version serves it under the model name)")
    max_error_rate: float = Field(0.5, ge=0, lt=1, description="above this share of failed requests the run fails")


class Benchmark(BaseModel):
    requests: int
    errors: int
    tokens_per_second: float
    p50_latency_seconds: float
    p99_latency_seconds: float


class SweepBatchingInput(BaseModel):
    """Measure each batching setting on the version's own replicas (workflows/rollout/batching.py)."""

    deployment: DeploymentRef
    version: str
    model: str | None = Field(None, description="served model name sent as 'model'")
    candidates: list[BatchingSetting] = Field(min_length=1)
    requests: int = Field(64, ge=1)
    concurrency: int = Field(32, ge=1)
    prompt_tokens: int | None = Field(None, ge=1, description="None: the deployment's recent mean (Prometheus)")
    output_tokens: int | None = Field(None, ge=1)
    settle_seconds: float = Field(2.5, ge=0, description="wait after a run so Prometheus has scraped its last requests")


class SweepBatchingResult(BaseModel):
    points: list[SweepPoint]
    prompt_tokens: int = Field(description="request size the sweep used")
    output_tokens: int


class EngineArgsInput(BaseModel):
    """Give the version's serving container these batching arguments and wait until every replica runs them."""

    deployment: DeploymentRef
    version: str
    setting: BatchingSetting
    poll_seconds: float = 0.5


class GateQueriesInput(BaseModel):
    """Rendered per observation: the activity substitutes ${...} and runs each query."""

    queries: dict[str, str] = Field(description="gate name -> PromQL template")
    variables: dict[str, str] = Field(description="template variables: namespace, deployment, version, stable_version, window")


class GateQueriesResult(BaseModel):
    values: dict[str, float | None] = Field(description="gate name -> scalar result (None: no data)")
    no_series: list[str] = Field(
        default_factory=list, description="gates whose query returned no series at all (a NaN sample is a series)"
    )


class CanaryFleetInput(BaseModel):
    """What to read about the canary beside its gates, at one observation (diagnosis.py)."""

    deployment: DeploymentRef
    version: str = Field(min_length=1, description="the canary")
    stable_version: str = Field(min_length=1)
    weight: int = Field(ge=0, le=100, description="the canary's route weight the step set")
    canary_wanted: int = Field(ge=0, description="canary replicas the step sized")
    queries: dict[str, str] = Field(description="canary_rps, stable_rps, no_healthy_upstream -> PromQL template (FleetQueries)")
    variables: dict[str, str] = Field(description="template variables, as for the gates")


class MoveAdapterRulesInput(BaseModel):
    """Re-point the adapter rules on ``from_version``'s Service at ``to_version``'s (None: remove them)."""

    deployment: DeploymentRef
    from_version: str
    to_version: str | None


class RolloutActivities:
    """What ModelRollout asks of S3, the cluster, the new version's endpoint and Prometheus
    (implemented in activities/rollout/rollout_activities.py)."""

    @activity.defn(name=CHECK_SEARCH_ATTRIBUTES)
    async def check_search_attributes(self) -> list[str]:
        """tideplane's search attributes (workflows/core/search_attributes.py) that the run's namespace
        lacks, by name; [] when all are there or the server cannot list them."""
        raise NotImplementedError

    @activity.defn(name=STAGE_WEIGHTS)
    def stage_weights(self, req: StageWeightsInput) -> StagedWeights:
        """Download and verify every weights file into the model cache that serving pods mount."""
        raise NotImplementedError

    @activity.defn(name=DESCRIBE_DEPLOYMENT)
    def describe_deployment(self, ref: DeploymentRef) -> DeploymentState:
        """The versions of a logical deployment in the cluster, their replicas and route weights."""
        raise NotImplementedError

    @activity.defn(name=ENSURE_VERSION)
    def ensure_version(self, req: EnsureVersionInput) -> None:
        """Create or update the Deployment and Service for one version (no route change)."""
        raise NotImplementedError

    @activity.defn(name=SCALE_VERSION)
    def scale_version(self, req: ScaleVersionInput) -> None:
        """Set one version's replicas."""
        raise NotImplementedError

    @activity.defn(name=WAIT_READY)
    def wait_ready(self, req: WaitReadyInput) -> ReadyResult:
        """Until ``replicas`` pods of the version are Ready (heartbeats; the caller bounds the wait)."""
        raise NotImplementedError

    @activity.defn(name=SET_ROUTE_WEIGHTS)
    def set_route_weights(self, req: RouteWeightsInput) -> None:
        """Make the HTTPRoute send exactly these weights to the versions' Services."""
        raise NotImplementedError

    @activity.defn(name=WARM_UP)
    def warm_up(self, req: WarmUpInput) -> Benchmark:
        """Warm the new version up through its own Service and benchmark it."""
        raise NotImplementedError

    @activity.defn(name=QUERY_GATES)
    def query_gates(self, req: GateQueriesInput) -> GateQueriesResult:
        """Each gate's PromQL template rendered and run as an instant query."""
        raise NotImplementedError

    @activity.defn(name=MOVE_ADAPTER_RULES)
    def move_adapter_rules(self, req: MoveAdapterRulesInput) -> list[str]:
        """At promotion, re-point (or remove) the LoRA adapters' rules of the HTTPRoute; the adapters' names it moved."""
        raise NotImplementedError


class BatchingActivities:
    """How ModelRollout tunes batching at warm-up on the new version's own replicas (implemented in
    activities/rollout/batching_activities.py; the choice among the measured settings is workflows/rollout/batching.py)."""

    @activity.defn(name=SWEEP_BATCHING)
    def sweep_batching(self, req: SweepBatchingInput) -> SweepBatchingResult:
        """Per candidate: its engine args on the version's replicas, a load run, vLLM's TTFT/TPOT p99 of it."""
        raise NotImplementedError

    @activity.defn(name=SET_ENGINE_ARGS)
    def set_engine_args(self, req: EngineArgsInput) -> None:
        """The version's Deployment with these batching arguments, rolled out to every replica."""
        raise NotImplementedError


class CanaryFleetActivities:
    """What ModelRollout reads about its canary's pods and load to name a verdict's cause
    (implemented in activities/rollout/canary_fleet.py)."""

    @activity.defn(name=READ_CANARY_FLEET)
    def read_canary_fleet(self, req: CanaryFleetInput) -> CanaryFleet:
        """Ready and crashed (OOMKilled, CrashLoopBackOff) pods of both versions from the Kubernetes API,
        their request rates and the gateway's no-healthy-upstream count from Prometheus."""
        raise NotImplementedError


class NoticeKind(str, Enum):
    """What happened to the rollout that people are told about."""

    PAUSED = "paused"
    RESUMED = "resumed"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"
    PROMOTED = "promoted"


class NoticeInput(BaseModel):
    """One notice of one run: ``seq`` numbers the run's notices, so (run_id, seq) is its key and a
    retried delivery writes the same Kubernetes Event instead of a second one."""

    deployment: DeploymentRef
    version: str = Field(min_length=1, description="the version this run rolls out (its Deployment is the Event's object)")
    kind: NoticeKind
    message: str = Field(description="why: the pause reason, the verdict, the promotion")
    weight: int = Field(ge=0, le=100, description="the new version's route weight when it happened")
    workflow_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    namespace: str = Field(min_length=1, description="the Temporal namespace, for the web UI link")
    seq: int = Field(ge=1)


class NotifyActivities:
    """How ModelRollout tells people (implemented in activities/rollout/notify_activities.py): a
    Kubernetes Event on the version's Deployment and the optional webhook. Best effort: the workflow
    logs a failed delivery and goes on."""

    @activity.defn(name=NOTIFY)
    def notify(self, notice: NoticeInput) -> None:
        """Write the notice's Event (an existing one counts as written), then post the webhook if one is set."""
        raise NotImplementedError


def retire_workflow_id(deployment: str, version: str) -> str:
    """One pending scale-down per version of a deployment: ``rollout/<ns>/<name>/retire/<version>``."""
    return f"{rollout_workflow_id(deployment)}/retire/{version}"


class RetireInput(BaseModel):
    """A version that no longer carries traffic, to scale to 0 once ``delay_seconds`` have passed."""

    model_config = ConfigDict(extra="forbid")

    deployment: DeploymentName = Field(description="NAMESPACE/NAME of the logical deployment")
    version: str = Field(min_length=1, description="the version that no longer carries traffic")
    delay_seconds: float = Field(ge=0, le=10 * 365 * 86400, description="kept warm this long (scale_down_delay_seconds)")
    reason: str = Field("", description="why it is retired, for the UI")


class CancelRetireInput(BaseModel):
    deployment: DeploymentName
    version: str = Field(min_length=1)


class RetireScheduling:
    """How ModelRollout leaves a delayed scale-down to a RetireVersion workflow of its own
    (workflows/rollout/retire_version.py) and takes it back; implemented in activities/rollout/retire_scheduling.py with the
    worker's Temporal client."""

    @activity.defn(name=SCHEDULE_RETIRE)
    async def schedule_retire(self, req: RetireInput) -> str:
        """Start RetireVersion under ``retire_workflow_id``; one already pending for the version is kept."""
        raise NotImplementedError

    @activity.defn(name=CANCEL_RETIRE)
    async def cancel_retire(self, req: CancelRetireInput) -> str:
        """Cancel the version's pending RetireVersion and wait until it ended (none pending: nothing to do)."""
        raise NotImplementedError
