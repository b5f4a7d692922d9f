"""Scaling benchmark: GPU-hours and cost against TTFT SLO for six policies on one real trace.

Every policy drives the same simulated fleet (benchmarks.fleet_sim) over the same arrivals:

- static-peak / static-p95: a fixed fleet sized for the peak / the 95th percentile step rate;
- hpa: Kubernetes HPA's rule on GPU utilisation (``ceil(current * util / target)``, 10 %
  tolerance, 15 s sync, scale-up limit max(+100 %, +4) per sync, 300 s down stabilisation);
- seed: the seed's loop (queue > 50 -> +ceil(queue / 20); utilisation < 30 % for 10 min -> -1);
- tideplane-reactive: ``workflows.scaling.decide`` alone, exactly as ReactiveScaling calls it
  (the Deployment's spec replicas as ``current``, the Ready ones as ``ready``);
- tideplane: the same plus the floors the schedules would set: ``floor_at`` of a schedule file
  and ``prewarm_floor`` over the hourly peaks of the replicas the load needed (Ready replicas x
  GPU utilisation / target: what PredictivePrewarm's default query reads from Prometheus),
  recomputed every ``every_minutes``;
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from benchmarks import traces
from benchmarks.fleet_sim import FleetConfig, Result, quantile, replicas_for, simulate
from workflows.scaling.prewarm import prewarm_floor, slot_key
from workflows.scaling.decide import ScalerState, ScalingPolicy, Signals, decide
from workflows.scaling.floors import DeploymentFloors, PrewarmSpec, floor_at

DEFAULT_START = "2025-01-06T00:00:00+00:00"  # ServeGen gives offsets only: t=0 is taken as a Monday 00:00 UTC
T0 = datetime.fromisoformat(DEFAULT_START)


@dataclass
class StaticPolicy:
    name: str
    replicas: int
    interval_s: float = 3600.0

    def initial(self) -> int:
        return self.replicas

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int:
        return self.replicas


@dataclass
class HpaPolicy:
    """Kubernetes HPA v2 defaults on a utilisation metric (the GPU utilisation gauge, 1 min rate)."""

    start: int
    target_percent: float = 70.0
    min_replicas: int = 1
    max_replicas: int = 1000
    name: str = "hpa"
    interval_s: float = 15.0
    tolerance: float = 0.1
    down_stabilisation_s: float = 300.0
    _recent: list[tuple[float, int]] = field(default_factory=list)

    def initial(self) -> int:
        return self.start

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int:
        util = signals.gpu_util_percent
        if util is None or ready == 0:
            rec = current
        else:
            ratio = util / self.target_percent
            rec = current if abs(ratio - 1) <= self.tolerance else math.ceil(ready * ratio)
        rec = min(self.max_replicas, max(self.min_replicas, rec))
        self._recent = [(t, r) for t, r in self._recent if now_s - t < self.down_stabilisation_s] + [(now_s, rec)]
        if rec > current:
            return min(rec, max(2 * current, current + 4))
        return min(current, max(r for _, r in self._recent))


@dataclass
class SeedPolicy:
    """The seed project's loop, as written in its README."""

    start: int
    name: str = "seed"
    interval_s: float = 30.0
    queue_threshold: float = 50
    queue_per_replica: float = 20
    low_util_percent: float = 30
    low_for_s: float = 600
    min_replicas: int = 1
    _low_since: float | None = None

    def initial(self) -> int:
        return self.start

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int:
        queue, util = signals.queue_waiting, signals.gpu_util_percent
        if queue is not None and queue > self.queue_threshold:
            self._low_since = None
            return current + math.ceil(queue / self.queue_per_replica)
        if util is not None and util < self.low_util_percent:
            self._low_since = now_s if self._low_since is None else self._low_since
            if now_s - self._low_since >= self.low_for_s and current > self.min_replicas:
                self._low_since = None
                return current - 1
        else:
            self._low_since = None
        return current


