"""Placement planner and node-pool sizing: pure code over nodes, GPUs and model memory needs.

GPUs cannot be oversubscribed and a model's weights must fit in each GPU it is sharded over, so
"is there room for one more replica" is a per-GPU question, not a sum: the planner says where a
replica fits, when it needs a new node, and when memory is there in total but fragmented.
Priority classes map to capacity types as workflows/core/pools.py says: realtime on on-demand, batch on spot.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from workflows.core.pools import CAPACITY_FOR_CLASS, PoolClass


class Gpu(BaseModel):
    index: int
    free_gib: float = Field(ge=0)
    allocated: bool = Field(False, description="held by a pod (nvidia.com/gpu is not shared)")


class Node(BaseModel):
    name: str
    pool: str = ""
    capacity_type: str = "on-demand"
    gpus: list[Gpu] = Field(default_factory=list)
    replicas: int = Field(0, ge=0, description="model pods running on the node")
    gpu_util_percent: float = Field(0, ge=0)
    schedulable: bool = True


class ModelNeed(BaseModel):
    model: str
    gpu_memory_gib: float = Field(gt=0, description="memory of one replica, spread over its GPUs")
    gpus_per_replica: int = Field(1, ge=1)
    pool_class: PoolClass = "realtime"

    @property
    def per_gpu_gib(self) -> float:
        return self.gpu_memory_gib / self.gpus_per_replica


class Placement(BaseModel):
    fits: bool
    node: str | None = None
    gpus: list[int] = Field(default_factory=list)
    needs_node: bool = False
    fragmented: bool = False
    report: str


def _usable(node: Node, need: ModelNeed) -> list[Gpu]:
    return [g for g in node.gpus if not g.allocated and g.free_gib >= need.per_gpu_gib]


def place_replica(nodes: list[Node], need: ModelNeed) -> Placement:
    """Best fit: the eligible node whose chosen GPUs leave the least memory unused."""
    capacity = CAPACITY_FOR_CLASS[need.pool_class]
    eligible = [n for n in nodes if n.schedulable and n.capacity_type == capacity]
    best: tuple[float, str, Node, list[Gpu]] | None = None
    for node in eligible:
        usable = sorted(_usable(node, need), key=lambda g: (g.free_gib, g.index))
        if len(usable) < need.gpus_per_replica:
            continue
        chosen = usable[: need.gpus_per_replica]
        waste = sum(g.free_gib - need.per_gpu_gib for g in chosen)
        if best is None or (waste, node.name) < best[:2]:
            best = (waste, node.name, node, chosen)
    if best is not None:
        _, name, _, chosen = best
        return Placement(
            fits=True,
            node=name,
            gpus=[g.index for g in chosen],
            report=f"{need.model} fits on {name} GPUs {[g.index for g in chosen]}",
        )
    free = [g for n in eligible for g in n.gpus if not g.allocated]
    total = sum(g.free_gib for g in free)
    largest = max((g.free_gib for g in free), default=0.0)
    if total >= need.gpu_memory_gib and len(free) >= need.gpus_per_replica:
        return Placement(
            fits=False,
            needs_node=True,
            fragmented=True,
            report=(
                f"fragmented: enough total memory ({total:g} GiB free on {len(free)} {capacity} GPUs)"
                f" but no node has {need.gpus_per_replica} GPU(s) with {need.per_gpu_gib:g} GiB free"
                f" (largest free GPU {largest:g} GiB)"
            ),
        )
    return Placement(
        fits=False,
        needs_node=True,
        report=f"needs a {capacity} node: {total:g} GiB free on {capacity} GPUs, {need.model} needs {need.gpu_memory_gib:g} GiB",
    )


def node_to_free(nodes: list[Node]) -> Node | None:
    """The least-loaded schedulable node (fewest replicas, then lowest utilisation), to drain first."""
    candidates = [n for n in nodes if n.schedulable]
    if not candidates:
        return None
    return min(candidates, key=lambda n: (n.replicas, n.gpu_util_percent, n.name))


class PoolSizing(BaseModel):
    min_nodes: int = Field(0, ge=0)
    max_nodes: int = Field(10, ge=0)
    warm_standby: int = Field(1, ge=0, description="idle nodes kept up so a replica needs no node boot")
    gpus_per_node: int = Field(8, ge=1)
    pending_grace_seconds: float = Field(60, ge=0, description="how long pods stay Unschedulable before growing")


class PendingPlan(BaseModel):
    fits_existing: int = Field(0, description="pending replicas that fit on free GPUs of existing nodes")
    new_nodes: int = Field(0, description="nodes of the pool's shape that hold the rest")
    unplaceable: int = Field(0, description="replicas larger than a whole node of the pool")
    idle_left: int = Field(0, description="idle nodes no pending replica was planned on")
    fragmented: bool = False
    report: str = ""


def _take(nodes: list[Node], placement: Placement) -> None:
    node = next(n for n in nodes if n.name == placement.node)
    for gpu in node.gpus:
        if gpu.index in placement.gpus:
            gpu.allocated, gpu.free_gib = True, 0
    node.replicas += 1


def plan_pending(
    nodes: list[Node], pending: list[ModelNeed], sizing: PoolSizing, capacity_type: str, gpu_memory_gib: float
) -> PendingPlan:
    """Where a pool's Unschedulable replicas would go: free GPUs of existing nodes first (best
    fit), the rest on as few new nodes of the pool's shape as hold them, biggest replicas first.

    Placing one replica at a time is what makes fragmentation visible: 4 + 4 free GPUs on two
    nodes do not hold one 8-GPU replica, although the pool has 8 free GPUs.
    """
    existing = [n.model_copy(deep=True) for n in nodes]
    added: list[Node] = []
    fits = unplaceable = 0
    fragmented: list[str] = []
    for need in sorted(pending, key=lambda n: (-n.gpus_per_replica, -n.gpu_memory_gib, n.model)):
        placed = place_replica(existing, need)
        if placed.fits:
            fits += 1
            _take(existing, placed)
            continue
        if placed.fragmented:
            fragmented.append(placed.report)
        placed = place_replica(added, need)
        if not placed.fits:
            fresh = Node(
                name=f"new-{len(added) + 1}",
                capacity_type=capacity_type,
                gpus=[Gpu(index=i, free_gib=gpu_memory_gib) for i in range(sizing.gpus_per_node)],
            )
            placed = place_replica([fresh], need)
            if not placed.fits:
                unplaceable += 1
                continue
            added.append(fresh)
        _take(added, placed)
    idle_left = sum(1 for n in existing if n.schedulable and n.replicas == 0)
    report = f"{len(pending)} pending replica(s): {fits} fit on existing nodes, {len(added)} new node(s) needed"
    if unplaceable:
        report += f", {unplaceable} larger than a whole {sizing.gpus_per_node}-GPU node"
    if fragmented:
        report += f"; {fragmented[0]}"
    return PendingPlan(
        fits_existing=fits,
        new_nodes=len(added),
        unplaceable=unplaceable,
        idle_left=idle_left,
        fragmented=bool(fragmented),
        report=report,
    )


class PoolDecision(BaseModel):
    desired_nodes: int
    drain: str | None = Field(None, description="node to drain and remove (least loaded)")
    reason: str


def size_pool(
    nodes: list[Node],
    pending_gpus: int,
    pending_for_seconds: float,
    sizing: PoolSizing,
    booting: int = 0,
    plan: PendingPlan | None = None,
) -> PoolDecision:
    """Grow only for pods that stayed Unschedulable; shrink one idle node above the warm standby.

    ``booting``: instances asked for that have not joined as nodes yet; nothing changes until
    they have, so one burst of pending pods never asks for its nodes twice. ``plan`` (from
    ``plan_pending``): grow by the nodes the pending replicas really need, none when they fit on
    existing capacity; without it, by their GPUs over whole nodes.
    """
    current = len(nodes)
    if booting > 0:
        return PoolDecision(desired_nodes=current + booting, reason=f"hold: {booting} node(s) still booting")
    idle = [n for n in nodes if n.replicas == 0 and n.schedulable]
    if pending_gpus > 0 and pending_for_seconds >= sizing.pending_grace_seconds:
        if plan is None:
            want = current + math.ceil(pending_gpus / sizing.gpus_per_node) + sizing.warm_standby - len(idle)
        else:
            want = current + plan.new_nodes + max(0, sizing.warm_standby - plan.idle_left)
        desired = min(max(want, current), sizing.max_nodes)
        verb = "grow" if desired > current else "hold"
        reason = f"{verb}: {pending_gpus} GPU(s) pending {pending_for_seconds:.0f}s, {len(idle)} idle node(s)"
        if plan is not None:
            reason += f"; {plan.report}"
        if want > sizing.max_nodes:
            reason += f"; capped at max_nodes {sizing.max_nodes}"
        return PoolDecision(desired_nodes=desired, reason=reason)
    if current < sizing.min_nodes:
        return PoolDecision(desired_nodes=sizing.min_nodes, reason=f"raise to min_nodes {sizing.min_nodes}")
    if len(idle) < sizing.warm_standby and pending_gpus == 0 and current < sizing.max_nodes:
        return PoolDecision(
            desired_nodes=current + 1, reason=f"warm standby: {len(idle)} idle of {sizing.warm_standby} wanted"
        )
    if len(idle) > sizing.warm_standby and current > sizing.min_nodes and pending_gpus == 0:
        drain = node_to_free(idle)
        return PoolDecision(
            desired_nodes=current - 1, drain=drain.name if drain else None,
            reason=f"shrink: {len(idle)} idle node(s) > warm standby {sizing.warm_standby}",
        )
    return PoolDecision(desired_nodes=current, reason=f"hold at {current} node(s)")
