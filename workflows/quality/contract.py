"""What ModelRollout's quality gates ask of the new version, the shadow recorder and the registry.

The contract class ``QualityActivities`` (implemented in activities/quality/) and its pydantic inputs
and outputs, without I/O, so the workflow references them deterministically. Activity names are a
stable API (recorded histories refer to them).
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from workflows.core.naming import DeploymentRef
from workflows.core.verdicts import CaseResult
from workflows.quality.golden_set import GoldenRevision, GoldenSet
from workflows.quality.shadow import ShadowPair, ShadowTally

# Activity names (stable API: histories refer to them).
RUN_GOLDEN_SET = "run_golden_set"
READ_SHADOW_PAIRS = "read_shadow_pairs"  # runs from before shadow-tally only
JUDGE_SHADOW_PAIRS = "judge_shadow_pairs"
READ_GOLDEN_SET = "read_golden_set"


class GoldenRunInput(BaseModel):
    """Ask every case of the golden set of the new version and of stable, with temperature 0."""

    deployment: DeploymentRef
    model: str
    version: str
    stable_version: str | None = None
    golden: GoldenSet


class GoldenRunResult(BaseModel):
    new: list[CaseResult]
    stable: list[CaseResult] | None = None


class ShadowPairsInput(BaseModel):
    deployment: DeploymentRef
    version: str = Field(description="the canary whose mirrored answers are compared")
    stable_version: str
    after: int = Field(0, ge=0, description="read pairs recorded after this sequence number")


class ShadowPairsResult(BaseModel):
    pairs: list[ShadowPair]
    last: int = Field(description="pass as 'after' next time")


class ShadowJudgeInput(BaseModel):
    deployment: DeploymentRef
    version: str = Field(description="the canary whose mirrored answers are compared")
    stable_version: str
    after: int = Field(0, ge=0, description="count pairs recorded after this sequence number")
    structured: bool = Field(False, description="count invalid JSON answers too")


class ShadowJudgement(BaseModel):
    """The counts of the pairs recorded since ``after`` (never the pairs: they are user traffic)."""

    tally: ShadowTally
    read: int = Field(description="pairs read from the recorder, this rollout's or not")
    last: int = Field(description="pass as 'after' next time")


class GoldenSetInput(BaseModel):
    model: str


class GoldenSetFound(BaseModel):
    current: GoldenRevision | None = Field(None, description="None: the model has no golden set")


class QualityActivities:
    """The golden set against the new version and stable, the mirrored pairs of the shadow comparison,
    and the model's golden set as the registry stores it (activities/quality/)."""

    @activity.defn(name=RUN_GOLDEN_SET)
    def run_golden_set(self, req: GoldenRunInput) -> GoldenRunResult:
        """The golden set against the new version's and stable's own Services, each answer graded."""
        raise NotImplementedError

    @activity.defn(name=READ_SHADOW_PAIRS)
    def read_shadow_pairs(self, req: ShadowPairsInput) -> ShadowPairsResult:
        """The (stable answer, canary answer) pairs of mirrored live requests recorded since ``after``."""
        raise NotImplementedError

    @activity.defn(name=JUDGE_SHADOW_PAIRS)
    def judge_shadow_pairs(self, req: ShadowJudgeInput) -> ShadowJudgement:
        """Every (stable answer, canary answer) pair recorded since ``after``, read page by page and
        counted here: only the counts and a few cut examples go back to the workflow."""
        raise NotImplementedError

    @activity.defn(name=READ_GOLDEN_SET)
    def read_golden_set(self, req: GoldenSetInput) -> GoldenSetFound:
        """The model's current golden set (the rollout's warm-up gate runs it)."""
        raise NotImplementedError
