"""Spot benchmark: replay SkyNomad's per-zone spot H100 availability against three fleets.

- on-demand: ``target`` replicas on demand at the cheapest on-demand price in the trace;
- spot-only: ``target`` spot replicas in the cheapest zone that is up; when it is preempted the
  fleet relaunches in the next cheapest zone that is up, with no on-demand to bridge the gap;
- tideplane: ``workflows.spot.policy`` as the failover workflows use it: ``plan_mix`` (spot
  over-provisioned across the zones with the lowest expected cost per available replica + an
  on-demand base, from each zone's recent preemption rate, floored at ``MIN_PREEMPTION_RATE``),
  ``fallback_on_demand`` the moment Ready spot falls short, and ``return_to_spot`` after
  ``stabilisation_delay`` once spot is healthy again.

The trace has one sample per zone every 600 s (SkyNomad data: 1 = preempted); the replay runs
minute by minute so that a replacement's start-up (``cold_start_s``) shows as a capacity gap.
A replica is one GPU, priced at the zone's a3-highgpu-8g price / 8.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import traces
from benchmarks.scaling import markdown_table as _table
from benchmarks.scaling import write_csv
from workflows.spot.policy import (
    MIN_PREEMPTION_RATE,
    ZoneMarket,
    fallback_on_demand,
    plan_mix,
    preemption_rate,
    return_to_spot,
    stabilisation_delay,
)

MINUTE = 60.0
SOURCE = "SkyNomad spot H100 availability, 13 GCP zones, 2025-10-03..18 (github.com/andylizf/skynomad-artifact, Apache-2.0)"


@dataclass
class _Replica:
    zone: str | None  # None: on demand
    ready_at: float


@dataclass
class Replay:
    policy: str
    ready: list[int] = field(default_factory=list)  # per minute
    spot_ready: list[int] = field(default_factory=list)
    on_demand: list[int] = field(default_factory=list)  # paid on-demand replicas per minute
    cost: float = 0.0
    cumulative: list[float] = field(default_factory=list)  # cost so far, per minute
    preempted: int = 0  # replicas lost to preemption


@dataclass(frozen=True)
class Market:
    zones: list[traces.SpotZone]
    on_demand_price: float  # per replica-hour

    @property
    def steps(self) -> int:
        return min(len(z.available) for z in self.zones)

    def spot_price(self, zone: traces.SpotZone) -> float:
        return zone.spot_price / zone.gpus


def market(zones: list[traces.SpotZone]) -> Market:
    return Market(zones, min(z.on_demand_price / z.gpus for z in zones))


class _Fleet:
    """Replicas by zone; launches, preemptions and per-minute billing."""

    def __init__(self, m: Market, cold_start_s: float) -> None:
        self.m = m
        self.cold_start_s = cold_start_s
        self.replicas: list[_Replica] = []
        self.prices = {z.zone: m.spot_price(z) for z in m.zones}

    def count(self, zone: str | None) -> int:
        return sum(1 for r in self.replicas if r.zone == zone)

    def resize(self, zone: str | None, want: int, now: float, up: bool = True) -> None:
        have = self.count(zone)
        if want > have and up:
            self.replicas += [_Replica(zone, now + self.cold_start_s) for _ in range(want - have)]
        elif want < have:
            mine = sorted((r for r in self.replicas if r.zone == zone), key=lambda r: -r.ready_at)  # newest first
            drop = {id(r) for r in mine[: have - want]}
            self.replicas = [r for r in self.replicas if id(r) not in drop]

    def preempt(self, down: set[str]) -> int:
        lost = sum(1 for r in self.replicas if r.zone in down)
        self.replicas = [r for r in self.replicas if r.zone not in down]
        return lost

    def tick(self, now: float, out: Replay) -> None:
        ready = [r for r in self.replicas if r.ready_at <= now]
        out.ready.append(len(ready))
        out.spot_ready.append(sum(1 for r in ready if r.zone is not None))
        out.on_demand.append(self.count(None))
        out.cost += sum(self.m.on_demand_price if r.zone is None else self.prices[r.zone] for r in self.replicas) * MINUTE / 3600
        out.cumulative.append(out.cost)


def _steps(m: Market, days: float | None) -> int:
    n = m.steps
    return min(n, math.ceil(days * 86400 / m.zones[0].step_s)) if days else n


def on_demand_only(m: Market, target: int, days: float | None = None) -> Replay:
    out = Replay("on-demand")
    fleet = _Fleet(m, 0.0)
    fleet.resize(None, target, -1.0)  # the baseline fleet is up before the trace starts
    per_step = round(m.zones[0].step_s / MINUTE)
    for i in range(_steps(m, days) * per_step):
        fleet.tick(i * MINUTE, out)
    return out


def spot_only(m: Market, target: int, cold_start_s: float, notice_s: float = 30.0, days: float | None = None) -> Replay:
    out = Replay("spot-only")
    fleet = _Fleet(m, cold_start_s)
    by_price = sorted(m.zones, key=lambda z: (m.spot_price(z), z.zone))
    step_s = m.zones[0].step_s
    per_step = round(step_s / MINUTE)
    steps = _steps(m, days)
    home: str | None = None
    for step in range(steps):
        now = step * step_s
        up = {z.zone for z in m.zones if z.available[step]}
        out.preempted += fleet.preempt({z.zone for z in m.zones} - up)
        doomed = _doomed(m, step, steps)
        for k in range(per_step):
            t = now + k * MINUTE
            noticed = doomed if t + MINUTE > now + step_s - notice_s else set()
            if home not in up or home in noticed:
                home = next((z.zone for z in by_price if z.zone in up and z.zone not in noticed), None)
            if home is not None:
                at = min(t, now + step_s - notice_s) if noticed else t
                fleet.resize(home, target, at - (0 if step else cold_start_s))
            fleet.tick(t, out)
    return out


def _doomed(m: Market, step: int, steps: int) -> set[str]:
    """Zones up now that are preempted at the next step: their notice arrives ``notice_s`` before."""
    if step + 1 >= steps:
        return set()
    return {z.zone for z in m.zones if z.available[step] and not z.available[step + 1]}


def tideplane_mix(
    m: Market,
    target: int,
    availability: float,
    window: int,
    cold_start_s: float,
    return_delay_s: float,
    notice_s: float = 30.0,
    rate_floor: float = MIN_PREEMPTION_RATE,
    days: float | None = None,
) -> Replay:
    """``rate_floor`` other than ``MIN_PREEMPTION_RATE`` is a what-if, not what plan_mix's callers get."""
    what_if = rate_floor != MIN_PREEMPTION_RATE
    out = Replay("tideplane-mix" + (f" (what-if: rate floor {rate_floor:g})" if what_if else ""))
    fleet = _Fleet(m, cold_start_s)
    step_s = m.zones[0].step_s
    per_step = round(step_s / MINUTE)
    history: dict[str, list[int]] = {z.zone: [] for z in m.zones}
    healthy_since: float | None = 0.0
    flaps: list[float] = []
    steps = _steps(m, days)
    for step in range(steps):
        now = step * step_s
        up = {z.zone for z in m.zones if z.available[step]}
        doomed = _doomed(m, step, steps)
        lost = fleet.preempt({z.zone for z in m.zones} - up)
        if lost:
            out.preempted += lost
            flaps.append(now)
        plan = plan_mix(
            target,
            availability,
            [
                ZoneMarket(z.zone, preemption_rate(history[z.zone], window), m.spot_price(z), z.zone in up)
                for z in m.zones
            ],
            m.on_demand_price,
            min_preemption_rate=rate_floor,
        )
        for z in m.zones:  # make before break: grow now, shrink once the new placement serves
            want = plan.spot_per_zone.get(z.zone, 0)
            if want > fleet.count(z.zone):
                fleet.resize(z.zone, want, now - (0 if step else cold_start_s))
        for k in range(per_step):
            t = now + k * MINUTE
            placed = sum(
                min(plan.spot_per_zone.get(z.zone, 0), sum(1 for r in fleet.replicas if r.zone == z.zone and r.ready_at <= t))
                for z in m.zones
            )
            if placed >= plan.spot:
                for z in m.zones:
                    fleet.resize(z.zone, plan.spot_per_zone.get(z.zone, 0), t)
            noticed = doomed if t + MINUTE > now + step_s - notice_s else set()
            spot_ready = sum(1 for r in fleet.replicas if r.zone is not None and r.zone not in noticed and r.ready_at <= t)
            need = fallback_on_demand(target, spot_ready, plan.on_demand)
            if spot_ready + plan.on_demand < target:
                healthy_since = None
            elif healthy_since is None:
                healthy_since = t
            recent = sum(1 for f in flaps if now - f < 6 * 3600)
            delay = stabilisation_delay(return_delay_s, recent - 1, 4 * return_delay_s)
            if need > fleet.count(None):
                at = min(t, now + step_s - notice_s) if noticed else t
                fleet.resize(None, need, at - (0 if step else cold_start_s))
            elif need < fleet.count(None) and return_to_spot(healthy_since, t, delay):
                fleet.resize(None, need, t)
            fleet.tick(t, out)
        for z in m.zones:
            history[z.zone].append(0 if z.zone in up else 1)
    return out


