"""The vLLM replica model against published measurements and vLLM's scheduling rules."""

from __future__ import annotations

import pytest

from infra.fleetmodel.engine import engine_names, load_engine, measurements
from infra.fleetmodel.replica import Replica, Request

CALIBRATED = [name for name in engine_names() if measurements(name)]


@pytest.mark.parametrize("name", CALIBRATED)
def test_replica_reproduces_the_published_latency_it_is_calibrated_to(name):
    """vLLM's nightly latency test: a batch of requests at once, mean end-to-end latency."""
    for m in measurements(name):
        replica = Replica(load_engine(name))
        batch = [Request(0.0, m["prompt_tokens"], m["output_tokens"]) for _ in range(m["batch"])]
        replica.advance_to(60.0, batch)
        mean_ms = 1000 * sum(r.finished_s for r in batch) / len(batch)
        assert mean_ms == pytest.approx(m["e2e_ms"], rel=0.02), m["name"]


def test_kv_bytes_per_token_match_the_published_model_shapes():
    # Hugging Face "Llama 3.1" blog, inference memory table: 0.125 GB (8B), 0.313 GB (70B) per 1k tokens
    assert load_engine("llama-3.1-8b/H200x1").kv_bytes_per_token * 1000 / 2**30 == pytest.approx(0.122, rel=0.01)
    assert load_engine("llama-3.1-70b/H200x4").kv_bytes_per_token * 1000 / 1e9 == pytest.approx(0.328, rel=0.01)


def test_kv_cache_is_what_memory_leaves_after_the_weights():
    small = load_engine("llama-3.1-8b/H100x1")
    big = load_engine("llama-3.1-8b/H200x1")
    # (141 x 0.9 - 2 - 15) GiB vs (80 x 0.9 - 2 - 15) GiB left for KV: twice as many tokens
    assert big.kv_capacity_tokens == pytest.approx(2 * small.kv_capacity_tokens, rel=0.01)
    assert load_engine("llama-3.1-8b/H100x1", gpu_memory_utilization=0.5).kv_capacity_tokens < small.kv_capacity_tokens
    with pytest.raises(ValueError, match="do not fit"):
        load_engine("llama-3.1-70b/H200x4", tensor_parallel=1, gpu="H100-80GB")


def test_decode_steps_slow_down_as_the_batch_grows():
    engine = load_engine()
    one, many = Replica(engine), Replica(engine)
    solo = [Request(0.0, 100, 200)]
    crowd = [Request(0.0, 100, 200) for _ in range(512)]
    one.advance_to(120.0, solo)
    many.advance_to(120.0, crowd)
    itl = lambda r: (r.finished_s - r.first_token_s) / (r.output_tokens - 1)  # noqa: E731
    assert itl(crowd[0]) > 1.5 * itl(solo[0])


def test_running_batch_is_bounded_by_max_num_seqs():
    replica = Replica(load_engine(None, max_num_seqs=8))
    replica.advance_to(0.001, [Request(0.0, 50, 1000) for _ in range(20)])
    replica.advance_to(0.5)
    assert len(replica.running) == 8 and len(replica.waiting) == 12


def test_long_prompt_is_prefilled_in_chunks_of_the_token_budget():
    engine = load_engine(None, max_num_batched_tokens=2048)
    replica = Replica(engine)
    long = Request(0.0, 10_000, 2)
    replica.advance_to(30.0, [long])
    chunks = 5  # ceil(10000 / 2048)
    assert long.ttft == pytest.approx(sum(engine.step_seconds(min(2048, 10_000 - 2048 * k), 2048 * k + min(2048, 10_000 - 2048 * k)) for k in range(chunks)), rel=1e-6)
    assert long.ttft > 4 * engine.step_seconds(1, 0)


def test_ttft_grows_with_prompt_length():
    engine = load_engine()
    short, long = Request(0.0, 100, 5), Request(0.0, 6000, 5)
    Replica(engine).advance_to(10.0, [short])
    Replica(engine).advance_to(10.0, [long])
    assert long.ttft > 5 * short.ttft


def test_full_kv_cache_preempts_and_every_request_still_finishes():
    engine = load_engine(None, gpu_memory_utilization=0.25, gpu="H100-80GB")  # ~3 GiB of cache
    replica = Replica(engine)
    per_request = 1000 + 2000
    n = engine.kv_capacity_tokens // 1000  # all prompts fit, their outputs do not
    batch = [Request(0.0, 1000, 2000) for _ in range(n)]
    replica.advance_to(3600.0, batch)
    assert n * per_request > engine.kv_capacity_tokens
    assert replica.preemptions > 0
    assert all(r.finished_s is not None for r in batch)
    assert replica.kv_used == 0 and not replica.running and not replica.waiting
    assert replica.histograms["vllm:e2e_request_latency_seconds"].count == n
