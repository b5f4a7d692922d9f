"""Cost arithmetic (workflows/cost/pricing.py) against a hand calculation."""

from __future__ import annotations

import pytest

from workflows.cost.pricing import GpuSeconds, NodeInfo, PodInfo, Prices, TokenCount, compute_cost, render_markdown

NS = "llm-serving"


def test_compute_cost_matches_hand_calculation():
    gpu = [
        GpuSeconds(namespace=NS, pod="chat-v1-a", node="od-1", gpu_seconds=2 * 3600),  # 2 GPUs x 1 h
        GpuSeconds(namespace=NS, pod="chat-v1-b", node="od-1", gpu_seconds=2 * 3600),
        GpuSeconds(namespace=NS, pod="chat-v2-a", node="spot-1", gpu_seconds=1800),  # 1 GPU x 30 min
        GpuSeconds(namespace=NS, pod="loading", node="gone", gpu_seconds=600),  # never served, node unknown
        GpuSeconds(namespace=NS, pod="batch-a", node="special-1", gpu_seconds=3600),
    ]
    pods = [
        PodInfo(namespace=NS, pod="chat-v1-a", deployment="chat", version="1.0.0", model="llama"),
        PodInfo(namespace=NS, pod="chat-v1-b", deployment="chat", version="1.0.0", model="llama"),
        PodInfo(namespace=NS, pod="chat-v2-a", deployment="chat", version="2.0.0", model="llama"),
        PodInfo(namespace=NS, pod="batch-a", deployment="batch", version="1.0.0", model="mistral"),
    ]
    nodes = [
        NodeInfo(node="od-1", pool="gpu-on-demand", capacity_type="on-demand"),
        NodeInfo(node="spot-1", pool="gpu-spot", capacity_type="spot"),
        NodeInfo(node="special-1", pool="reserved", capacity_type="on-demand"),
    ]
    tokens = [
        TokenCount(namespace=NS, deployment="chat", version="1.0.0", model="llama", generation_tokens=1e6, prompt_tokens=3e6),
        TokenCount(namespace=NS, deployment="chat", version="2.0.0", model="llama", generation_tokens=2e5, prompt_tokens=3e5),
    ]
    prices = Prices(by_pool={"reserved": 7}, by_capacity_type={"on-demand": 10, "spot": 4}, default=12)
    table = compute_cost(gpu, pods, nodes, tokens, prices)

    # Hand calculation: v1 4 GPU-h x $10 = $40; v2 0.5 GPU-h x $4 = $2; unattributed 1/6 GPU-h x
    # $12 (unknown node: default price) = $2; batch 1 GPU-h at the reserved pool's $7.
    pools = {(r.deployment, r.pool): (round(r.gpu_hours, 6), r.price_per_gpu_hour, round(r.cost, 6)) for r in table.pools}
    assert pools == {
        ("chat", "gpu-on-demand"): (4.0, 10, 40.0),
        ("chat", "gpu-spot"): (0.5, 4, 2.0),
        ("(unattributed)", "unknown"): (round(1 / 6, 6), 12, 2.0),
        ("batch", "reserved"): (1.0, 7, 7.0),
    }
    versions = {(v.deployment, v.version): v for v in table.versions}
    v1, v2 = versions[("chat", "1.0.0")], versions[("chat", "2.0.0")]
    assert (v1.cost, v1.cost_per_million_tokens, v1.cost_per_million_generated_tokens) == (40.0, 10.0, 40.0)
    assert v1.generated_tokens_per_gpu_second == pytest.approx(1e6 / (4 * 3600))
    assert (v2.cost, v2.cost_per_million_tokens, v2.cost_per_million_generated_tokens) == (2.0, 4.0, 10.0)
    assert versions[("batch", "1.0.0")].cost_per_million_tokens is None  # GPU time but no tokens
    assert table.total_cost == pytest.approx(51.0)
    assert table.total_gpu_hours == pytest.approx(5 + 4 / 6)
    md = render_markdown(table, "Cost today")
    assert "**Total: $51.00 for 5.67 GPU-hours**" in md
    assert "| llm-serving/chat 2.0.0 | llama | 0.500 | $2.00 | 500,000 | $4.0000 | $10.0000 |" in md


def test_price_lookup_prefers_pool_then_capacity_type_then_default():
    prices = Prices(by_pool={"p": 1}, by_capacity_type={"spot": 2}, default=3)
    assert [prices.gpu_hour("p", "spot"), prices.gpu_hour("q", "spot"), prices.gpu_hour("q", "unknown")] == [1, 2, 3]
