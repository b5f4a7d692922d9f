"""The shadow comparison: live requests mirrored to the canary; each recorded (stable answer,
canary answer) pair is compared by cheap, explainable measures (``shadow_measures``), and
``shadow_verdict`` fails on drift past a threshold, with examples. Pure: the activity only reads
the pairs (workflows/quality/contract.py)."""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workflows.quality.golden_set import EXAMPLES, parse_json_answer


# Cheap and explainable: the openings models use to decline. Matched at the start of an answer
# or of its first sentence, case-insensitive.
REFUSAL = re.compile(
    r"^\s*(i'?m sorry|i am sorry|sorry, |i can(?:no|')t|i cannot|i am unable|i'm unable|as an ai\b|i won'?t)",
    re.IGNORECASE,
)


class ShadowThresholds(BaseModel):
    """Drift limits of the canary's mirrored answers against stable's on the same requests."""

    model_config = ConfigDict(extra="forbid")

    min_pairs: int = Field(20, ge=1, description="fewer pairs in a window: inconclusive, not a pass")
    min_exact_agreement: float = Field(
        0.9, ge=0, le=1, description="share of pairs answered identically (deterministic sampling)"
    )
    max_length_ratio: float = Field(
        1.5, ge=1, description="canary/stable mean answer length must stay within [1/x, x]"
    )
    max_refusal_increase: float = Field(0.05, ge=0, le=1, description="canary's refusal rate minus stable's")
    max_json_invalid_increase: float = Field(
        0.02, ge=0, le=1, description="structured endpoints: canary's invalid-JSON rate minus stable's"
    )


class ShadowSettings(BaseModel):
    """Mirror a sample of live requests to the canary (HTTPRoute RequestMirror) and compare answers."""

    model_config = ConfigDict(extra="forbid")

    percent: int = Field(10, ge=1, le=100, description="share of the route's requests mirrored to the canary")
    structured: bool = Field(False, description="the endpoint answers JSON: compare JSON validity too")
    thresholds: ShadowThresholds = Field(default_factory=ShadowThresholds)


class ShadowPair(BaseModel):
    """One live request answered by stable (the user's answer) and by the canary (discarded)."""

    seq: int
    prompt: str
    stable_answer: str
    canary_answer: str


class ShadowMeasures(BaseModel):
    pairs: int
    exact_agreement: float
    length_ratio: float = Field(description="canary mean answer length / stable's")
    stable_refusal_rate: float
    canary_refusal_rate: float
    stable_json_invalid_rate: float | None = None
    canary_json_invalid_rate: float | None = None


class ShadowVerdict(BaseModel):
    verdict: Literal["pass", "fail", "inconclusive"]
    measures: ShadowMeasures
    failed: list[str] = Field(default_factory=list, description="the measures past their threshold, with numbers")
    examples: list[ShadowPair] = Field(default_factory=list, description="a few pairs that disagree")

    def describe(self) -> str:
        m = self.measures
        head = (
            f"shadow ({m.pairs} pairs): agreement {m.exact_agreement:.0%}, length ×{m.length_ratio:.2f}, "
            f"refusals {m.canary_refusal_rate:.0%} vs {m.stable_refusal_rate:.0%}"
        )
        if self.verdict == "fail":
            return f"{head} — FAIL: {'; '.join(self.failed)}"
        return f"{head} — {self.verdict}"


def where_they_differ(stable: str, canary: str, width: int = 60) -> tuple[str, str]:
    """Both answers cut to ``width`` characters from just before their first difference, so an
    example shows what changed (a padded answer differs only at its end)."""
    first = next((i for i, (a, b) in enumerate(zip(stable, canary)) if a != b), min(len(stable), len(canary)))
    start = max(0, first - 20)

    def cut(text: str) -> str:
        return ("…" if start else "") + text[start : start + width] + ("…" if len(text) > start + width else "")

    return cut(stable), cut(canary)


def describe_pair(pair: ShadowPair) -> str:
    stable, canary = where_they_differ(pair.stable_answer, pair.canary_answer)
    return f"{pair.prompt!r}: stable {stable!r} / canary {canary!r}"


def is_refusal(answer: str) -> bool:
    return bool(REFUSAL.match(answer))


def shadow_measures(pairs: list[ShadowPair], structured: bool = False) -> ShadowMeasures:
    n = len(pairs)
    if n == 0:
        return ShadowMeasures(pairs=0, exact_agreement=1.0, length_ratio=1.0, stable_refusal_rate=0.0, canary_refusal_rate=0.0)
    stable_len = sum(len(p.stable_answer) for p in pairs) / n
    canary_len = sum(len(p.canary_answer) for p in pairs) / n
    ratio = canary_len / stable_len if stable_len else (1.0 if not canary_len else math.inf)
    measures = ShadowMeasures(
        pairs=n,
        exact_agreement=round(sum(p.stable_answer.strip() == p.canary_answer.strip() for p in pairs) / n, 4),
        length_ratio=round(ratio, 4) if math.isfinite(ratio) else 1e9,
        stable_refusal_rate=round(sum(is_refusal(p.stable_answer) for p in pairs) / n, 4),
        canary_refusal_rate=round(sum(is_refusal(p.canary_answer) for p in pairs) / n, 4),
    )
    if structured:
        measures.stable_json_invalid_rate = round(sum(parse_json_answer(p.stable_answer)[1] is not None for p in pairs) / n, 4)
        measures.canary_json_invalid_rate = round(sum(parse_json_answer(p.canary_answer)[1] is not None for p in pairs) / n, 4)
    return measures


def shadow_verdict(pairs: list[ShadowPair], settings: ShadowSettings) -> ShadowVerdict:
    """Pass, fail (with the measures past their threshold and disagreeing pairs) or inconclusive
    (too few pairs in the window: never a pass on no evidence)."""
    limits = settings.thresholds
    m = shadow_measures(pairs, settings.structured)
    failed = []
    if m.exact_agreement + 1e-9 < limits.min_exact_agreement:
        failed.append(f"exact agreement {m.exact_agreement:.0%} < {limits.min_exact_agreement:.0%}")
    if not 1 / limits.max_length_ratio - 1e-9 <= m.length_ratio <= limits.max_length_ratio + 1e-9:
        failed.append(f"answer length ratio {m.length_ratio:.2f} outside [{1 / limits.max_length_ratio:.2f}, {limits.max_length_ratio:.2f}]")
    if m.canary_refusal_rate - m.stable_refusal_rate > limits.max_refusal_increase + 1e-9:
        failed.append(
            f"refusal rate {m.canary_refusal_rate:.0%} vs stable {m.stable_refusal_rate:.0%} (> +{limits.max_refusal_increase:.0%})"
        )
    if m.canary_json_invalid_rate is not None and m.stable_json_invalid_rate is not None:
        if m.canary_json_invalid_rate - m.stable_json_invalid_rate > limits.max_json_invalid_increase + 1e-9:
            failed.append(
                f"invalid JSON {m.canary_json_invalid_rate:.0%} vs stable {m.stable_json_invalid_rate:.0%} "
                f"(> +{limits.max_json_invalid_increase:.0%})"
            )
    if m.pairs < limits.min_pairs:
        return ShadowVerdict(verdict="inconclusive", measures=m, failed=[f"{m.pairs} pairs < {limits.min_pairs}"])
    examples = [p for p in pairs if p.stable_answer.strip() != p.canary_answer.strip()][:EXAMPLES]
    return ShadowVerdict(verdict="fail" if failed else "pass", measures=m, failed=failed, examples=examples if failed else [])
