"""Quality gates: catch a version that answers wrongly, not only one that errs or is slow.

Two gates, both pure here (the activities only fetch answers):

- **Golden set** (``GoldenSet``): prompts with checks, run at warm-up against the new version's and
  stable's endpoints with deterministic sampling. ``check_answer`` grades one answer,
  ``golden_verdict`` compares the two versions' results and names the failing cases.
- **Shadow comparison** (``ShadowSettings``): live requests mirrored to the canary; each recorded
  (stable answer, canary answer) pair is compared by cheap, explainable measures
  (``shadow_measures``) and ``shadow_verdict`` fails on drift past a threshold, with examples.

Import-light on purpose (the workflow imports it): JSON-schema validation is passed in as a
function by the activity (``jsonschema`` there), never imported here.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from datetime import datetime
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CHECK_KINDS = ("exact", "normalised", "regex", "json_schema", "contains", "not_contains", "number")
EXAMPLES = 3  # failing cases / drifting pairs quoted in a verdict
ANSWER_EXCERPT = 160  # characters of an answer kept in a result
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")
# Cheap and explainable: the openings models use to decline. Matched at the start of an answer
# or of its first sentence, case-insensitive.
REFUSAL = re.compile(
    r"^\s*(i'?m sorry|i am sorry|sorry, |i can(?:no|')t|i cannot|i am unable|i'm unable|as an ai\b|i won'?t)",
    re.IGNORECASE,
)

# A validator for JSON Schema: (instance, schema) -> error message, or None when valid.
SchemaValidator = Callable[[object, dict], "str | None"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- the golden set ---------------------------------------------------------------------------


class Check(_Strict):
    """One check on an answer: exactly one of the fields below (``tolerance`` goes with ``number``)."""

    exact: str | None = Field(None, description="the answer, stripped, equals this")
    normalised: str | None = Field(None, description="equal after lower case, NFKC, punctuation and spaces folded")
    regex: str | None = Field(None, description="re.search finds this pattern in the answer")
    json_schema: dict | None = Field(None, description="the answer is JSON valid against this schema")
    contains: list[str] | None = Field(None, description="every string occurs (case-insensitive)")
    not_contains: list[str] | None = Field(None, description="no string occurs (case-insensitive)")
    number: float | None = Field(None, description="the first number in the answer is within tolerance of this")
    tolerance: float = Field(0.0, ge=0, description="absolute tolerance of 'number'")

    @model_validator(mode="after")
    def _one_kind(self) -> Check:
        kinds = [kind for kind in CHECK_KINDS if getattr(self, kind) is not None]
        if len(kinds) != 1:
            raise ValueError(f"a check has exactly one of {', '.join(CHECK_KINDS)}; got {kinds or 'none'}")
        if self.tolerance and self.number is None:
            raise ValueError("tolerance goes with number")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex {self.regex!r} does not compile: {exc}") from None
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in CHECK_KINDS if getattr(self, kind) is not None)


class GoldenCase(_Strict):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    prompt: str = Field(min_length=1)
    checks: list[Check] = Field(min_length=1)
    must_pass: bool = Field(False, description="an edge case that once hurt: failing it fails the gate alone")
    max_tokens: int | None = Field(None, ge=1, le=4096, description="default: the set's max_tokens")


class GoldenSet(_Strict):
    """A model's golden set (YAML or JSON), stored in the registry beside its weights."""

    min_pass_rate: float = Field(1.0, ge=0, le=1, description="share of cases the new version must pass")
    margin: float = Field(0.0, ge=0, le=1, description="how far below stable's pass rate the new one may be")
    max_tokens: int = Field(256, ge=1, le=4096)
    cases: list[GoldenCase] = Field(min_length=1, max_length=500)

    @field_validator("cases")
    @classmethod
    def _unique_ids(cls, cases: list[GoldenCase]) -> list[GoldenCase]:
        seen: set[str] = set()
        for case in cases:
            if case.id in seen:
                raise ValueError(f"case id {case.id!r} appears twice")
            seen.add(case.id)
        return cases


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


