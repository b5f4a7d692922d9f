"""Spot/on-demand mix policy (SpotHedge-style) and the return-to-spot stabilisation rule.

Pure, plain-value code: the failover workflows, the unit tests and the offline spot benchmark
(issue 8) call the same functions.

Model (after SkyServe's SpotHedge, Mao et al., EuroSys 2025): spot capacity is lost a zone at a
time, so replicas in one zone are preempted together and zones fail independently, each with its
recent preemption rate ``p`` (the fraction of recent intervals in which the zone's spot capacity
was unavailable), but never below ``min_preemption_rate``: a zone that was not preempted in the
recent window is not a zone that cannot be, and calling it certain would put every replica in
it. On-demand replicas are never preempted. A plan puts ``S`` spot replicas evenly over the
``k`` zones, available now, with the lowest expected cost per available replica
(``price / (1 - p)``: a cheap zone that is often gone costs more than its price, a reliable
but expensive one is not worth its reliability when a hedge over cheap zones does the same), and
keeps ``b`` on-demand replicas as a base, such that P(Ready replicas >= target) >= the
availability target at the lowest hourly cost. Over-provisioning (``S > target - b``) buys
availability with cheap spot replicas instead of expensive on-demand ones; when a zone is
preempted the dynamic fallback (``fallback_on_demand``) covers the shortfall on on-demand until
spot returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_PREEMPTION_RATE = 0.02  # no zone is counted as more reliable than this


@dataclass(frozen=True)
class ZoneMarket:
    """What we know about spot in one zone."""

    zone: str
    preemption_rate: float  # 0..1, recent fraction of intervals with spot unavailable
    spot_price: float  # per replica-hour
    available: bool = True  # spot capacity obtainable right now (not preempted)


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
) -> MixPlan:
    """Cheapest (spot per zone, on-demand base) meeting ``availability_target`` for ``target`` replicas.

    ``max_overprovision`` bounds the extra spot replicas (default: ``target``, i.e. at most 2x);
    ``min_preemption_rate`` is the rate a zone with no recent preemption is given.
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
    for k in range(1, len(usable) + 1):
        chosen = [z for z, _ in usable[:k]]
        rates = [r for _, r in usable[:k]]
        for spot in range(k, target + extra + 1):
            counts = _spread(spot, k)
            survival = _survival(list(zip(counts, rates)))
            # largest q with P(X >= q) >= availability_target: spot covers q, on-demand the rest
            covered = max((q for q, p in enumerate(survival) if p >= availability_target - 1e-12), default=0)
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


def fallback_on_demand(target: int, ready_spot: int, base: int = 0) -> int:
    """On-demand replicas needed now: the base, or the shortfall of Ready spot replicas if larger."""
    return max(base, target - ready_spot, 0)


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


def _cost_per_available(price: float, rate: float) -> float:
    """Expected price of one replica-hour that is actually available in a zone preempted at ``rate``."""
    return price / (1 - rate) if rate < 1 else float("inf")


def _spread(total: int, k: int) -> list[int]:
    """``total`` replicas over ``k`` zones as evenly as possible, cheapest available zones first."""
    q, r = divmod(total, k)
    return [q + 1 if i < r else q for i in range(k)]


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

