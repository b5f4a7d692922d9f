"""CPU fallback for the batch class: pure rule, plain values in, fallback replicas out.

When a batch deployment's GPU replicas stay unavailable (fewer Ready than wanted: pods
Unschedulable on a reclaimed or exhausted spot pool, or still loading) past a deadline, a
declared CPU deployment takes the work; once the GPU replicas are back and have stayed back for a
stabilisation window it goes to zero again. Realtime deployments never fall back: their floor is
kept on on-demand GPUs instead (ScalingPolicy refuses a fallback for them).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from workflows.core.bounds import MAX_REPLICAS, SecondsOrZero
from workflows.core.naming import DeploymentName


class CpuFallback(BaseModel):
    deployment: DeploymentName = Field(description="NAMESPACE/NAME of the CPU deployment (laid out like the GPU one)")
    version: str = Field(description="its version: the Deployment scaled is versioned_name(name, version)")
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="CPU replicas while the GPU replicas are unavailable")
    after_seconds: SecondsOrZero = Field(300, description="GPU replicas short this long before falling back")
    stabilisation_seconds: SecondsOrZero = Field(300, description="GPU replicas back this long before the fallback goes")



class CpuFallbackState(BaseModel):
    """What the rule remembers between decisions (carried across continue-as-new)."""

    short_since_s: float | None = Field(None, description="GPU replicas short since")
    back_since_s: float | None = Field(None, description="GPU replicas back since, while falling back")
    active: bool = False


class CpuFallbackDecision(BaseModel):
    replicas: int = Field(description="CPU fallback replicas wanted now")
    reason: str
    state: CpuFallbackState


def decide_fallback(
    now_s: float, desired: int, ready: int, unschedulable: int, fallback: CpuFallback, state: CpuFallbackState
) -> CpuFallbackDecision:
    """CPU replicas for ``fallback`` given the GPU deployment's ``desired`` and ``ready`` replicas."""
    short_since, back_since, active = state.short_since_s, state.back_since_s, state.active
    gpu = f"{ready}/{desired} GPU replica(s) Ready" + (f", {unschedulable} Unschedulable" if unschedulable else "")
    if ready < desired:
        short_since = now_s if short_since is None else short_since
        back_since = None
        short_for = now_s - short_since
        if active:
            reason = f"fallback kept at {fallback.replicas}: {gpu}"
        elif short_for >= fallback.after_seconds:
            active = True
            reason = f"fallback up to {fallback.replicas}: {gpu} for {short_for:.0f}s (deadline {fallback.after_seconds:.0f}s)"
        else:
            reason = f"no fallback yet: {gpu} for {short_for:.0f}s of {fallback.after_seconds:.0f}s"
    else:
        short_since = None
        if active:
            back_since = now_s if back_since is None else back_since
            back_for = now_s - back_since
            if back_for >= fallback.stabilisation_seconds:
                active, back_since = False, None
                reason = f"fallback down to 0: {gpu} for {back_for:.0f}s"
            else:
                reason = f"fallback kept at {fallback.replicas}: GPU back for {back_for:.0f}s of {fallback.stabilisation_seconds:.0f}s"
        else:
            reason = f"no fallback: {gpu}"
    return CpuFallbackDecision(
        replicas=fallback.replicas if active else 0,
        reason=reason,
        state=CpuFallbackState(short_since_s=short_since, back_since_s=back_since, active=active),
    )
