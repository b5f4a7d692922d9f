"""What a ReactiveScaling loop is given, carries from one run to the next at continue-as-new, and
reports: its input, its decisions, its pending scale-up and warm pool claim, its status (pure pydantic)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

import workflows.core.naming as naming
import workflows.scaling.contract as acts
from workflows.core.bounds import DAY_SECONDS, MAX_ITERATIONS, PromWindow
from workflows.scaling.cpu_fallback import CpuFallbackState
from workflows.scaling.decide import ScalerState, ScalingPolicy, Signals, Trigger
from workflows.scaling.floors import FloorClaim


class WarmFloorClaim(BaseModel):
    """The warm pool floor this loop holds on a NodePoolScaling loop (``nodepool/<pool>``)."""

    pool: str
    replicas: int
    claimed_at: datetime | None = Field(None, description="last sent with a TTL (None: claimed before claims lapsed)")


class SpotMixRecord(BaseModel):
    """How the decided total was placed: spot replicas per pool and the on-demand base (plan_mix)."""

    version: str
    spot: dict[str, int]
    on_demand: int
    availability: float = Field(description="P(Ready >= target) under the plan's model")
    cost_per_hour: float
    unavailable: list[str] = Field(default_factory=list, description="pools read unavailable now")
    warm_pool: int = Field(0, description="stopped on-demand instances that cover the plan's worst loss in time (warm_pool_needed)")
    own: int = Field(0, description="replicas still on the versioned Deployment until the pools carry the total (applied again until 0)")


class DecisionRecord(BaseModel):
    at: datetime
    current: int
    desired: int
    ready: int | None = None
    unschedulable: int = 0
    floor: int = 0
    applied: bool = False
    reason: str
    capped_by: str | None = None
    triggers: list[Trigger] = Field(default_factory=list)
    signals: Signals | None = None
    fallback_replicas: int | None = Field(None, description="CPU fallback replicas wanted (batch with cpu_fallback)")
    fallback_reason: str | None = None
    spot_mix: SpotMixRecord | None = Field(None, description="the split applied (with a spot_mix policy)")


class PendingScaleUp(BaseModel):
    """A scale-up whose replicas are not all Ready yet: its cold start runs from ``decided_at``."""

    decided_at: datetime
    target: int = Field(ge=1, description="replicas that must be Ready")
    pool: str = Field(description="the priority class the replicas run in")


class LastScaleUp(BaseModel):
    """The last scale-up whose replicas all became Ready: how long, and its newest replica's start by parts."""

    at: datetime
    replicas: int
    seconds: float
    cold_start: acts.ColdStart | None = None


class ScalingCarry(BaseModel):
    """What a run hands to the next one at continue-as-new."""

    state: ScalerState = Field(default_factory=ScalerState)
    floors: dict[str, FloorClaim] = Field(default_factory=dict, description="source -> floor")
    paused: bool = False
    pause_reason: str = ""
    decisions: list[DecisionRecord] = Field(default_factory=list)
    runs: int = Field(0, description="runs before this one")
    fallback: CpuFallbackState = Field(default_factory=CpuFallbackState)
    fallback_applied: int | None = Field(None, description="CPU fallback replicas last set (None: not yet)")
    scale_up: PendingScaleUp | None = Field(None, description="the scale-up whose replicas are not all Ready yet")
    last_scale_up: LastScaleUp | None = None
    spot_history: dict[str, list[int]] = Field(default_factory=dict, description="spot pool -> recent samples, 1 = unavailable")
    spot_mix_applied: SpotMixRecord | None = Field(None, description="the split last written")
    warm_floor: WarmFloorClaim | None = Field(None, description="the warm pool floor last claimed")
    queue_limit_written: bool = Field(False, description="a gateway queue limit was written and not taken out since")


class ScalingInput(BaseModel):
    deployment: naming.DeploymentName = Field(description="NAMESPACE/NAME of the logical deployment")
    version: str | None = Field(None, description="version to scale; None: the one with the most traffic")
    policy: ScalingPolicy = Field(default_factory=ScalingPolicy)
    interval_seconds: float = Field(30, ge=1, le=DAY_SECONDS)
    iterations_per_run: int = Field(240, ge=1, le=MAX_ITERATIONS, description="decisions per run before continue-as-new")
    queries: dict[str, str] = Field(default_factory=dict, description="overrides of the default signal queries, by name")
    window: PromWindow = Field("1m", description="rate window of the signal queries: 30s, 5m, 1h30m or seconds (>= 1 s)")
    carry: ScalingCarry | None = None


    @field_validator("queries")
    @classmethod
    def _known(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = set(value) - set(acts.DEFAULT_SIGNAL_QUERIES)
        if unknown:
            raise ValueError(f"unknown signal queries {sorted(unknown)}; known: {sorted(acts.DEFAULT_SIGNAL_QUERIES)}")
        return value


class OperatorNote(BaseModel):
    reason: str = ""


# Every field of ScalingPolicy, optional: `update_policy` changes only the fields given (null: unchanged).
PolicyPatch = create_model(
    "PolicyPatch",
    __config__=ConfigDict(extra="forbid"),
    **{name: (field.annotation | None, None) for name, field in ScalingPolicy.model_fields.items()},
)


class ScalingStatus(BaseModel):
    deployment: str
    paused: bool
    pause_reason: str
    policy: ScalingPolicy
    floor: int
    floors: dict[str, FloorClaim]
    decisions: list[DecisionRecord]
    runs: int
    iteration: int
    last_scale_up: LastScaleUp | None = None


def claimed(claim: WarmFloorClaim | None) -> tuple[str, int] | None:
    """What a claim asks for, whenever it was sent."""
    return (claim.pool, claim.replicas) if claim is not None else None


def cold_start_line(up: LastScaleUp) -> str:
    """The last scale-up for the UI: its time to Ready and its newest replica's start by parts."""
    line = f"last scale-up {up.at:%H:%M:%S}Z: {up.replicas} replica(s) Ready in {up.seconds:.0f}s"
    if up.cold_start is not None:
        parts = ", ".join(f"{part} {seconds:g}s" for part, seconds in up.cold_start.parts.items())
        line += f" · newest replica's start: {parts} (pod {up.cold_start.pod})"
    return line
