"""EC2 warm pool of a GPU node pool: how many stopped nodes to keep, and where a freed node goes.

A stopped instance in an Auto Scaling warm pool costs its EBS volumes, not its GPUs, and joins the
cluster in about a minute instead of a fresh launch's several (its image is already on disk). So:

- ``warm_pool_size``: keep as many stopped nodes as the forecast's peak over the cold-start
  horizon needs beyond the nodes running now (in nodes, capped by the pool's maximum), so a ramp
  draws on warm nodes rather than fresh launches;
- ``break_even_seconds``: how long a stopped node may wait before its disks cost more than the
  GPU time a fresh launch would waste (the extra minutes of boot paid at the running price);
- ``freed_nodes``: a node freed by scale-down goes back to the warm pool when the forecast says
  it is needed again within that break-even time, and is terminated otherwise;
- ``with_freed``: the warm pool's size that makes Auto Scaling keep exactly those freed nodes (and
  keep holding them while the break-even peak still needs them);
- ``with_floors``: the size raised to the floors other loops claim on the pool (a batch loop's spot
  mix claims ``warm_pool_needed``: the replicas its worst spot loss must replace within the notice).
  A claim lapses unless renewed within its ``ttl_seconds`` (``claim_ttl_seconds`` of the claimant's
  interval; ``lapsed_claims``), so the claim of a loop that was terminated does not hold nodes forever.

Pure: plain values in and out, shared by the node-pool workflow and the scaling benchmark.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from workflows.core.bounds import MAX_SECONDS


class NodeCosts(BaseModel):
    """What one node of the pool costs running and stopped, and how long each start takes."""

    running_per_hour: float = Field(gt=0, description="$ per hour of a running node (all its GPUs)")
    stopped_per_hour: float = Field(gt=0, description="$ per hour of a stopped node: its EBS volumes")
    fresh_start_seconds: float = Field(ge=0, description="a fresh launch until the node is Ready")
    warm_start_seconds: float = Field(ge=0, description="a warm-pool node's start until it is Ready")


class WarmPoolPlan(BaseModel):
    size: int = Field(ge=0, description="stopped nodes to keep in the warm pool")
    max_prepared: int = Field(ge=0, description="running + warm nodes: Auto Scaling's MaxGroupPreparedCapacity")
    reason: str


# NodePoolScaling's signal: a loop claims (or, with 0 replicas, drops) a floor on the pool's warm pool.
WARM_POOL_FLOOR_SIGNAL = "warm_pool_floor"


class WarmPoolFloor(BaseModel):
    """Stopped nodes a loop needs in the pool's warm pool, in its replicas (the pool knows its node size)."""

    source: str = Field(min_length=1, description="who claims it: the deployment whose spot mix needs it")
    replicas: int = Field(ge=0, description="replicas to start from the warm pool; 0 drops the claim")
    gpus_per_replica: int = Field(1, ge=1)
    ttl_seconds: float | None = Field(
        None, gt=0, le=MAX_SECONDS, description="the claim lapses unless signalled again within this; None (claims"
        " of before): held until dropped"
    )


# A claim lives this many of its claimant's intervals (at least the minimum) and is renewed every
# quarter of that: three renewals may go missing before it lapses.
CLAIM_TTL_INTERVALS = 10
CLAIM_MIN_TTL_SECONDS = 60.0
CLAIM_RENEWALS_PER_TTL = 4


def claim_ttl_seconds(interval_seconds: float) -> float:
    """How long a claim of a loop deciding every ``interval_seconds`` holds without renewal."""
    return max(CLAIM_MIN_TTL_SECONDS, CLAIM_TTL_INTERVALS * interval_seconds)


def lapsed_claims(deadlines: dict[str, float], now: float) -> list[str]:
    """The claimants (source -> deadline, epoch seconds) whose claims were not renewed by ``now``, sorted."""
    return sorted(source for source, deadline in deadlines.items() if deadline <= now)


class FreedNodes(BaseModel):
    to_warm_pool: int = Field(ge=0)
    to_terminate: int = Field(ge=0)
    reason: str


def nodes_for(replicas: float, replicas_per_node: int) -> int:
    """Nodes that host ``replicas`` (whole replicas, whole nodes)."""
    if replicas_per_node < 1:
        raise ValueError(f"replicas_per_node must be >= 1, got {replicas_per_node}")
    return math.ceil(math.ceil(max(0.0, replicas) - 1e-9) / replicas_per_node)


