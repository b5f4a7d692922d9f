"""What the golden-set gate concluded about a version: each case's result and the verdict.

The quality capability grades the cases and decides (workflows/quality/golden_set.py); the
rollout reports the verdict in its status and result, and the registry keeps it with the warm-up
benchmark (``BenchmarkResult.golden``). Pure pydantic.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class CaseResult(BaseModel):
    """One case on one version: pass, or the checks it failed (and an excerpt of the answer)."""

    id: str
    passed: bool
    failures: list[str] = Field(default_factory=list)
    answer: str = ""


class GoldenVerdict(BaseModel):
    passed: bool
    golden_revision: int | None = None
    cases: int
    new_pass_rate: float
    stable_pass_rate: float | None = None
    min_pass_rate: float
    margin: float
    failing_cases: list[str] = Field(default_factory=list, description="cases the new version failed")
    must_pass_failed: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    examples: list[CaseResult] = Field(default_factory=list, description="a few failing cases with their answers")

    def describe(self) -> str:
        head = f"golden set: new {self.new_pass_rate:.0%}"
        if self.stable_pass_rate is not None:
            head += f", stable {self.stable_pass_rate:.0%}"
        head += f" of {self.cases} cases"
        if self.passed:
            return f"{head} — pass"
        return f"{head} — FAIL: {'; '.join(self.reasons)}"
