"""Models sharing GPUs: packing by vLLM's memory claim, consolidation before a new node, pool split."""

import pytest

from workflows.scaling.gpu_sharing import (
    ModelDemand,
    ModelShare,
    PackLimits,
    SharedGpu,
    SharedReplica,
    pack,
    release,
    share_pool,
)
from workflows.core.gpu_shares import gpu_memory_utilization

LLAMA_7B = ModelShare(model="llama-7b", gpu_memory_utilization=0.3, weights_gib=14, min_kv_cache_gib=4)
EMBED = ModelShare(model="embed", gpu_memory_utilization=0.1, weights_gib=1.5, min_kv_cache_gib=1)
RERANK = ModelShare(model="rerank", gpu_memory_utilization=0.15, weights_gib=2, min_kv_cache_gib=1)
LIMITS = PackLimits(gpus_per_node=2, gpu_memory_gib=80)


def replica(name, share, compute=0.0):
    return SharedReplica(name=name, share=share, compute_share=compute)


def gpu(node, index, *replicas, memory=80):
    return SharedGpu(node=node, index=index, memory_gib=memory, replicas=list(replicas))


def test_vllm_claim_is_read_from_its_arguments():
    assert gpu_memory_utilization(["--model", "/w", "--gpu-memory-utilization", "0.45"]) == 0.45
    assert gpu_memory_utilization(["--gpu-memory-utilization=0.3"]) == 0.3
    assert gpu_memory_utilization(["--model", "/w"]) == 0.9  # vLLM's default: a whole GPU
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        gpu_memory_utilization(["--gpu-memory-utilization", "1.5"])


def test_claim_must_hold_weights_and_kv_cache():
    assert LLAMA_7B.kv_cache_gib(80) == pytest.approx(0.3 * 80 - 2 - 14)  # 8 GiB of KV cache
    assert LLAMA_7B.fits_gpu(80)
    assert not LLAMA_7B.fits_gpu(40)  # 12 GiB claim < 14 GiB of weights
    plan = pack([], [replica("a", ModelShare(model="big", gpu_memory_utilization=0.2, weights_gib=15))], LIMITS)
    assert plan.unplaceable and not plan.placed and not plan.new_nodes
    assert "leaves -1.0 GiB for the KV cache" in plan.unplaceable["a"]


def test_seven_b_beside_embedding_and_reranker_on_one_gpu():
    plan = pack([gpu("n1", 0), gpu("n1", 1)], [replica("chat", LLAMA_7B), replica("emb", EMBED), replica("rr", RERANK)], LIMITS)
    assert set(plan.placed.values()) == {"n1/0"}  # first fit by free memory: all three on GPU 0
    assert not plan.moves and not plan.new_nodes
    assert next(g for g in plan.gpus if g.key == "n1/0").used_fraction == pytest.approx(0.55)


def test_first_fit_takes_the_tightest_gpu_that_holds_it():
    gpus = [gpu("a", 0, replica("x", LLAMA_7B)), gpu("a", 1, replica("y", LLAMA_7B), replica("z", LLAMA_7B))]
    plan = pack(gpus, [replica("emb", EMBED)], LIMITS)
    assert plan.placed == {"emb": "a/1"}  # 0.1 free there; a/0's 0.7 free stays for a larger claim


def test_consolidates_small_models_before_adding_a_node():
    # 0.45 and 0.5 free: a 0.6 claim fits nowhere, but moving GPU 1's embedding model to GPU 0 frees it
    gpus = [
        gpu("n1", 0, replica("chat-a", ModelShare(model="m", gpu_memory_utilization=0.55, weights_gib=14))),
        gpu("n1", 1, replica("emb", EMBED), replica("rr", RERANK), replica("rr2", RERANK), replica("emb2", EMBED)),
    ]
    big = replica("big", ModelShare(model="13b", gpu_memory_utilization=0.6, weights_gib=26, min_kv_cache_gib=4))
    plan = pack(gpus, [big], LIMITS)
    assert plan.new_nodes == []
    assert plan.placed == {"big": "n1/1"}
    assert [(m.replica, m.source, m.target) for m in plan.moves] == [("emb", "n1/1", "n1/0")]  # the fewest moves
    assert all(g.used_fraction <= 1 + 1e-9 for g in plan.gpus)


def test_adds_a_node_only_when_moving_small_models_cannot_make_room():
    seven_b = ModelShare(model="llama-7b", gpu_memory_utilization=0.35, weights_gib=14)
    gpus = [gpu("n1", 0, replica("a", seven_b), replica("b", seven_b)), gpu("n1", 1, replica("c", seven_b), replica("d", seven_b))]
    big = replica("big", ModelShare(model="13b", gpu_memory_utilization=0.6, weights_gib=26))
    plan = pack(gpus, [big], LIMITS)  # 0.3 free on each GPU, and neither takes the other's 0.35
    assert plan.new_nodes == ["new-1"] and plan.placed == {"big": "new-1/0"} and not plan.moves
    assert "1 new node(s)" in plan.report


def test_compute_cap_keeps_busy_replicas_apart():
    limits = PackLimits(gpus_per_node=2, max_compute_share=0.6)
    gpus = [gpu("n1", 0, replica("busy", EMBED, compute=0.5)), gpu("n1", 1)]
    plan = pack(gpus, [replica("busy2", EMBED, compute=0.4)], limits)
    assert plan.placed == {"busy2": "n1/1"}  # memory would fit on n1/0, time would not


def test_released_replicas_free_their_memory():
    gpus = [gpu("n1", 0, replica("a", LLAMA_7B), replica("b", EMBED))]
    assert [r.name for r in release(gpus, {"a"})[0].replicas] == ["b"]


def test_shared_pool_moves_gpus_from_idle_to_busy_models():
    demands = [
        ModelDemand(model="chat", desired=6, min_replicas=1, gpu_memory_utilization=0.5, busy=0.95),
        ModelDemand(model="embed", desired=1, min_replicas=1, gpu_memory_utilization=0.5, busy=0.05),
        ModelDemand(model="code", desired=4, min_replicas=1, gpu_memory_utilization=0.5, busy=0.6),
    ]
    grant = share_pool(4, demands)  # 8 half-GPU replicas fit; 11 wanted
    assert grant["embed"] == 1  # idle: keeps its minimum only
    assert sum(grant.values()) == 8
    assert grant["chat"] > grant["code"] >= 1 and grant["chat"] <= 6
    # with room for all, everyone gets what it wants
    assert share_pool(10, demands) == {"chat": 6, "embed": 1, "code": 4}
