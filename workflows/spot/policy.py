"""The spot policy: one set of pure functions that the spot workflows run and the benchmark replays.

Plain values in, plain values out. Who calls what (tests/unit/spot/test_spot_policy.py and
tests/workflows/spot/test_spot.py check that the workflows and ``benchmarks.spot`` use these objects):

- ``plan_mix``: how many replicas on spot per failure domain and how many on-demand as a base
  (the benchmark plans with it at every trace sample; in a cluster the scaler owns the spot
  Deployments' replicas, so no workflow places spot replicas yet);
- ``preemption_predicted``: which domains are about to lose their spot replicas (an interruption
  notice, a rebalance recommendation, a high recent preemption rate or launch failures), and
  ``on_demand_needed``: how many on-demand replicas cover them ahead of time (``SpotReclaim``
  sizes its claims with it; the benchmark pre-warms with it);
- ``on_demand_target``: the same need with the return-to-spot hysteresis (``return_to_spot``
  after ``stabilisation_delay``): ``ReturnToSpot`` and the benchmark give on-demand back with it;
- ``warm_pool_needed``: how many stopped on-demand instances (an EC2 warm pool) cover the plan's
  worst loss within the notice (the benchmark holds them; the scaling loop records it with the
  split it applies);
- ``rebalance_hold`` and ``notice_expiry``: how long a rebalance pre-warm is held and a notice
  deduplicated (``SpotReclaim``, ``SpotInterruptionWatcher``).

Model (after SkyServe's SpotHedge, Mao et al., EuroSys 2025): spot capacity is lost a failure
domain at a time (an instance type in a zone, ``failure_domain``), so replicas in one domain are
preempted together and domains fail independently, each with its recent preemption rate ``p``
(the fraction of recent samples in which the domain's spot capacity was unavailable), but never
below ``min_preemption_rate``: a domain that was not preempted in the recent window is not one
that cannot be. On-demand replicas are never preempted. A plan puts ``S`` spot replicas evenly
over the ``k`` domains available now with the lowest expected cost per available replica
(``price / (1 - p)``), at most a domain's launchable ``capacity`` in each, and keeps ``b``
on-demand replicas as a base, such that P(Ready replicas >= target) >= the availability target
at the lowest hourly cost. Over-provisioning (``S > target - b``) buys availability with cheap
spot replicas instead of expensive on-demand ones. Domains of one region are often lost in the
same minute: across regions, ``survive_group_loss`` keeps the target without the region holding
the most.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from workflows.spot.events import NOTICE_SECONDS, NoticeKind, SpotNotice

MIN_PREEMPTION_RATE = 0.02  # no zone is counted as more reliable than this


def failure_domain(instance_type: str, zone: str) -> str:
    """Spot replicas of one instance type in one zone are interrupted together."""
    return f"{instance_type}/{zone}"


@dataclass(frozen=True)
class ZoneMarket:
    """What we know about spot in one failure domain (``zone`` is its key, see ``failure_domain``)."""

    zone: str
    preemption_rate: float  # 0..1, recent fraction of intervals with spot unavailable
    spot_price: float  # per replica-hour
    available: bool = True  # spot capacity obtainable right now (not preempted)
    capacity: int | None = None  # spot replicas the domain can hold now (launch counts); None: no limit known
    group: str | None = None  # domains that tend to fail together (a region's zones); None: its own


@dataclass(frozen=True)
class MixPlan:
    target: int
    spot_per_zone: dict[str, int]
    on_demand: int
    availability: float  # P(Ready >= target) under the model
    cost_per_hour: float
    spot_zones: tuple[str, ...] = field(default=())

    @property
    def spot(self) -> int:
        return sum(self.spot_per_zone.values())

    @property
    def overprovision(self) -> int:
        """Replicas beyond the target (the hedge)."""
        return self.spot + self.on_demand - self.target


def plan_mix(
    target: int,
    availability_target: float,
    zones: list[ZoneMarket] | tuple[ZoneMarket, ...],
    on_demand_price: float,
    max_overprovision: int | None = None,
    min_preemption_rate: float = MIN_PREEMPTION_RATE,
    survive_group_loss: bool = False,
) -> MixPlan:
    """Cheapest (spot per zone, on-demand base) meeting ``availability_target`` for ``target`` replicas.

    ``max_overprovision`` bounds the extra spot replicas (default: ``target``, i.e. at most 2x);
    ``min_preemption_rate`` is the rate a zone with no recent preemption is given.
    ``survive_group_loss``: when the plan spans several groups (regions), spot counts only up to
    what is left after losing the group holding the most, whatever the independent-domain
    probabilities say: zones of one region are often lost in the same minute, and a replacement
    takes longer to start than the notice lasts.
    All on-demand (availability 1) is always a candidate, so a plan always exists.
    """
    if target < 0:
        raise ValueError(f"target must be >= 0, got {target}")
    if not 0 <= availability_target <= 1:
        raise ValueError(f"availability_target must be in [0, 1], got {availability_target}")
    if not 0 <= min_preemption_rate <= 1:
        raise ValueError(f"min_preemption_rate must be in [0, 1], got {min_preemption_rate}")
    extra = target if max_overprovision is None else max(0, max_overprovision)
    best = MixPlan(target, {}, target, 1.0, target * on_demand_price)
    rated = [(z, min(1.0, max(min_preemption_rate, z.preemption_rate))) for z in zones if z.available]
    usable = sorted(rated, key=lambda zr: (_cost_per_available(zr[0].spot_price, zr[1]), zr[1], zr[0].zone))
    hedge_groups = survive_group_loss and len({z.group or z.zone for z, _ in usable}) > 1
    for k in range(1, len(usable) + 1):
        chosen = [z for z, _ in usable[:k]]
        rates = [r for _, r in usable[:k]]
        caps = [z.capacity for z in chosen]
        for spot in range(k, target + extra + 1):
            counts = _spread(spot, caps)
            if counts is None:
                break  # these domains cannot hold more
            survival = _survival(list(zip(counts, rates)))
            # largest q with P(X >= q) >= availability_target: spot covers q, on-demand the rest
            covered = max((q for q, p in enumerate(survival) if p >= availability_target - 1e-12), default=0)
            if hedge_groups:
                covered = min(covered, _left_after_group_loss(counts, chosen))
            base = max(0, target - covered)
            availability = survival[target - base] if target - base < len(survival) else 0.0
            cost = base * on_demand_price + sum(c * z.spot_price for c, z in zip(counts, chosen))
            if cost < best.cost_per_hour - 1e-9:
                best = MixPlan(
                    target,
                    {z.zone: c for c, z in zip(counts, chosen) if c},
                    base,
                    availability,
                    cost,
                    tuple(z.zone for z in chosen),
                )
            if base == 0:
                break  # more spot in these zones only costs more
    return best


@dataclass(frozen=True)
class DomainRisk:
    """What hints that a failure domain's spot replicas are about to go."""

    notice: bool = False  # an interruption notice or a going-away state for an instance in it
    rebalance: bool = False  # an EC2 rebalance recommendation
    preemption_rate: float = 0.0  # recent fraction of samples preempted
    launch_failure_rate: float = 0.0  # recent fraction of requested launches that failed


