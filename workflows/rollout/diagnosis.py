"""Why a canary observation looks as it does: a regression of the version, an overload of the
canary, or capacity the canary lost (issue 32, items 3 and 4).

A gate verdict alone cannot tell a worse version from a canary that is simply carrying more than
its share, or from one whose pods were reclaimed: the gateway answers 503 for a backend with no
live pod, and the pods that are gone count nothing. ``diagnose`` reads what the cluster and the
gateway said about the canary beside the verdict and names the cause; the workflow acts on it:

- ``regression``: the version is worse (a gate failed at a load no heavier than the stable's, or a
  canary pod was OOM-killed or is in a crash loop): roll back, and the registry deprecates it;
- ``overload``: only latency gates failed while each canary replica carried more than
  ``max_load_ratio`` times a stable replica's load: no verdict on the version; the step is re-sized
  (``replicas`` carry the canary's share at the stable's per-replica load) and its evidence restarts;
- ``lost_capacity``: fewer canary pods are Ready than the step asked for, or the gateway found no
  healthy canary upstream: the analysis clock pauses, the weights are re-planned onto the live pods
  (``live_weight``) until the lost pods are back; never a verdict on the version.

Pure code (plain values in, plain values out): the workflow, the unit tests and the coordination
bench (benchmarks/coordination.py) run the same function.
"""

from __future__ import annotations

import math
from enum import Enum

from pydantic import BaseModel, Field

from workflows.rollout.gates import (
    P99_LATENCY,
    P99_LATENCY_SLO,
    TPOT_P99,
    TTFT_P99,
    Evaluation,
    Verdict,
)

# Gates whose failure a heavier load explains (an error rate does not: an overloaded vLLM queues, it
# does not answer 5xx).
LATENCY_GATES = frozenset({P99_LATENCY, P99_LATENCY_SLO, TTFT_P99, TPOT_P99})
MAX_LOAD_RATIO = 1.25  # a canary replica may carry this much more than a stable one before it is "overloaded"
CRASH_REASONS = ("OOMKilled", "CrashLoopBackOff")


class Cause(str, Enum):
    HEALTHY = "healthy"
    REGRESSION = "regression"
    OVERLOAD = "overload"
    LOST_CAPACITY = "lost_capacity"


class CanaryFleet(BaseModel):
    """What the cluster and the gateway said about the canary at one observation."""

    weight: int = Field(ge=0, le=100, description="the canary's route weight the step set")
    canary_wanted: int = Field(ge=0, description="canary replicas the step sized")
    canary_ready: int = Field(ge=0, description="canary replicas Ready now")
    stable_ready: int = Field(0, ge=0)
    crashed: dict[str, str] = Field(
        default_factory=dict, description="canary pod -> OOMKilled or CrashLoopBackOff (its last termination or its wait)"
    )
    no_healthy_upstream: float = Field(0, ge=0, description="gateway requests for the canary that found no live pod (window)")
    canary_rps: float | None = Field(None, description="requests per second the canary's pods served")
    stable_rps: float | None = Field(None, description="requests per second the stable's pods served")


class Diagnosis(BaseModel):
    cause: Cause
    reason: str = ""
    load_ratio: float | None = Field(None, description="a canary replica's load over a stable replica's")
    live_weight: int | None = Field(None, description="lost capacity: the weight the live canary pods can carry")
    replicas: int | None = Field(None, description="overload: canary replicas at the stable's per-replica load")

    def describe(self) -> str:
        """One line for current details: the cause, why, and the load ratio it was judged at."""
        text = self.cause.value + (f": {self.reason}" if self.reason else "")
        if self.load_ratio is not None and "load" not in self.reason:
            text += f" (canary replica load {self.load_ratio:.2f}x a stable replica's)"
        return text

    @property
    def deprecates(self) -> bool:
        """Only a regression says the version is bad (the registry deprecates it)."""
        return self.cause is Cause.REGRESSION


def load_ratio(fleet: CanaryFleet) -> float | None:
    """A canary replica's load over a stable replica's (None: unknown, e.g. no stable traffic)."""
    if fleet.canary_rps is None or fleet.stable_rps is None or not fleet.stable_ready or not fleet.canary_ready:
        return None
    per_stable = fleet.stable_rps / fleet.stable_ready
    if per_stable <= 0:
        return None
    return (fleet.canary_rps / fleet.canary_ready) / per_stable


def live_weight(weight: int, ready: int, wanted: int) -> int:
    """The weight ``ready`` of ``wanted`` canary pods carry at the load per pod the step planned."""
    if wanted <= 0 or ready >= wanted:
        return weight
    return math.floor(weight * ready / wanted)


def sized_for_load(fleet: CanaryFleet) -> int | None:
    """Canary replicas that carry its traffic at the stable's per-replica load."""
    if fleet.canary_rps is None or fleet.stable_rps is None or not fleet.stable_ready or fleet.stable_rps <= 0:
        return None
    return max(1, math.ceil(fleet.canary_rps / (fleet.stable_rps / fleet.stable_ready) - 1e-9))


def diagnose(evaluation: Evaluation, fleet: CanaryFleet, max_load_ratio: float = MAX_LOAD_RATIO) -> Diagnosis:
    """The cause behind one observation (``healthy`` when there is nothing to explain)."""
    ratio = load_ratio(fleet)
    if fleet.crashed:
        pods = ", ".join(f"{pod} {why}" for pod, why in sorted(fleet.crashed.items()))
        return Diagnosis(cause=Cause.REGRESSION, reason=f"canary pod(s) crashed: {pods}", load_ratio=ratio)
    lost = fleet.canary_ready < fleet.canary_wanted
    if lost or fleet.no_healthy_upstream > 0:
        live = live_weight(fleet.weight, fleet.canary_ready, fleet.canary_wanted)
        what = (
            f"{fleet.canary_wanted - fleet.canary_ready} of {fleet.canary_wanted} canary pod(s) lost"
            if lost else f"the gateway found no healthy canary upstream {fleet.no_healthy_upstream:.4g} time(s)"
        )
        return Diagnosis(cause=Cause.LOST_CAPACITY, reason=what, load_ratio=ratio, live_weight=live)
    if evaluation.verdict is not Verdict.FAIL:
        return Diagnosis(cause=Cause.HEALTHY, load_ratio=ratio)
    failed = {c.gate for c in evaluation.failed}
    if failed <= LATENCY_GATES and ratio is not None and ratio > max_load_ratio:
        return Diagnosis(
            cause=Cause.OVERLOAD,
            reason=f"a canary replica carries {ratio:.2f}x a stable replica's load (> {max_load_ratio:g}x);"
            f" failed {', '.join(sorted(failed))} under that load, no verdict on the version",
            load_ratio=ratio,
            replicas=sized_for_load(fleet),
        )
    at = f" at {ratio:.2f}x a stable replica's load" if ratio is not None else ""
    return Diagnosis(cause=Cause.REGRESSION, reason=f"failed {', '.join(sorted(failed))}{at}", load_ratio=ratio)
