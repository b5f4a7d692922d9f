"""Batching settings: vLLM's arguments, the choice among measured settings, the fleet model honouring them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infra.fleetmodel.engine import load_engine
from infra.fleetmodel.replica import Replica, Request
from infra.sandbox.config import Profile
from infra.sandbox.fleet_simulator.replicas import engine_of
from workflows.rollout.batching import (
    VLLM_DEFAULT,
    BatchingSweep,
    choose_setting,
)
from workflows.core.batching_settings import (
    BatchingSetting,
    SweepPoint,
    engine_overrides,
    with_engine_args,
)

SMALL = BatchingSetting(max_num_seqs=64, max_num_batched_tokens=512)
MID = BatchingSetting(max_num_seqs=256, max_num_batched_tokens=2048, chunked_prefill=False)


def point(setting: BatchingSetting, tps: float, ttft: float | None, tpot: float | None, errors: int = 0) -> SweepPoint:
    return SweepPoint(setting=setting, tokens_per_second=tps, ttft_p99_seconds=ttft, tpot_p99_seconds=tpot, requests=64, errors=errors)


def test_engine_args_replace_the_batching_ones_and_keep_the_rest():
    args = ["--dtype", "bfloat16", "--max-num-seqs", "8", "--max-num-batched-tokens=4096", "--enable-chunked-prefill", "--seed", "1"]
    out = with_engine_args(args, MID)
    assert out == ["--dtype", "bfloat16", "--seed", "1", "--max-num-seqs", "256", "--max-num-batched-tokens", "2048", "--no-enable-chunked-prefill"]
    assert with_engine_args(out, MID) == out  # applying twice changes nothing (no rollout of the pods)


def test_engine_overrides_read_what_vllm_reads():
    assert engine_overrides(with_engine_args(["--port", "8000"], MID)) == {
        "max_num_seqs": 256, "max_num_batched_tokens": 2048, "enable_chunked_prefill": False,
    }
    assert engine_overrides(["--max-num-seqs=12"]) == {"max_num_seqs": 12}
    assert engine_overrides(["--port", "8000"]) == {}


def test_choice_is_the_highest_throughput_within_both_slos():
    points = [
        point(VLLM_DEFAULT, 900, ttft=3.0, tpot=0.04),  # fastest, but TTFT over 2 s
        point(MID, 800, ttft=1.0, tpot=0.15),  # TPOT over 0.1 s
        point(SMALL, 600, ttft=0.5, tpot=0.05),
        point(BatchingSetting(max_num_seqs=32, max_num_batched_tokens=256), 500, ttft=0.4, tpot=0.04),
        point(BatchingSetting(max_num_seqs=16, max_num_batched_tokens=256), 700, ttft=None, tpot=0.04),  # no data
    ]
    choice = choose_setting(points, ttft_slo_s=2.0, tpot_slo_s=0.1)
    assert choice.setting == SMALL
    assert len(choice.within_slo) == 2
    assert "600.0 tokens/s" in choice.reason


def test_a_setting_that_fails_requests_is_not_chosen():
    choice = choose_setting([point(VLLM_DEFAULT, 900, 0.5, 0.05, errors=20), point(SMALL, 600, 0.5, 0.05)], 2.0, 0.1)
    assert choice.setting == SMALL


def test_none_within_keeps_vllms_defaults_and_says_why():
    choice = choose_setting([point(SMALL, 600, 5.0, 0.05), point(VLLM_DEFAULT, 900, 9.0, 0.05)], 2.0, 0.1)
    assert choice.setting == VLLM_DEFAULT
    assert choice.within_slo == []
    assert choice.reason.startswith("no setting kept TTFT p99 <= 2s")


def test_sweep_input_refuses_a_setting_listed_twice():
    with pytest.raises(ValidationError, match="listed twice"):
        BatchingSweep(candidates=[SMALL, SMALL])


def test_sandbox_engine_follows_the_pods_args():
    engine = engine_of(Profile(), ("--model", "/m", "--max-num-seqs", "7", "--no-enable-chunked-prefill"))
    assert (engine.max_num_seqs, engine.chunked_prefill) == (7, False)
    assert engine_of(Profile()).chunked_prefill


def test_without_chunked_prefill_a_prompt_is_computed_in_one_step():
    """2000 prompt tokens under a 512-token budget: four steps chunked, one step whole."""
    def first_token(chunked: bool) -> tuple[float, int]:
        engine = load_engine().with_batching(max_num_batched_tokens=512, enable_chunked_prefill=chunked)
        replica = Replica(engine)
        replica.advance_to(10.0, [Request(0.0, 2000, 4)])
        done = replica.finished[0]
        return done.first_token_s, replica.prompt_tokens

    chunked, whole = first_token(True), first_token(False)
    assert chunked[1] == whole[1] == 2000
    engine = load_engine()
    assert whole[0] == pytest.approx(engine.step_seconds(2000, 2000))
    assert chunked[0] > whole[0] + 3 * engine.overhead_s
