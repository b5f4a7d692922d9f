"""The multi-model benchmark's bookkeeping: dedicated pools round up to nodes, the shared pool packs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from benchmarks.models import ModelRun, ModelSpec, PoolMemberPolicy, dedicated_paid, pack_over_time, peak_claim, pool_grants
from benchmarks.scaling import TideplanePolicy
from benchmarks.traces import RateTrace
from workflows.scaling.decide import ScalingPolicy, Signals
from workflows.scaling.gpu_sharing import PackLimits

SCRAPE = 15.0


@dataclass
class Series:
    """The parts of a fleet-model Result the packing reads."""

    replicas: list[int]
    ready: list[int]
    arrivals: list[float]
    gpus_per_replica: int = 1


def model(name: str, engine: str, fraction: float, replicas: list[int], rps: float = 1.0) -> ModelRun:
    spec = ModelSpec(name, engine, fraction, RateTrace(name, 600.0, []), "m-large")
    series = Series(replicas, replicas, [rps * SCRAPE] * len(replicas))
    return ModelRun(spec, series, series, solo_capacity_rps=50.0, mean_rps=rps)


def test_a_dedicated_pool_pays_for_whole_nodes():
    run = model("chat", "llama-3.1-8b/H200x1", 0.9, [1, 8, 9, 0])
    assert dedicated_paid(run, 8) == [8, 8, 16, 0]
    assert dedicated_paid(run, 1) == [1, 8, 9, 0]


def test_small_models_share_gpus_and_empty_nodes_are_given_back():
    tail = [model(f"tail-{i}", "llama-3.2-1b/H200x1", 0.15, [1, 1, 0]) for i in range(12)]
    big = model("chat", "llama-3.1-8b/H200x1", 0.9, [2, 3, 0])
    packing = pack_over_time([big, *tail], PackLimits(gpus_per_node=1, gpu_memory_gib=141), SCRAPE, 240.0)
    # 12 x 0.15 fit 6 to a GPU: 2 GPUs for the tail, one per 8B replica; nothing left at the end
    assert packing.paid == [4, 5, 0]
    assert packing.gpu_hours == pytest.approx(9 * SCRAPE / 3600)
    on_nodes = pack_over_time([big, *tail], PackLimits(gpus_per_node=8, gpu_memory_gib=141), SCRAPE, 240.0)
    assert on_nodes.paid == [8, 8, 0]  # one 8-GPU node holds them all


def member(wants: dict[int, int], load: dict[int, tuple[float, int]]) -> PoolMemberPolicy:
    return PoolMemberPolicy(TideplanePolicy(ScalingPolicy(max_replicas=20), 1), wants=wants, load=load)


def test_the_shared_pool_grants_an_idle_models_gpus_to_the_busy_one():
    """The bench splits a capped pool by the loop's own rule: idle models keep their minimum."""
    specs = [ModelSpec(n, "llama-3.2-3b/H200x1", 0.5, RateTrace(n, 600.0, []), "m-large") for n in ("chat", "embed")]
    chat = member({30: 4, 60: 1}, {30: (40.0, 2), 60: (0.0, 2)})
    embed = member({30: 2, 60: 4}, {30: (0.0, 2), 60: (40.0, 2)})
    assert peak_claim(specs, [chat, embed]) == 3.0
    grants = pool_grants(specs, [chat, embed], 2.0)
    assert grants == [{30: 3, 60: 1}, {30: 1, 60: 3}]  # the busy model of each moment gets the pool less the other's minimum


def test_a_pool_member_scales_to_at_most_its_grant_and_logs_what_it_wanted():
    policy = member({}, {})
    policy.grants = {30: 3}
    assert policy.desired(30.0, 2, 2, Signals(queue_waiting=400, running=8, request_rate=40.0)) == 3
    assert policy.wants[30] > 3 and policy.load[30] == (40.0, 2)
