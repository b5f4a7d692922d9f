"""The golden set: prompts with checks, run at warm-up against the new version's and stable's
endpoints with deterministic sampling. ``check_failure`` grades one answer, ``golden_verdict``
compares the two versions' results and names the failing cases (the verdict's type is
workflows/core/verdicts.py: the registry keeps it). The other quality gate, the shadow comparison,
is workflows/quality/shadow.py.

Import-light on purpose (the workflow imports it): JSON-schema validation is passed in as a
function by the activity (``jsonschema`` there), never imported here.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import datetime
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workflows.core.verdicts import CaseResult, GoldenVerdict

CHECK_KINDS = ("exact", "normalised", "regex", "json_schema", "contains", "not_contains", "number")
EXAMPLES = 3  # failing cases / drifting pairs quoted in a verdict
ANSWER_EXCERPT = 160  # characters of an answer kept in a result
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")

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


def parse_json_answer(answer: str) -> tuple[object | None, str | None]:
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
    instance, error = parse_json_answer(text)
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


# ---- as the registry stores it (registry/<model>/golden.json, activities/quality/golden_sets.py) ----


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
