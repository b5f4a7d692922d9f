"""The GPU nodes under tideplane's replicas in the scaling benchmark: fresh launches, or starts from
an EC2 warm pool sized by the forecast, with the cold start by its parts (infra/fleetmodel/coldstart.yaml).

Counted in replica slots (``node.gpus / engine.gpus`` per node) as the fleet model counts GPUs per
replica: a replica ordered while the warm pool holds a slot starts warm (the levers in ``Levers``),
otherwise on a fresh node. A drawn slot is replaced by an instance launched into the pool, usable
after ``ColdStart.refill_s`` and paid as a running node meanwhile; a stopped node costs its disks.
Replicas scaled down go back to the pool when the forecast needs them within the break-even time
(``workflows.scaling.warm_pool.freed_nodes``), as Auto Scaling's ``ReuseOnScaleIn`` would.
Not modelled: EC2 refusing to start a stopped instance for lack of capacity, and packing several
replicas on one node (every replica pays a node start, as in the baselines).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.fleetmodel.coldstart import ColdStart, Levers
from workflows.scaling.warm_pool import NodeCosts, break_even_seconds, freed_nodes, nodes_for, warm_pool_size


@dataclass
class NodeLayer:
    cold: ColdStart
    levers: Levers
    fresh_s: float  # a replica on a freshly launched node (the fleet's cold start, as the baselines pay it)
    replicas_per_node: int
    max_pool_nodes: int
    gpu_hour_price: float
    warm_slots: int = 0  # slots on stopped nodes, ready to start
    refilling: list[float] = field(default_factory=list)  # usable-at times of nodes launched into the pool

    @property
    def costs(self) -> NodeCosts:
        return NodeCosts(
            running_per_hour=self.gpu_hour_price * self.cold.node_gpus,
            stopped_per_hour=self.cold.stopped_node_usd_per_hour,
            fresh_start_seconds=self.fresh_s,
            warm_start_seconds=self.cold.warm_s(self.levers),
        )

    @property
    def break_even_s(self) -> float:
        return break_even_seconds(self.costs)

    def next_start_s(self) -> float:
        """The cold start the next replica ordered would pay."""
        return self.cold.warm_s(self.levers) if self.levers.warm_pool and self.warm_slots else self.fresh_s

    def _arrive(self, now: float) -> None:
        ready = [t for t in self.refilling if t <= now]
        if ready:
            self.warm_slots += len(ready) * self.replicas_per_node
            self.refilling = [t for t in self.refilling if t > now]

    def startup_seconds(self, now: float, count: int) -> list[float]:
        """Cold starts of ``count`` replicas ordered now: warm while the pool has slots, then fresh."""
        self._arrive(now)
        warm = min(count, self.warm_slots) if self.levers.warm_pool else 0
        self.warm_slots -= warm
        return [self.cold.warm_s(self.levers)] * warm + [self.fresh_s] * (count - warm)

    def resize(self, now: float, peak_within_refill: float, peak_within_break_even: float, running_replicas: int) -> None:
        """Launch into the pool what the forecast peak over a refill's time needs beyond the running
        nodes; terminate stopped nodes beyond what the peak within the break-even time needs."""
        if not self.levers.warm_pool:
            return
        self._arrive(now)
        rpn, running = self.replicas_per_node, nodes_for(running_replicas, self.replicas_per_node)
        target = warm_pool_size(peak_within_refill, running, rpn, self.max_pool_nodes).size * rpn
        missing = target - self.warm_slots - len(self.refilling) * rpn
        if missing > 0:
            self.refilling += [now + self.cold.refill_s] * -(-missing // rpn)
        keep = max(target, warm_pool_size(peak_within_break_even, running, rpn, self.max_pool_nodes).size * rpn)
        self.warm_slots = min(self.warm_slots, keep)

    def release(self, now: float, count: int, running_after: int, peak_replicas_within_break_even: float) -> None:
        """``count`` replicas scaled down: their slots back to the pool when the forecast needs them
        within the break-even time, terminated otherwise."""
        if not self.levers.warm_pool or count <= 0:
            return
        self._arrive(now)
        rpn = self.replicas_per_node
        pooled = -(-self.warm_slots // rpn) + len(self.refilling)
        out = freed_nodes(-(-count // rpn), nodes_for(running_after, rpn), peak_replicas_within_break_even, rpn, pooled, self.max_pool_nodes)
        self.warm_slots += min(count, out.to_warm_pool * rpn)

    @property
    def standby_gpu_hours_per_hour(self) -> float:
        """What the pool costs now, in GPU-hours per hour: stopped nodes' disks at the GPU-hour price,
        and instances launched into the pool running (all their GPUs) until they stop."""
        if not self.levers.warm_pool:
            return 0.0
        rpn = self.replicas_per_node
        stopped = -(-self.warm_slots // rpn) * self.cold.stopped_node_usd_per_hour / self.gpu_hour_price
        launching = len(self.refilling) * self.cold.node_gpus
        return stopped + launching
