"""Placement planner and pool sizing rules."""

from workflows.core.naming import NODE_CAPACITY_TYPE
from workflows.scaling.placement import Gpu, ModelNeed, Node, PoolSizing, node_to_free, place_replica, size_pool
from workflows.core.pools import node_selector


def node(name, free, capacity="on-demand", replicas=0, util=0.0, allocated=()):
    return Node(
        name=name,
        capacity_type=capacity,
        gpus=[Gpu(index=i, free_gib=f, allocated=i in allocated) for i, f in enumerate(free)],
        replicas=replicas,
        gpu_util_percent=util,
    )


def test_fits_on_existing_capacity_best_fit():
    nodes = [node("a", [80, 80]), node("b", [45, 10])]
    p = place_replica(nodes, ModelNeed(model="llama", gpu_memory_gib=40))
    assert p.fits and p.node == "b" and p.gpus == [0]  # tightest GPU, keeps the 80 GiB ones whole


def test_sharded_model_needs_enough_gpus_on_one_node():
    nodes = [node("a", [80, 0]), node("b", [80, 80, 80])]
    p = place_replica(nodes, ModelNeed(model="llama-70b", gpu_memory_gib=140, gpus_per_replica=2))
    assert p.fits and p.node == "b" and p.gpus == [0, 1]


def test_allocated_gpus_are_not_shared():
    p = place_replica([node("a", [80, 80], allocated={0, 1})], ModelNeed(model="m", gpu_memory_gib=40))
    assert not p.fits and p.needs_node and not p.fragmented


def test_needs_node_when_memory_short():
    p = place_replica([node("a", [20, 20])], ModelNeed(model="m", gpu_memory_gib=60))
    assert not p.fits and p.needs_node and not p.fragmented
    assert "needs a on-demand node" in p.report and "40 GiB free" in p.report


def test_fragmentation_reported():
    nodes = [node("a", [30, 30]), node("b", [30])]
    p = place_replica(nodes, ModelNeed(model="m", gpu_memory_gib=40))
    assert not p.fits and p.fragmented and p.needs_node
    assert "enough total memory (90 GiB free on 3 on-demand GPUs)" in p.report
    assert "largest free GPU 30 GiB" in p.report


def test_pool_class_follows_capacity_type():
    nodes = [node("od", [80], capacity="on-demand"), node("sp", [80], capacity="spot")]
    assert place_replica(nodes, ModelNeed(model="m", gpu_memory_gib=40, pool_class="batch")).node == "sp"
    assert place_replica(nodes, ModelNeed(model="m", gpu_memory_gib=40, pool_class="realtime")).node == "od"
    assert node_selector("batch") == {NODE_CAPACITY_TYPE: "spot"}
    assert node_selector("realtime") == {NODE_CAPACITY_TYPE: "on-demand"}


def test_least_loaded_node_is_freed_first():
    nodes = [node("a", [0], replicas=3, util=90), node("b", [0], replicas=1, util=70), node("c", [0], replicas=1, util=20)]
    assert node_to_free(nodes).name == "c"
    nodes[2].schedulable = False  # already cordoned: not a candidate
    assert node_to_free(nodes).name == "b"


def test_pool_grows_only_after_pending_grace():
    sizing = PoolSizing(min_nodes=1, max_nodes=6, warm_standby=0, gpus_per_node=4, pending_grace_seconds=60)
    busy = [node("a", [0] * 4, replicas=4)]
    assert size_pool(busy, pending_gpus=6, pending_for_seconds=30, sizing=sizing).desired_nodes == 1
    d = size_pool(busy, pending_gpus=6, pending_for_seconds=60, sizing=sizing)
    assert d.desired_nodes == 3 and "6 GPU(s) pending" in d.reason
    assert size_pool(busy, pending_gpus=100, pending_for_seconds=60, sizing=sizing).desired_nodes == 6
    # asked-for nodes still booting: no second request for the same pods
    d = size_pool(busy, pending_gpus=6, pending_for_seconds=90, sizing=sizing, booting=2)
    assert d.desired_nodes == 3 and "booting" in d.reason


def test_pool_keeps_warm_standby_and_shrinks_least_loaded_idle():
    sizing = PoolSizing(min_nodes=1, max_nodes=6, warm_standby=1)
    assert size_pool([node("a", [0], replicas=2)], 0, 0, sizing).desired_nodes == 2
    nodes = [node("a", [0], replicas=2), node("b", [80], util=5), node("c", [80], util=1)]
    d = size_pool(nodes, 0, 0, sizing)
    assert (d.desired_nodes, d.drain) == (2, "c")
    assert size_pool(nodes[:2], 0, 0, sizing).desired_nodes == 2  # exactly the standby: hold
    sizing_min = PoolSizing(min_nodes=3, max_nodes=6, warm_standby=0)
    assert size_pool(nodes, 0, 0, sizing_min).desired_nodes == 3  # never below minimum
