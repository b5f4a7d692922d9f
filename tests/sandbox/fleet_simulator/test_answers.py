"""The fleet simulator's answers per version and its record of mirrored requests."""

from __future__ import annotations

from infra.sandbox.answers import LIVE_PROMPTS, REFUSAL_ANSWER, MirrorLog, answer, reference_answer
from infra.sandbox.config import Profile

GOOD, WRONG, DRIFT = Profile(), Profile(golden_failures=["Paracetamol"]), Profile(drift=0.5)


def test_answers_are_deterministic_and_a_good_version_gives_the_reference() -> None:
    prompt = "What is the capital of France?"
    assert answer(prompt, "1.0.0", GOOD) == answer(prompt, "1.0.0", GOOD) == "The capital of France is Paris."
    assert answer("Write a poem", "1.0.0", GOOD) == answer("Write a poem", "2.0.0", GOOD) == reference_answer("Write a poem")


def test_golden_failures_answer_those_prompts_wrongly_and_only_those() -> None:
    dose = "What is the maximum daily dose of paracetamol for an adult?"
    assert "8 grams" in answer(dose, "1.3.0", WRONG) and "4 grams" not in answer(dose, "1.3.0", WRONG)
    assert answer("What is the capital of France?", "1.3.0", WRONG) == "The capital of France is Paris."


def test_drift_changes_about_that_share_of_open_ended_answers_only() -> None:
    prompts = [f"question {i}" for i in range(400)]
    changed = [p for p in prompts if answer(p, "1.4.0", DRIFT) != reference_answer(p)]
    assert 0.4 < len(changed) / len(prompts) < 0.6
    assert any(answer(p, "1.4.0", DRIFT) == REFUSAL_ANSWER for p in changed)
    facts = [f"What is the capital of France? ({i})" for i in range(50)]
    assert all(answer(p, "1.4.0", DRIFT) == "The capital of France is Paris." for p in facts)


def _route(mirror: bool) -> dict:
    rule = {"backendRefs": [{"name": "chat-v1-0-0", "weight": 99}, {"name": "chat-v1-4-0", "weight": 1}]}
    if mirror:
        rule["filters"] = [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "chat-v1-4-0"}, "percent": 10}}]
    return {"metadata": {"namespace": "llm", "name": "chat"}, "spec": {"rules": [rule]}}


def _versions(namespace: str, service: str):
    return {"chat-v1-0-0": ("1.0.0", GOOD), "chat-v1-4-0": ("1.4.0", DRIFT)}.get(service)


def test_mirror_records_percent_of_the_demand_as_pairs_from_stable_and_canary() -> None:
    log = MirrorLog()
    log.advance({"llm/chat": 20.0}, [_route(mirror=True)], _versions, dt=10.0)  # 200 requests, 10 % mirrored
    doc = log.read("/mirror/llm/chat?after=0")
    assert len(doc["pairs"]) == 20 and doc["last"] == doc["pairs"][-1]["seq"]
    first = doc["pairs"][0]
    assert (first["stable_version"], first["canary_version"]) == ("1.0.0", "1.4.0")
    assert first["prompt"].startswith(LIVE_PROMPTS) and first["stable_answer"] == answer(first["prompt"], "1.0.0", GOOD)
    assert first["canary_answer"] == answer(first["prompt"], "1.4.0", DRIFT)
    assert log.read(f"/mirror/llm/chat?after={doc['last']}")["pairs"] == []


def test_no_mirror_filter_no_pairs() -> None:
    log = MirrorLog()
    log.advance({"llm/chat": 20.0}, [_route(mirror=False)], _versions, dt=10.0)
    assert log.read("/mirror/llm/chat")["pairs"] == []
    assert log.read("/mirror/llm") is None
