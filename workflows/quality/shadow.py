"""The shadow comparison: live requests mirrored to the canary; each recorded (stable answer,
canary answer) pair is compared by cheap, explainable measures (``shadow_measures``), and
``verdict_of`` fails on drift past a threshold, with examples. Pure: the activity reads the pairs
and counts them (``tally``), so the pairs (user traffic) never pass through workflow history; the
workflow adds the counts of a window's reads and judges them (workflows/quality/contract.py)."""

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


class ShadowTally(BaseModel):
    """What a comparison needs of a window's pairs, counted where the pairs are read (the activity),
    so that only counts and a few cut examples pass through workflow history: tallies of two reads
    add up (``merged``) and ``verdict_of`` judges them exactly as it would the pairs themselves."""

    pairs: int = 0
    agreeing: int = 0
    stable_chars: int = 0
    canary_chars: int = 0
    stable_refusals: int = 0
    canary_refusals: int = 0
    stable_json_invalid: int | None = None
    canary_json_invalid: int | None = None
    examples: list[ShadowPair] = Field(default_factory=list, description="a few disagreeing pairs, cut (example_of)")

    def merged(self, other: ShadowTally) -> ShadowTally:
        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return ShadowTally(
            pairs=self.pairs + other.pairs,
            agreeing=self.agreeing + other.agreeing,
            stable_chars=self.stable_chars + other.stable_chars,
            canary_chars=self.canary_chars + other.canary_chars,
            stable_refusals=self.stable_refusals + other.stable_refusals,
            canary_refusals=self.canary_refusals + other.canary_refusals,
            stable_json_invalid=add(self.stable_json_invalid, other.stable_json_invalid),
            canary_json_invalid=add(self.canary_json_invalid, other.canary_json_invalid),
            examples=[*self.examples, *other.examples][:EXAMPLES],
        )


EXAMPLE_PROMPT_CHARS = 120  # an example's prompt is cut to this: user data stays out of history


def example_of(pair: ShadowPair) -> ShadowPair:
    """The pair cut to what an example shows: the prompt's start, each answer around its first difference."""
    stable, canary = where_they_differ(pair.stable_answer, pair.canary_answer, width=120)
    prompt = pair.prompt if len(pair.prompt) <= EXAMPLE_PROMPT_CHARS else pair.prompt[:EXAMPLE_PROMPT_CHARS] + "…"
    return ShadowPair(seq=pair.seq, prompt=prompt, stable_answer=stable, canary_answer=canary)


def tally(pairs: list[ShadowPair], structured: bool = False) -> ShadowTally:
    """Count what ``verdict_of`` needs of ``pairs`` (examples: the first disagreeing ones, cut)."""
    counted = ShadowTally(
        pairs=len(pairs),
        agreeing=sum(p.stable_answer.strip() == p.canary_answer.strip() for p in pairs),
        stable_chars=sum(len(p.stable_answer) for p in pairs),
        canary_chars=sum(len(p.canary_answer) for p in pairs),
        stable_refusals=sum(is_refusal(p.stable_answer) for p in pairs),
        canary_refusals=sum(is_refusal(p.canary_answer) for p in pairs),
        examples=[example_of(p) for p in pairs if p.stable_answer.strip() != p.canary_answer.strip()][:EXAMPLES],
    )
    if structured:
        counted.stable_json_invalid = sum(parse_json_answer(p.stable_answer)[1] is not None for p in pairs)
        counted.canary_json_invalid = sum(parse_json_answer(p.canary_answer)[1] is not None for p in pairs)
    return counted


def measures_of(t: ShadowTally) -> ShadowMeasures:
    n = t.pairs
    if n == 0:
        return ShadowMeasures(pairs=0, exact_agreement=1.0, length_ratio=1.0, stable_refusal_rate=0.0, canary_refusal_rate=0.0)
    stable_len, canary_len = t.stable_chars / n, t.canary_chars / n
    ratio = canary_len / stable_len if stable_len else (1.0 if not canary_len else math.inf)
    measures = ShadowMeasures(
        pairs=n,
        exact_agreement=round(t.agreeing / n, 4),
        length_ratio=round(ratio, 4) if math.isfinite(ratio) else 1e9,
        stable_refusal_rate=round(t.stable_refusals / n, 4),
        canary_refusal_rate=round(t.canary_refusals / n, 4),
    )
    if t.stable_json_invalid is not None and t.canary_json_invalid is not None:
        measures.stable_json_invalid_rate = round(t.stable_json_invalid / n, 4)
        measures.canary_json_invalid_rate = round(t.canary_json_invalid / n, 4)
    return measures


def shadow_measures(pairs: list[ShadowPair], structured: bool = False) -> ShadowMeasures:
    return measures_of(tally(pairs, structured))


def shadow_verdict(pairs: list[ShadowPair], settings: ShadowSettings) -> ShadowVerdict:
    """The verdict on ``pairs`` (``verdict_of`` their tally)."""
    return verdict_of(tally(pairs, settings.structured), settings)


def verdict_of(counted: ShadowTally, settings: ShadowSettings) -> ShadowVerdict:
    """Pass, fail (with the measures past their threshold and disagreeing pairs) or inconclusive
    (too few pairs in the window: never a pass on no evidence)."""
    limits = settings.thresholds
    m = measures_of(counted)
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
    return ShadowVerdict(verdict="fail" if failed else "pass", measures=m, failed=failed, examples=counted.examples if failed else [])