def normalise(text: str) -> str:
    """Lower case, NFKC, punctuation dropped, runs of spaces folded: 'Paris.' == ' paris'."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)
    return " ".join(text.split())


def first_number(text: str) -> float | None:
    match = _NUMBER.search(text)
    if match is None:
        return None
    try:
        return float(match.group().replace(",", ""))
    except ValueError:
        return None


def _parse_json(answer: str) -> tuple[object | None, str | None]:
    """The answer as JSON (a fenced ```json block is unwrapped), or why it is not JSON."""
    text = answer.strip()
    fenced = re.match(r"^```(?:json)?\s*(.*?)\s*```$", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"not JSON ({exc.__class__.__name__}: {str(exc)[:60]})"


def check_failure(check: Check, answer: str, validate_schema: SchemaValidator | None = None) -> str | None:
    """Why ``answer`` fails ``check``, or None when it passes."""
    text = answer.strip()
    if check.exact is not None:
        return None if text == check.exact.strip() else f"exact: expected {check.exact!r}"
    if check.normalised is not None:
        return None if normalise(text) == normalise(check.normalised) else f"normalised: expected {check.normalised!r}"
    if check.regex is not None:
        return None if re.search(check.regex, text) else f"regex: no match for {check.regex!r}"
    if check.contains is not None:
        missing = [s for s in check.contains if s.casefold() not in text.casefold()]
        return f"contains: missing {missing}" if missing else None
    if check.not_contains is not None:
        found = [s for s in check.not_contains if s.casefold() in text.casefold()]
        return f"not_contains: found {found}" if found else None
    if check.number is not None:
        value = first_number(text)
        if value is None:
            return f"number: no number, expected {check.number:g}"
        if abs(value - check.number) > check.tolerance:
            return f"number: {value:g} is not within {check.tolerance:g} of {check.number:g}"
        return None
    assert check.json_schema is not None
    instance, error = _parse_json(text)
    if error is not None:
        return f"json_schema: {error}"
    if validate_schema is None:
        return "json_schema: no schema validator available"
    problem = validate_schema(instance, check.json_schema)
    return f"json_schema: {problem}" if problem else None


def grade(case: GoldenCase, answer: str, validate_schema: SchemaValidator | None = None) -> CaseResult:
    """Every check of one case on one answer."""
    failures = [f for check in case.checks if (f := check_failure(check, answer, validate_schema)) is not None]
    return CaseResult(id=case.id, passed=not failures, failures=failures, answer=answer[:ANSWER_EXCERPT])


def _pass_rate(results: list[CaseResult]) -> float:
    return sum(r.passed for r in results) / len(results) if results else 0.0


def golden_verdict(
    golden: GoldenSet, new: list[CaseResult], stable: list[CaseResult] | None, revision: int | None = None
) -> GoldenVerdict:
    """Fail when a must-pass case fails, the pass rate is below the minimum, or below stable's
    by more than the margin (no stable: a first deploy has only the minimum)."""
    must = {c.id for c in golden.cases if c.must_pass}
    failing = [r for r in new if not r.passed]
    must_failed = [r.id for r in failing if r.id in must]
    new_rate = _pass_rate(new)
    stable_rate = _pass_rate(stable) if stable else None
    reasons = []
    if must_failed:
        reasons.append(f"must-pass case(s) failed: {', '.join(must_failed)}")
    if new_rate + 1e-9 < golden.min_pass_rate:
        reasons.append(f"pass rate {new_rate:.0%} below the minimum {golden.min_pass_rate:.0%}")
    if stable_rate is not None and new_rate + golden.margin + 1e-9 < stable_rate:
        reasons.append(f"pass rate {new_rate:.0%} below stable's {stable_rate:.0%} by more than {golden.margin:.0%}")
    if reasons and failing:
        reasons.append(f"failing: {', '.join(r.id for r in failing)}")
    examples = sorted(failing, key=lambda r: r.id not in must)[:EXAMPLES]
    return GoldenVerdict(
        passed=not reasons,
        golden_revision=revision,
        cases=len(new),
        new_pass_rate=round(new_rate, 4),
        stable_pass_rate=None if stable_rate is None else round(stable_rate, 4),
        min_pass_rate=golden.min_pass_rate,
        margin=golden.margin,
        failing_cases=[r.id for r in failing],
        must_pass_failed=must_failed,
        reasons=reasons,
        examples=examples,
    )


# ---- the shadow comparison ---------------------------------------------------------------------


class ShadowThresholds(_Strict):
    """Drift limits of the canary's mirrored answers against stable's on the same requests."""

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


class ShadowSettings(_Strict):
    """Mirror a sample of live requests to the canary (HTTPRoute RequestMirror) and compare answers."""

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
        measures.stable_json_invalid_rate = round(sum(_parse_json(p.stable_answer)[1] is not None for p in pairs) / n, 4)
        measures.canary_json_invalid_rate = round(sum(_parse_json(p.canary_answer)[1] is not None for p in pairs) / n, 4)
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


# ---- in the registry -----------------------------------------------------------------------------


class GoldenRevision(BaseModel):
    """One version of a model's golden set, as ``tideplane registry golden set`` stored it."""

    revision: int = Field(ge=1)
    sha256: str = Field(description="of the set's canonical JSON: setting the same set again is a no-op")
    set_at: datetime
    golden: GoldenSet


class GoldenHistory(BaseModel):
    """Every revision of a model's golden set (``registry/<model>/golden.json``); the last is current."""

    model: str
    revisions: list[GoldenRevision] = Field(default_factory=list)

    @property
    def current(self) -> GoldenRevision | None:
        return self.revisions[-1] if self.revisions else None