@dataclass(frozen=True)
class PrewarmRule:
    """When a domain counts as about to be preempted without a notice (``inf``: never)."""

    preemption_rate: float = float("inf")
    launch_failure_rate: float = float("inf")


def preemption_predicted(risk: DomainRisk, rule: PrewarmRule = PrewarmRule()) -> bool:
    """A notice or a rebalance recommendation always; a shaky domain when the rule says so."""
    return (
        risk.notice
        or risk.rebalance
        or risk.preemption_rate >= rule.preemption_rate
        or risk.launch_failure_rate >= rule.launch_failure_rate
    )


def on_demand_needed(target: int, spot_ready: int, at_risk: int = 0, base: int = 0) -> int:
    """On-demand replicas to have now: the base, or what ``target`` lacks once the at-risk spot replicas are gone."""
    return max(base, target - (spot_ready - at_risk), 0)


def warm_pool_needed(plan: MixPlan, zones: list[ZoneMarket] | tuple[ZoneMarket, ...]) -> int:
    """Stopped on-demand instances to hold in an EC2 warm pool so the plan's worst loss is covered in time.

    A replacement from a fresh launch starts after the notice has run out (240 s vs 120 s); a
    stopped warm-pool instance joins in about a minute. The worst loss is the spot of the group
    (a region's zones, lost together) holding the most; what the on-demand base and the spot left
    elsewhere cover needs no warm instance (``on_demand_needed``).
    """
    group_of = {z.zone: z.group or z.zone for z in zones}
    per_group: dict[str, int] = {}
    for zone, count in plan.spot_per_zone.items():
        key = group_of.get(zone, zone)
        per_group[key] = per_group.get(key, 0) + count
    lost = max(per_group.values(), default=0)
    return on_demand_needed(plan.target, plan.spot, lost, plan.on_demand) - plan.on_demand