@dataclass
class TideplanePolicy:
    """``decide`` every ``interval_s`` with the floor the schedules and pre-warm would have set."""

    policy: ScalingPolicy
    start: int
    name: str = "tideplane"
    interval_s: float = 30.0
    floors: DeploymentFloors | None = None
    time_zone: str = "UTC"
    t0: datetime = T0
    state: ScalerState = field(default_factory=ScalerState)
    _hour_peaks: dict[int, float] = field(default_factory=dict)  # absolute hour -> peak replicas the load needed
    _prewarm: int = 0
    _prewarm_at: float = -math.inf

    def initial(self) -> int:
        return self.start

    def floor(self, now_s: float) -> int:
        if self.floors is None:
            return 0
        when = self.t0 + timedelta(seconds=now_s)
        entry = floor_at(self.floors.floors, when, self.time_zone) if self.floors.floors else None
        spec: PrewarmSpec | None = self.floors.prewarm
        if spec is not None and now_s - self._prewarm_at >= spec.every_minutes * 60:
            self._prewarm_at = now_s
            self._prewarm = self._prewarm_now(when, now_s, spec)
        return max(entry.replicas if entry else 0, self._prewarm)

    def _prewarm_now(self, when: datetime, now_s: float, spec: PrewarmSpec) -> int:
        """PredictivePrewarm: hourly peaks of the past ``weeks`` keyed by local weekday:hour."""
        hour_now = int(now_s // 3600)
        samples: dict[str, list[float]] = {}
        for h in range(max(0, hour_now - spec.weeks * 168), hour_now):
            if h in self._hour_peaks:
                local = (self.t0 + timedelta(hours=h)).astimezone(ZoneInfo(self.time_zone))
                samples.setdefault(slot_key(local.weekday(), local.hour), []).append(self._hour_peaks[h])
        local = when.astimezone(ZoneInfo(self.time_zone))
        return prewarm_floor(samples, local.weekday(), local.hour * 60 + local.minute, spec.startup_seconds, spec.quantile).floor

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int:
        hour = int(now_s // 3600)
        util = signals.gpu_util_percent or 0.0
        self._hour_peaks[hour] = max(self._hour_peaks.get(hour, 0.0), ready * util / self.policy.gpu_util_target_percent)
        decision = decide(now_s, current, signals, self.policy, self.state, self.floor(now_s), ready=ready)
        self.state = decision.state
        return decision.desired


@dataclass(frozen=True)
class Demand:
    name: str
    arrivals: list[float]  # requests per step
    source: str  # citation of the trace


def load_demand(trace: Path, step_s: float, seed: int, category: str = "m-large", clients: int | None = None) -> Demand:
    """Per-step arrivals from a ServeGen archive (``*.tar.gz``) or the Azure 2023 CSV."""
    if trace.name.endswith(".tar.gz"):
        rate = traces.load_servegen(category, path=trace, clients=clients)
        return Demand(rate.name, rate.arrivals(step_s, seed), "ServeGen (Alibaba Cloud Model Studio), Xiang et al., arXiv 2505.09999, Apache-2.0")
    if trace.suffix == ".csv":
        return Demand(
            f"azure-2023/{trace.stem}",
            traces.bin_requests(traces.load_azure(trace), step_s),
            "Azure LLM inference trace 2023, Patel et al., Splitwise, ISCA 2024, CC-BY 4.0",
        )
    raise ValueError(f"unknown trace format: {trace} (expected a ServeGen .tar.gz or the Azure .csv)")


def tideplane_policy(cfg: FleetConfig, start: int, max_replicas: int, overrides: dict | None = None) -> ScalingPolicy:
    """The loop's policy for this fleet: one second of work queued per replica fires the queue trigger,
    and one added replica absorbs what it drains in one decision interval."""
    fields = {
        "min_replicas": 1,
        "max_replicas": max_replicas,
        "queue_per_replica": cfg.capacity_rps * 1.0,
        "queue_capacity_per_replica": cfg.capacity_rps * 30.0,
        "ttft_p99_slo_seconds": cfg.ttft_slo_s,
    }
    fields.update(overrides or {})
    return ScalingPolicy(**fields)


def policies(demand: list[float], cfg: FleetConfig, floors: DeploymentFloors | None, time_zone: str, t0: datetime, overrides: dict | None = None) -> list:
    rates = [a / cfg.step_s for a in demand]
    peak = replicas_for(max(rates), cfg)
    p95 = replicas_for(quantile(rates, 0.95), cfg)
    start = replicas_for(sum(rates[: max(1, round(600 / cfg.step_s))]) / max(1, round(600 / cfg.step_s)), cfg)
    cap = max(peak * 2, 4)
    policy = tideplane_policy(cfg, start, cap, overrides)
    prewarm_only = floors or DeploymentFloors(deployment="bench/fleet", prewarm=PrewarmSpec(startup_seconds=cfg.cold_start_s + 300))
    return [
        StaticPolicy("static-peak", peak),
        StaticPolicy("static-p95", p95),
        HpaPolicy(start, max_replicas=cap),
        SeedPolicy(start),
        TideplanePolicy(policy, start, name="tideplane-reactive", time_zone=time_zone, t0=t0),
        TideplanePolicy(policy, start, name="tideplane", floors=prewarm_only, time_zone=time_zone, t0=t0),
    ]


COLUMNS = ["policy", "gpu_hours", "cost_usd", "vs_static_peak_percent", "slo_minutes_percent", "p99_queue_delay_s", "scale_events", "mean_replicas", "max_replicas"]


def rows(results: list[Result]) -> list[dict]:
    base = next((r.gpu_hours for r in results if r.policy == "static-peak"), None)
    out = []
    for r in results:
        out.append(
            {
                "policy": r.policy,
                "gpu_hours": round(r.gpu_hours, 1),
                "cost_usd": round(r.cost, 0),
                "vs_static_peak_percent": round(100 * (r.gpu_hours / base - 1), 1) if base else "",
                "slo_minutes_percent": round(r.slo_minutes_percent, 2),
                "p99_queue_delay_s": round(r.p99_delay_s, 2) if math.isfinite(r.p99_delay_s) else "inf",
                "scale_events": r.scale_events,
                "mean_replicas": round(sum(r.replicas) / len(r.replicas), 1),
                "max_replicas": max(r.replicas),
            }
        )
    return out


def markdown_table(table: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in table]
    return "\n".join(lines)


def write_csv(path: Path, table: list[dict], columns: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)


def plot(results: list[Result], cfg: FleetConfig, path: Path, title: str) -> None:
    """Demand, replicas per policy, and SLO-violating minutes per hour, on one time axis (days)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bucket = max(1, round(600 / cfg.step_s))  # 10-minute means keep the plot readable
    days = lambda n: [i * bucket * cfg.step_s / 86400 for i in range(n)]
    mean = lambda xs: [sum(xs[i : i + bucket]) / len(xs[i : i + bucket]) for i in range(0, len(xs), bucket)]
    fig, axes = plt.subplots(3, 1, figsize=(14, 10), sharex=True)
    demand = mean([a / cfg.step_s for a in results[0].demand])
    axes[0].plot(days(len(demand)), demand, lw=0.7, color="black")
    axes[0].set_ylabel("demand (req/s, 10-min mean)")
    axes[0].set_title(title)
    means = {r.policy: mean(r.replicas) for r in results}
    p95 = max(next((r.replicas for r in results if r.policy == "static-p95"), [1]))
    shown = [max(m) for m in means.values() if max(m) <= 8 * p95]  # a runaway policy would flatten the rest
    top = 1.3 * max(shown or [max(max(m) for m in means.values())])
    for r in results:
        reps = means[r.policy]
        axes[1].plot(days(len(reps)), reps, lw=0.8, label=r.policy)
        hours = [sum(not ok for ok in r.minute_ok[h : h + 60]) for h in range(0, len(r.minute_ok), 60)]
        axes[2].plot([h / 24 for h in range(len(hours))], hours, lw=0.8, label=r.policy)
    need = mean([math.ceil(a / cfg.step_s / cfg.capacity_rps) for a in results[0].demand])
    axes[1].plot(days(len(need)), need, lw=0.6, color="black", ls=":", label="needed (demand / capacity)")
    axes[1].set_ylim(0, top)
    off = [name for name, m in means.items() if max(m) > top]
    axes[1].set_ylabel("replicas (10-min mean)" + (f"\n(off scale: {', '.join(off)})" if off else ""))
    axes[1].legend(ncol=4, fontsize=8)
    axes[2].set_ylabel("minutes over TTFT SLO per hour")
    axes[2].set_xlabel("day of trace")
    axes[2].legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(
    trace: Path,
    out_dir: Path | None,
    cfg: FleetConfig,
    seed: int = 0,
    category: str = "m-large",
    clients: int | None = None,
    days: float | None = None,
    floors: DeploymentFloors | None = None,
    time_zone: str = "UTC",
    start: str = DEFAULT_START,
    overrides: dict | None = None,
) -> tuple[list[dict], list[Result], Demand]:
    demand = load_demand(trace, cfg.step_s, seed, category, clients)
    arrivals = demand.arrivals[: round(days * 86400 / cfg.step_s)] if days else demand.arrivals
    results = [simulate(arrivals, p, cfg) for p in policies(arrivals, cfg, floors, time_zone, datetime.fromisoformat(start), overrides)]
    table = rows(results)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = f"scaling-{demand.name.replace('/', '-')}"
        write_csv(out_dir / f"{stem}.csv", table, COLUMNS)
        (out_dir / f"{stem}.md").write_text(
            f"Trace: {demand.name} ({demand.source}), {len(arrivals) * cfg.step_s / 86400:.2f} days, step {cfg.step_s:g}s, seed {seed}\n"
            f"Fleet: {json.dumps(cfg.__dict__)}\n\n" + markdown_table(table, COLUMNS) + "\n"
        )
        plot(results, cfg, out_dir / f"{stem}.png", f"{demand.name}: demand, replicas and SLO violations")
    return table, results, demand


def floors_from_file(path: Path) -> tuple[DeploymentFloors, str]:
    """The first deployment of a ``tideplane schedules apply`` file, with its time zone."""
    from workers.schedules import load_schedule_file

    file = load_schedule_file(path)
    item = file.schedules[0]
    return item, file.zone_of(item)