COLUMNS = ["policy", "cost_usd", "vs_on_demand_percent", "minutes_at_target_percent", "gap_minutes", "gap_replica_minutes", "replicas_preempted", "mean_spot_ready", "mean_on_demand"]


def rows(replays: list[Replay], target: int) -> list[dict]:
    base = next(r.cost for r in replays if r.policy == "on-demand")
    table = []
    for r in replays:
        minutes = len(r.ready)
        table.append(
            {
                "policy": r.policy,
                "cost_usd": round(r.cost, 0),
                "vs_on_demand_percent": round(100 * (r.cost / base - 1), 1),
                "minutes_at_target_percent": round(100 * sum(x >= target for x in r.ready) / minutes, 2),
                "gap_minutes": sum(x < target for x in r.ready),
                "gap_replica_minutes": sum(max(0, target - x) for x in r.ready),
                "replicas_preempted": r.preempted,
                "mean_spot_ready": round(sum(r.spot_ready) / minutes, 2),
                "mean_on_demand": round(sum(r.on_demand) / minutes, 2),
            }
        )
    return table


def markdown_table(table: list[dict]) -> str:
    return _table(table, COLUMNS)


def plot(m: Market, replays: list[Replay], target: int, steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(14, 10), sharex=True, gridspec_kw={"height_ratios": [2, 2, 1.3]})
    step_days = m.zones[0].step_s / 86400
    grid = [[0 if z.available[i] else 1 for i in range(steps)] for z in m.zones]
    axes[0].imshow(grid, aspect="auto", cmap="Reds", interpolation="nearest", extent=(0, steps * step_days, len(m.zones), 0))
    axes[0].set_yticks([i + 0.5 for i in range(len(m.zones))], [f"{z.zone} ${m.spot_price(z):.2f}" for z in m.zones], fontsize=7)
    axes[0].set_title("SkyNomad spot H100 availability (red = preempted); spot $/GPU-h")
    for r in replays:
        hours = [min(r.ready[i : i + 60]) for i in range(0, len(r.ready), 60)]
        axes[1].plot([h / 24 for h in range(len(hours))], hours, lw=0.8, label=f"{r.policy} (min Ready in the hour)")
    axes[1].axhline(target, color="black", ls=":", lw=0.7)
    axes[1].set_ylabel("Ready replicas")
    axes[1].legend(fontsize=8)
    for r in replays:
        series = r.cumulative[::60]
        axes[2].plot([h / 24 for h in range(len(series))], series, lw=0.8, label=r.policy)
    axes[2].set_ylabel("cumulative cost ($)")
    axes[2].set_xlabel("day of trace")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(
    trace: Path,
    out_dir: Path | None,
    target: int = 8,
    availability: float = 0.99,
    window: int = 144,
    cold_start_s: float = 240.0,
    return_delay_s: float = 1800.0,
    notice_s: float = 30.0,
    rate_floor: float = 0.0,
    days: float | None = None,
) -> list[dict]:
    """``rate_floor`` (when given and not the shipped ``MIN_PREEMPTION_RATE``) adds a what-if mix row."""
    m = market(traces.load_skynomad(trace))
    replays = [
        on_demand_only(m, target, days),
        spot_only(m, target, cold_start_s, notice_s, days),
        tideplane_mix(m, target, availability, window, cold_start_s, return_delay_s, notice_s, MIN_PREEMPTION_RATE, days),
    ]
    if rate_floor and rate_floor != MIN_PREEMPTION_RATE:
        replays.append(tideplane_mix(m, target, availability, window, cold_start_s, return_delay_s, notice_s, rate_floor, days))
    table = rows(replays, target)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(out_dir / "spot-skynomad-h100.csv", table, COLUMNS)
        (out_dir / "spot-skynomad-h100.md").write_text(
            f"Trace: {SOURCE}\nTarget {target} replicas (1 GPU each), availability target {availability}, "
            f"preemption-rate window {window} x 10 min, cold start {cold_start_s:g}s, preemption notice {notice_s:g}s, "
            f"return-to-spot delay {return_delay_s:g}s, "
            f"on-demand ${m.on_demand_price:.2f}/GPU-h\n\n" + markdown_table(table) + "\n"
        )
        plot(m, replays, target, _steps(m, days), out_dir / "spot-skynomad-h100.png")
    return table
