"""The quality gates' pure parts: checks on one answer, the golden verdict, the shadow measures."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from activities.quality.quality_activities import schema_problem
from workflows.core.verdicts import CaseResult
from workflows.quality.golden_set import (
    Check,
    GoldenSet,
    check_failure,
    golden_verdict,
    grade,
    normalise,
)
from workflows.quality.shadow import (
    ShadowPair,
    ShadowSettings,
    ShadowThresholds,
    describe_pair,
    shadow_measures,
    shadow_verdict,
)


def golden(**overrides) -> GoldenSet:
    cases = [
        {"id": "capital", "prompt": "capital of France?", "checks": [{"contains": ["Paris"]}]},
        {"id": "dose", "prompt": "max dose?", "must_pass": True, "checks": [{"number": 4, "tolerance": 0.5}]},
        {"id": "json", "prompt": "as JSON", "checks": [{"json_schema": {"type": "object", "required": ["id"]}}]},
        {"id": "haiku", "prompt": "a haiku", "checks": [{"regex": "sea"}]},
    ]
    return GoldenSet.model_validate({"min_pass_rate": 0.75, "margin": 0.0, "cases": cases, **overrides})


def results(passed: dict[str, bool]) -> list[CaseResult]:
    return [CaseResult(id=case, passed=ok, failures=[] if ok else ["wrong"]) for case, ok in passed.items()]


@pytest.mark.parametrize(
    ("check", "answer", "fails"),
    [
        ({"exact": "4"}, " 4\n", False),
        ({"exact": "4"}, "4.", True),
        ({"normalised": "Paris"}, "  paris. ", False),
        ({"normalised": "Paris"}, "Lyon", True),
        ({"regex": r"\b391\b"}, "17 * 23 = 391.", False),
        ({"regex": r"\b391\b"}, "3910", True),
        ({"contains": ["4 grams", "adult"]}, "Adults: 4 GRAMS a day", False),  # casefolded substrings
        ({"contains": ["4 grams", "child"]}, "Adults: 4 GRAMS a day", True),
        ({"contains": ["4 grams"]}, "at most 4 grams", False),
        ({"not_contains": ["8 grams"]}, "8 Grams", True),
        ({"number": 30, "tolerance": 0}, "within 30 days", False),
        ({"number": 30, "tolerance": 1}, "within 32 days", True),
        ({"number": 1000}, "1,000 tokens", False),
        ({"number": 30}, "a month", True),
        ({"json_schema": {"type": "object", "required": ["id"]}}, '{"id": 1}', False),
        ({"json_schema": {"type": "object", "required": ["id"]}}, '```json\n{"id": 1}\n```', False),
        ({"json_schema": {"type": "object", "required": ["id"]}}, '{"name": 1}', True),
        ({"json_schema": {"type": "object"}}, "not json", True),
    ],
)
def test_each_check_kind(check: dict, answer: str, fails: bool) -> None:
    failure = check_failure(Check.model_validate(check), answer, schema_problem)
    assert (failure is not None) is fails, failure


def test_contains_is_case_insensitive_and_needs_every_string() -> None:
    assert check_failure(Check(contains=["paris", "France"]), "PARIS is in france") is None
    assert "missing ['France']" in check_failure(Check(contains=["paris", "France"]), "Paris")


def test_schema_failure_says_what_is_wrong() -> None:
    failure = check_failure(Check(json_schema={"properties": {"id": {"type": "integer"}}}), '{"id": "x"}', schema_problem)
    assert failure is not None and "'x' is not of type 'integer'" in failure and "/id" in failure


@pytest.mark.parametrize(
    "check",
    [{}, {"exact": "a", "regex": "b"}, {"regex": "("}, {"contains": ["a"], "tolerance": 1}, {"exact": "a", "extra": 1}],
)
def test_a_check_has_exactly_one_valid_kind(check: dict) -> None:
    with pytest.raises(ValidationError):
        Check.model_validate(check)


def test_case_ids_are_unique() -> None:
    case = {"id": "a", "prompt": "p", "checks": [{"exact": "x"}]}
    with pytest.raises(ValidationError, match="appears twice"):
        GoldenSet.model_validate({"cases": [case, case]})


def test_grade_lists_every_failed_check() -> None:
    case = golden().cases[0].model_copy(update={"checks": [Check(contains=["Paris"]), Check(not_contains=["Lyon"])]})
    result = grade(case, "Lyon, not Paris")
    assert not result.passed and result.failures == ["not_contains: found ['Lyon']"]


def test_normalise_folds_case_punctuation_and_spaces() -> None:
    assert normalise("  Water boils at 100 °C!  ") == normalise("water boils at 100 °c")


def test_golden_passes_when_all_limits_hold() -> None:
    verdict = golden_verdict(golden(), results({"capital": True, "dose": True, "json": True, "haiku": False}), None)
    assert verdict.passed and verdict.failing_cases == ["haiku"] and verdict.new_pass_rate == 0.75


def test_a_failing_must_pass_case_fails_alone_and_is_named() -> None:
    new = results({"capital": True, "dose": False, "json": True, "haiku": True})
    verdict = golden_verdict(golden(min_pass_rate=0.5), new, results(dict.fromkeys(("capital", "dose", "json", "haiku"), True)))
    assert not verdict.passed
    assert verdict.must_pass_failed == ["dose"]
    assert "must-pass case(s) failed: dose" in verdict.describe()
    assert verdict.examples[0].id == "dose"


def test_below_the_minimum_names_the_failing_cases() -> None:
    verdict = golden_verdict(golden(), results({"capital": False, "dose": True, "json": False, "haiku": True}), None)
    assert not verdict.passed
    assert verdict.reasons == ["pass rate 50% below the minimum 75%", "failing: capital, json"]


def test_below_stable_by_more_than_the_margin() -> None:
    new = results({"capital": True, "dose": True, "json": True, "haiku": False})
    stable = results(dict.fromkeys(("capital", "dose", "json", "haiku"), True))
    assert not golden_verdict(golden(), new, stable).passed  # 75 % vs 100 %, margin 0
    assert golden_verdict(golden(margin=0.25), new, stable).passed  # within the margin
    worse_stable = results({"capital": True, "dose": True, "json": False, "haiku": False})
    assert golden_verdict(golden(min_pass_rate=0.5), worse_stable, new).reasons[0].startswith("pass rate 50% below stable's 75%")


def test_the_sandbox_golden_set_is_valid_and_flags_the_bad_release() -> None:
    """infra/sandbox/golden.yaml against the fleet simulator's answers: the demo's third release fails it."""
    from infra.sandbox.answers import answer
    from infra.sandbox.config import Profile

    sandbox = GoldenSet.model_validate(yaml.safe_load(open("infra/sandbox/golden.yaml")))
    good = [grade(c, answer(c.prompt, "1.0.0", Profile()), schema_problem) for c in sandbox.cases]
    bad_profile = Profile(golden_failures=["paracetamol"])
    bad = [grade(c, answer(c.prompt, "1.3.0", bad_profile), schema_problem) for c in sandbox.cases]
    assert all(r.passed for r in good), [r for r in good if not r.passed]
    verdict = golden_verdict(sandbox, bad, good)
    assert not verdict.passed and verdict.must_pass_failed == ["paracetamol-max-dose"]


def pairs(agree: int, differ: int, canary: str = "I'm sorry, I can't help.") -> list[ShadowPair]:
    same = [ShadowPair(seq=i, prompt=f"p{i}", stable_answer=f"answer {i}", canary_answer=f"answer {i}") for i in range(agree)]
    other = [ShadowPair(seq=agree + i, prompt=f"q{i}", stable_answer=f"answer {i}", canary_answer=canary) for i in range(differ)]
    return same + other


def test_shadow_measures() -> None:
    m = shadow_measures(pairs(8, 2), structured=True)
    assert m.pairs == 10 and m.exact_agreement == 0.8
    assert m.canary_refusal_rate == 0.2 and m.stable_refusal_rate == 0.0
    assert m.canary_json_invalid_rate == 1.0 and m.stable_json_invalid_rate == 1.0  # plain text both
    assert m.length_ratio > 1


def test_shadow_passes_identical_answers() -> None:
    verdict = shadow_verdict(pairs(30, 0), ShadowSettings())
    assert verdict.verdict == "pass" and not verdict.examples


def test_shadow_fails_on_drift_with_examples() -> None:
    verdict = shadow_verdict(pairs(24, 6), ShadowSettings())
    assert verdict.verdict == "fail"
    assert any(f.startswith("exact agreement 80% < 90%") for f in verdict.failed)
    assert any(f.startswith("refusal rate 20% vs stable 0%") for f in verdict.failed)
    assert len(verdict.examples) == 3 and verdict.examples[0].canary_answer.startswith("I'm sorry")


def test_shadow_length_ratio_threshold() -> None:
    long = pairs(0, 30, canary="answer 0 " * 10)
    verdict = shadow_verdict(long, ShadowSettings(thresholds=ShadowThresholds(min_exact_agreement=0)))
    assert verdict.verdict == "fail" and verdict.failed[0].startswith("answer length ratio")


def test_shadow_json_validity_on_structured_endpoints() -> None:
    json_pairs = [ShadowPair(seq=i, prompt="p", stable_answer='{"a": 1}', canary_answer='{"a": 1' if i < 5 else '{"a": 1}') for i in range(30)]
    limits = ShadowThresholds(min_exact_agreement=0)
    assert shadow_verdict(json_pairs, ShadowSettings(thresholds=limits)).verdict == "pass"  # not structured: not compared
    verdict = shadow_verdict(json_pairs, ShadowSettings(structured=True, thresholds=limits))
    assert verdict.verdict == "fail" and verdict.failed == ["invalid JSON 17% vs stable 0% (> +2%)"]


def test_too_few_pairs_is_inconclusive_never_a_pass() -> None:
    verdict = shadow_verdict(pairs(5, 0), ShadowSettings())
    assert verdict.verdict == "inconclusive" and verdict.failed == ["5 pairs < 20"]


def test_an_example_shows_where_the_answers_differ() -> None:
    stable = "Here is a short answer: the plot of Hamlet in brief."
    padded = stable + " To elaborate at length: the plot of Hamlet in brief."
    assert describe_pair(ShadowPair(seq=1, prompt="Hamlet?", stable_answer=stable, canary_answer=padded)) == (
        "'Hamlet?': stable '… of Hamlet in brief.' / canary '… of Hamlet in brief. To elaborate at length: the plot of Ham…'"
    )
