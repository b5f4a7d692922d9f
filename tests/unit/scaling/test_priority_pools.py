"""Priority pools and the node layer's planner: pure rules, no cluster.

realtime replicas run on on-demand GPUs and keep their floor; batch replicas run on spot and may
scale to zero; Unschedulable replicas are placed on free GPUs first and only the rest grow a pool.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.rollout.serving_pods import ServingPods, deployment_manifest
from activities.spot.fallback_deployments import fallback_manifest
from workflows.core.naming import GPU_RESOURCE, LABEL_CLASS, NODE_CAPACITY_TYPE, DeploymentRef
from workflows.rollout.contract import EnsureVersionInput
from workflows.scaling.decide import ScalerState, ScalingPolicy, Signals, decide
from workflows.scaling.placement import Gpu, ModelNeed, Node, PoolSizing, plan_pending, size_pool

PODS = ServingPods(model_cache_dir=Path("/var/cache/tideplane/models"))
IDLE = Signals(queue_waiting=0, running=0, request_rate=0, kv_cache_usage=0, ttft_p99_seconds=0.1, gpu_util_percent=0)


def version(priority_class: str | None = None, gpus: int = 1) -> EnsureVersionInput:
    extra = {"priority_class": priority_class} if priority_class else {}
    return EnsureVersionInput(
        deployment=DeploymentRef(namespace="llm-serving", name="summarise"),
        model="llama-3-8b",
        version="1.0.0",
        image="vllm/vllm-openai:v0.8.5",
        gpus_per_replica=gpus,
        replicas=1,
        weights_path="/var/cache/tideplane/models/llama-3-8b/1.0.0",
        **extra,
    )


def test_deployment_declares_its_class_and_follows_it_to_its_capacity_type():
    batch = deployment_manifest(version("batch"), PODS)
    realtime = deployment_manifest(version(), PODS)  # realtime is the default
    for manifest, cls, capacity in ((batch, "batch", "spot"), (realtime, "realtime", "on-demand")):
        assert manifest["metadata"]["labels"][LABEL_CLASS] == cls
        assert manifest["spec"]["template"]["metadata"]["labels"][LABEL_CLASS] == cls  # pods too: the node layer reads them
        assert manifest["spec"]["template"]["spec"]["nodeSelector"] == {NODE_CAPACITY_TYPE: capacity}
    batch_keys = {(t["key"], t.get("value")) for t in batch["spec"]["template"]["spec"]["tolerations"]}
    realtime_keys = {(t["key"], t.get("value")) for t in realtime["spec"]["template"]["spec"]["tolerations"]}
    assert (NODE_CAPACITY_TYPE, "spot") in batch_keys and (GPU_RESOURCE, None) in batch_keys
    assert realtime_keys == {(GPU_RESOURCE, None)}  # realtime never tolerates the spot taint


def test_spot_failover_twin_of_a_batch_deployment_can_schedule_on_on_demand():
    """The on-demand twin overrides the one capacity-type key: no second, contradicting requirement."""
    batch = deployment_manifest(version("batch"), PODS)
    twin = fallback_manifest(batch, {"i-0abc": 1}, "on-demand")["spec"]["template"]["spec"]
    assert twin["nodeSelector"] == {NODE_CAPACITY_TYPE: "on-demand"} and "affinity" not in twin


def test_cpu_deployment_is_not_pinned_to_a_gpu_capacity_type():
    spec = deployment_manifest(version("batch", gpus=0), PODS)["spec"]["template"]["spec"]
    assert "nodeSelector" not in spec and "tolerations" not in spec


def test_bad_class_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="priority_class"):
        version("premium")


def test_batch_scales_to_zero_when_idle_realtime_keeps_its_floor():
    batch = ScalingPolicy(priority_class="batch", min_replicas=0, stabilisation_seconds=60, cooldown_seconds=60)
    state = ScalerState()
    current = 1
    for t in range(0, 300, 30):
        d = decide(t, current, IDLE, batch, state)
        state, current = d.state, d.desired
    assert current == 0 and d.cause in ("below_target", "at_target")
    realtime = ScalingPolicy(min_replicas=1, stabilisation_seconds=60, cooldown_seconds=60)
    state, current = ScalerState(), 2
    for t in range(0, 600, 30):
        d = decide(t, current, IDLE, realtime, state)
        state, current = d.state, d.desired
    assert current == 1 and d.cause == "floor" and "raised to floor 1" in d.reason


def test_realtime_refuses_a_zero_floor_and_a_cpu_fallback():
    with pytest.raises(ValidationError, match="realtime deployment keeps its floor"):
        ScalingPolicy(min_replicas=0)
    fallback = {"deployment": "llm-serving/summarise-cpu", "version": "1.0.0", "replicas": 2}
    with pytest.raises(ValidationError, match="cpu_fallback is for the batch class only"):
        ScalingPolicy(cpu_fallback=fallback)
    assert ScalingPolicy(priority_class="batch", min_replicas=0, cpu_fallback=fallback).cpu_fallback.replicas == 2


def test_decision_names_its_cause_for_the_metric():
    p = ScalingPolicy(max_replicas=20)
    assert decide(0, 2, Signals(queue_waiting=200, gpu_util_percent=50), p, ScalerState()).cause == "queue_depth"
    assert decide(0, 2, Signals(error="down"), p, ScalerState()).cause == "metric_fallback"
    capped = ScalingPolicy(max_replicas=20, max_gpus=2)
    assert decide(0, 2, Signals(queue_waiting=200, gpu_util_percent=50), capped, ScalerState()).cause == "budget"


def node(name: str, free: list[int], capacity: str = "spot", replicas: int = 0) -> Node:
    return Node(
        name=name, capacity_type=capacity, replicas=replicas,
        gpus=[Gpu(index=i, free_gib=80 if f else 0, allocated=not f) for i, f in enumerate(free)],
    )


def need(gpus: int, cls: str = "batch") -> ModelNeed:
    return ModelNeed(model="m", gpu_memory_gib=80 * gpus, gpus_per_replica=gpus, pool_class=cls)


SIZING = PoolSizing(min_nodes=0, max_nodes=10, warm_standby=0, gpus_per_node=4, pending_grace_seconds=0)


def test_pending_replicas_that_fit_on_free_gpus_need_no_node():
    nodes = [node("a", [1, 1, 0, 0], replicas=1), node("b", [0, 0, 0, 0], replicas=2)]
    plan = plan_pending(nodes, [need(1), need(1)], SIZING, "spot", 80)
    assert (plan.fits_existing, plan.new_nodes) == (2, 0)
    d = size_pool(nodes, pending_gpus=2, pending_for_seconds=5, sizing=SIZING, plan=plan)
    assert d.desired_nodes == 2 and d.reason.startswith("hold") and "2 fit on existing nodes" in d.reason


def test_fragmented_free_gpus_are_reported_and_a_node_is_added():
    nodes = [node("a", [1, 1, 0, 0], replicas=1), node("b", [1, 1, 0, 0], replicas=1)]
    plan = plan_pending(nodes, [need(4)], SIZING, "spot", 80)
    assert plan.fragmented and plan.new_nodes == 1 and plan.fits_existing == 0
    assert "fragmented: enough total memory" in plan.report
    d = size_pool(nodes, pending_gpus=4, pending_for_seconds=5, sizing=SIZING, plan=plan)
    assert d.desired_nodes == 3 and d.reason.startswith("grow")


def test_new_nodes_are_packed_and_other_capacity_is_ignored():
    nodes = [node("od", [1, 1, 1, 1], capacity="on-demand")]  # free, but on-demand: not for batch
    plan = plan_pending(nodes, [need(2), need(2), need(1), need(8)], SIZING, "spot", 80)
    assert (plan.fits_existing, plan.new_nodes, plan.unplaceable) == (0, 2, 1)  # 2+2 on one node, 1 on another
    assert "larger than a whole 4-GPU node" in plan.report


def test_warm_standby_counts_idle_nodes_the_plan_did_not_use():
    sizing = SIZING.model_copy(update={"warm_standby": 1})
    nodes = [node("idle", [1, 1, 1, 1]), node("busy", [0, 0, 0, 0], replicas=4)]
    plan = plan_pending(nodes, [need(4)], sizing, "spot", 80)
    assert (plan.fits_existing, plan.idle_left) == (1, 0)
    assert size_pool(nodes, 4, 5, sizing, plan=plan).desired_nodes == 3  # the idle node is taken: one more as standby