def warm_pool_size(peak_replicas: float, running_nodes: int, replicas_per_node: int, max_size: int, min_size: int = 0) -> WarmPoolPlan:
    """Stopped nodes to hold: nodes the forecast peak over the cold-start horizon needs beyond the
    ``running_nodes``, within [``min_size``, ``max_size``]."""
    if min_size > max_size:
        raise ValueError(f"min_size ({min_size}) > max_size ({max_size})")
    peak_nodes = nodes_for(peak_replicas, replicas_per_node)
    short = max(0, peak_nodes - running_nodes)
    size = min(max_size, max(min_size, short))
    capped = " (capped)" if size < short else ""
    reason = f"forecast peak {peak_replicas:.3g} replicas = {peak_nodes} nodes, {running_nodes} running: warm pool {size}{capped}"
    return WarmPoolPlan(size=size, max_prepared=running_nodes + size, reason=reason)


def with_floors(plan: WarmPoolPlan, floors: list[WarmPoolFloor], gpus_per_node: int, max_size: int) -> WarmPoolPlan:
    """The forecast's plan raised to the claimed floors (their nodes added up: their losses may come
    together), capped at ``max_size``; the reason names the claimants when a floor sets the size."""
    claimed = {f.source: nodes_for(f.replicas, max(1, gpus_per_node // f.gpus_per_replica)) for f in floors if f.replicas > 0}
    floor = sum(claimed.values())
    if floor <= plan.size:
        return plan
    size = min(max_size, floor)
    running = plan.max_prepared - plan.size
    by = " + ".join(f"{source} {nodes}" for source, nodes in claimed.items()) if len(claimed) > 1 else next(iter(claimed))
    capped = f" (capped from {floor})" if size < floor else ""
    reason = f"spot mix floor for {by}{capped}, above the forecast's {plan.size}"
    return WarmPoolPlan(size=size, max_prepared=running + size, reason=reason)


def break_even_seconds(costs: NodeCosts) -> float:
    """Time a stopped node may wait before its disks cost what a fresh launch instead wastes:
    the extra boot time of a fresh launch, paid at the running price."""
    wasted = max(0.0, costs.fresh_start_seconds - costs.warm_start_seconds) * costs.running_per_hour
    return wasted / costs.stopped_per_hour


def freed_nodes(freed: int, running_after: int, peak_replicas_within_break_even: float, replicas_per_node: int, in_warm_pool: int, max_size: int) -> FreedNodes:
    """Of ``freed`` nodes leaving service, how many go back to the warm pool: those the forecast
    peak within the break-even time needs beyond the nodes still running and already warm (room
    in the pool permitting); the rest are terminated."""
    if freed < 0:
        raise ValueError(f"freed must be >= 0, got {freed}")
    needed = nodes_for(peak_replicas_within_break_even, replicas_per_node) - running_after - in_warm_pool
    keep = max(0, min(freed, needed, max_size - in_warm_pool))
    reason = (
        f"forecast peak within break-even {peak_replicas_within_break_even:.3g} replicas:"
        f" {keep} of {freed} freed node(s) back to the warm pool ({running_after} running, {in_warm_pool} warm, max {max_size})"
    )
    return FreedNodes(to_warm_pool=keep, to_terminate=freed - keep, reason=reason)


def with_freed(plan: WarmPoolPlan, held: int, peak_replicas_within_break_even: float, running: int, freed: int,
               replicas_per_node: int, max_size: int) -> WarmPoolPlan:
    """The plan raised to the stopped nodes kept for the forecast peak within the break-even time:
    those kept before (``held``, the size last set) while that peak still needs them beyond the
    ``running`` nodes, plus those of the ``freed`` nodes a scale-in takes out of service now that
    ``freed_nodes`` sends back to the pool. With ReuseOnScaleIn, Auto Scaling returns a scaled-in
    instance to the warm pool only while the pool is below its size, and terminates it otherwise, so
    a size ``k`` above the pool's keeps exactly ``k`` freed nodes (set before the scale-in)."""
    still = min(held, warm_pool_size(peak_replicas_within_break_even, running, replicas_per_node, max_size).size)
    size = max(plan.size, still)
    reason = plan.reason
    if size > plan.size:
        reason = f"{size - plan.size} freed node(s) held for the forecast peak within break-even, above the forecast's {plan.size}"
    if freed > 0:
        out = freed_nodes(freed, running - freed, peak_replicas_within_break_even, replicas_per_node, size, max_size)
        size += out.to_warm_pool
        reason = f"scale-in: {out.reason}"
    if size == plan.size and reason == plan.reason:
        return plan
    return WarmPoolPlan(size=size, max_prepared=plan.max_prepared - plan.size + size, reason=reason)