def on_demand_target(
    held: int,
    need: int,
    healthy_since: float | None,
    now: float,
    stabilisation_seconds: float,
    flaps: int,
    max_stabilisation_seconds: float,
) -> int:
    """On-demand replicas to keep: grow to ``need`` at once, shrink to it only once spot has been
    healthy for the stabilisation delay (``return_to_spot``)."""
    if need >= held:
        return need
    delay = stabilisation_delay(stabilisation_seconds, flaps, max_stabilisation_seconds)
    return need if return_to_spot(healthy_since, now, delay) else held


def preemption_rate(history: list[int] | tuple[int, ...], window: int) -> float:
    """Recent preemption rate from a 0/1 availability history (1 = preempted), last ``window`` samples."""
    recent = history[-window:] if window > 0 else history
    return sum(recent) / len(recent) if recent else 0.0


def stabilisation_delay(base_seconds: float, recent_flaps: int, max_seconds: float) -> float:
    """How long spot must stay healthy before moving back: doubles with each recent flap."""
    return min(max_seconds, base_seconds * (2 ** max(0, recent_flaps)))


def return_to_spot(healthy_since: float | None, now: float, delay_seconds: float) -> bool:
    """Move replicas back to spot only after spot capacity has been healthy for the whole delay."""
    return healthy_since is not None and now - healthy_since >= delay_seconds


def rebalance_hold(hold_seconds: float | None, stabilisation_seconds: float) -> float:
    """How long a rebalance pre-warm waits for an interruption before it is given back.

    A recommendation that has not become an interruption within the stabilisation delay is
    treated like spot that has been healthy that long (``return_to_spot``): the same rule, so
    the default follows ``stabilisation_seconds`` (300 s; 30 s with the sandbox's time-scaled
    policy) instead of holding on-demand replacements for an hour. ``hold_seconds`` overrides.
    """
    return hold_seconds if hold_seconds is not None else stabilisation_seconds


def notice_key(notice: SpotNotice) -> str:
    """What makes two notices the same for the watcher: the instance and the kind (and state)."""
    return f"{notice.instance_id}/{notice.kind.value}" + (f"/{notice.state}" if notice.state else "")


def notice_expiry(notice: SpotNotice, rebalance_hold_seconds: float) -> datetime:
    """Until when a notice lives: repeats before then are the same notice, not a new reclaim.

    An interruption or going-away state lives until the instance is gone (at least the two-minute
    notice); a rebalance recommendation for as long as its pre-warm is held.
    """
    if notice.kind == NoticeKind.REBALANCE:
        return notice.time + timedelta(seconds=rebalance_hold_seconds)
    return max(notice.deadline(), notice.time + timedelta(seconds=NOTICE_SECONDS))


def _cost_per_available(price: float, rate: float) -> float:
    """Expected price of one replica-hour that is actually available in a zone preempted at ``rate``."""
    return price / (1 - rate) if rate < 1 else float("inf")


def _spread(total: int, caps: list[int | None]) -> list[int] | None:
    """``total`` replicas over the domains as evenly as their capacities allow, cheapest first; None if they cannot hold it."""
    counts = [0] * len(caps)
    room = [float("inf") if c is None else c for c in caps]
    for _ in range(total):
        i = min((j for j in range(len(caps)) if counts[j] < room[j]), key=lambda j: counts[j], default=None)
        if i is None:
            return None
        counts[i] += 1
    return counts


def _left_after_group_loss(counts: list[int], zones: list[ZoneMarket]) -> int:
    """Spot replicas left when the group holding the most of them is lost."""
    per_group: dict[str, int] = {}
    for count, zone in zip(counts, zones):
        key = zone.group or zone.zone
        per_group[key] = per_group.get(key, 0) + count
    return sum(counts) - max(per_group.values())


def _survival(zones: list[tuple[int, float]]) -> list[float]:
    """P(X >= q) for q = 0..sum, X = replicas in zones that are not preempted."""
    dist = [1.0]
    for count, rate in zones:
        rate = min(1.0, max(0.0, rate))
        nxt = [0.0] * (len(dist) + count)
        for value, prob in enumerate(dist):
            if prob:
                nxt[value] += prob * rate
                nxt[value + count] += prob * (1 - rate)
        dist = nxt
    survival = [0.0] * len(dist)
    acc = 0.0
    for value in range(len(dist) - 1, -1, -1):
        acc += dist[value]
        survival[value] = acc
    return survival

