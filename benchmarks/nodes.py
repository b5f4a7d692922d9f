"""The GPU capacity under tideplane's replicas in the scaling benchmark: fresh launches, or starts
from an EC2 warm pool sized by the forecast, with the cold start by its parts (infra/fleetmodel/coldstart.yaml).

The fleet model bills GPUs per replica, as if each replica had its share of a node to itself, so
the pool is counted in slots of one replica's GPUs (``engine.gpus`` of a node's ``node.gpus``): a
replica ordered while the pool holds a slot starts warm (with the levers in ``Levers``), otherwise
on a fresh node. A drawn slot is replaced by capacity launched into the pool, usable after
``ColdStart.refill_s`` and paid at the running price meanwhile; a stopped slot costs its share of
the node's disks. Slots freed by scale-down go back to the pool when the forecast needs them within
the break-even time (``workflows.scaling.warm_pool.freed_nodes``), as Auto Scaling's
``ReuseOnScaleIn`` would, and are terminated otherwise.
Not modelled: EC2 refusing to start a stopped instance for lack of capacity; replicas landing on
free GPUs of running nodes (every replica pays a node start, as the baselines' do).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infra.fleetmodel.coldstart import ColdStart, Levers
from workflows.scaling.warm_pool import NodeCosts, break_even_seconds, freed_nodes, warm_pool_size


@dataclass
class NodeLayer:
    cold: ColdStart
    levers: Levers
    fresh_s: float  # a replica on a freshly launched node (the fleet's cold start, as the baselines pay it)
    slot_gpus: int  # GPUs of one replica
    max_pool_slots: int
    gpu_hour_price: float
    warm_slots: int = 0  # stopped capacity, ready to start
    refilling: list[float] = field(default_factory=list)  # usable-at times of slots launched into the pool
    prepared: bool = False  # the first sizing finds the pool prepared, as the fleet at t=0 is warm

    @property
    def costs(self) -> NodeCosts:
        """One slot's prices: its GPUs running, its share of a stopped node's disks."""
        return NodeCosts(
            running_per_hour=self.gpu_hour_price * self.slot_gpus,
            stopped_per_hour=self.cold.stopped_node_usd_per_hour * self.slot_gpus / self.cold.node_gpus,
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
            self.warm_slots += len(ready)
            self.refilling = [t for t in self.refilling if t > now]

    def startup_seconds(self, now: float, count: int) -> list[float]:
        """Cold starts of ``count`` replicas ordered now: warm while the pool has slots, then fresh."""
        self._arrive(now)
        warm = min(count, self.warm_slots) if self.levers.warm_pool else 0
        self.warm_slots -= warm
        return [self.cold.warm_s(self.levers)] * warm + [self.fresh_s] * (count - warm)

    def resize(self, now: float, peak_within_refill: float, peak_within_break_even: float, running: int) -> None:
        """Launch into the pool what the forecast peak over a refill's time needs beyond the
        ``running`` replicas; terminate stopped slots beyond what the peak within the break-even time needs."""
        if not self.levers.warm_pool:
            return
        self._arrive(now)
        target = warm_pool_size(peak_within_refill, running, 1, self.max_pool_slots).size
        missing = target - self.warm_slots - len(self.refilling)
        if not self.prepared:
            self.prepared, self.warm_slots, missing = True, max(0, missing), 0
        if missing > 0:
            self.refilling += [now + self.cold.refill_s] * missing
        keep = max(target, warm_pool_size(peak_within_break_even, running, 1, self.max_pool_slots).size)
        self.warm_slots = min(self.warm_slots, keep)

    def release(self, now: float, count: int, running_after: int, peak_replicas_within_break_even: float) -> None:
        """``count`` replicas scaled down: back to the pool when the forecast needs them within the
        break-even time, terminated otherwise."""
        if not self.levers.warm_pool or count <= 0:
            return
        self._arrive(now)
        pooled = self.warm_slots + len(self.refilling)
        self.warm_slots += freed_nodes(count, running_after, peak_replicas_within_break_even, 1, pooled, self.max_pool_slots).to_warm_pool

    @property
    def standby_gpu_hours_per_hour(self) -> float:
        """What the pool costs now, in GPU-hours per hour: stopped slots' disks at the GPU-hour price,
        and capacity launched into the pool running (its GPUs) until it stops."""
        if not self.levers.warm_pool:
            return 0.0
        stopped = self.warm_slots * self.costs.stopped_per_hour / self.gpu_hour_price
        return stopped + len(self.refilling) * self.slot_gpus
