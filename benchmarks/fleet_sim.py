"""Offline, time-stepped simulation of one LLM serving fleet under a scaling policy.

No Temporal, no HTTP: a step loop fast enough for 14 days of trace at a 15 s step in seconds.
The fleet is a set of replicas, each serving ``capacity_rps`` requests/s at the TTFT SLO, in
front of one FIFO queue (fluid: a step's backlog waits ``backlog / service rate``). A replica
ordered at t serves from ``t + cold_start_s`` (node boot + weight load + warm-up) and is paid
for from t. Controllers see the fleet only as Prometheus would: gauges sampled every
``scrape_s``, rates and the TTFT p99 over a ``rate_window_s`` window, handed to them as the
same ``workflows.scaling.decide.Signals`` the ReactiveScaling workflow reads.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from workflows.scaling.decide import Signals


@dataclass(frozen=True)
class FleetConfig:
    step_s: float = 15.0
    capacity_rps: float = 8.0  # requests/s one replica serves within the TTFT SLO
    cold_start_s: float = 240.0  # node boot + image pull + weight load + warm-up
    ttft_base_s: float = 0.4  # prefill time of a request that does not queue
    ttft_slo_s: float = 2.0  # p99 TTFT target of a minute
    scrape_s: float = 15.0
    rate_window_s: float = 60.0
    gpus_per_replica: int = 1
    gpu_hour_price: float = 10.32  # $/GPU-hour; default: a3-highgpu-8g on demand / 8 (SkyNomad trace metadata, us-central1)


class Policy(Protocol):
    """A controller: called every ``interval_s`` with what Prometheus shows, returns desired replicas."""

    name: str
    interval_s: float

    def initial(self) -> int: ...

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int: ...


@dataclass
class Result:
    policy: str
    step_s: float
    demand: list[float]  # requests arriving per step
    replicas: list[int]  # replicas paid for during each step (booting + ready)
    ready: list[int]  # replicas serving during each step
    delay_s: list[float]  # queueing delay of the requests of each step
    minute_ok: list[bool]  # per minute: p99 TTFT within the SLO
    scale_events: int
    config: FleetConfig

    @property
    def gpu_hours(self) -> float:
        return sum(self.replicas) * self.step_s / 3600 * self.config.gpus_per_replica

    @property
    def cost(self) -> float:
        return self.gpu_hours * self.config.gpu_hour_price

    @property
    def slo_minutes_percent(self) -> float:
        return 100.0 * sum(self.minute_ok) / len(self.minute_ok) if self.minute_ok else 100.0

    @property
    def p99_delay_s(self) -> float:
        return weighted_quantile(self.delay_s, self.demand, 0.99)


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """Quantile of ``values`` where each value counts ``weight`` times (requests of a step)."""
    pairs = sorted((v, w) for v, w in zip(values, weights) if w > 0)
    total = sum(w for _, w in pairs)
    if not pairs:
        return 0.0
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= q * total - 1e-9:
            return v
    return pairs[-1][0]


@dataclass
class _Window:
    """Sliding sums over the last ``n`` scrapes, like ``rate(x[window])``."""

    n: int
    items: deque = field(default_factory=deque)

    def push(self, item) -> None:
        self.items.append(item)
        if len(self.items) > self.n:
            self.items.popleft()


def simulate(demand: list[float], policy: Policy, cfg: FleetConfig = FleetConfig()) -> Result:
    """Run ``policy`` over per-step arrivals ``demand``; deterministic (no randomness here)."""
    step = cfg.step_s
    per_step_capacity = cfg.capacity_rps * step
    scrape_every = max(1, round(cfg.scrape_s / step))
    decide_every = max(1, round(policy.interval_s / step))
    window = _Window(max(1, round(cfg.rate_window_s / cfg.scrape_s)))

    ready = policy.initial()  # a fleet that exists at t=0 is already warm
    booting: deque[float] = deque()  # ready-at times of ordered replicas, oldest first
    queue = 0.0
    signals = Signals(error="no scrape yet")
    scrape_acc = [0.0, 0.0, 0]  # served, capacity, steps since the last scrape
    scrape_delays: list[tuple[float, float]] = []  # (ttft, requests) since the last scrape
    replicas_out: list[int] = []
    ready_out: list[int] = []
    delay_out: list[float] = []
    events = 0
    for i, arriving in enumerate(demand):
        now = i * step
        while booting and booting[0] <= now:
            booting.popleft()
            ready += 1
        if i % decide_every == 0 and i > 0:
            current = ready + len(booting)
            want = max(0, policy.desired(now, current, ready, signals))
            if want != current:
                events += 1
            while want > ready + len(booting):
                booting.append(now + cfg.cold_start_s)
            while want < ready + len(booting):
                if booting:
                    booting.pop()  # cancel the newest order first: it is furthest from serving
                else:
                    ready -= 1
        capacity = ready * per_step_capacity
        work = queue + arriving
        served = min(work, capacity)
        queue = work - served
        # FIFO fluid queue: what is left at the end of the step waits backlog / service rate
        delay = queue / (ready * cfg.capacity_rps) if ready else (math.inf if queue > 0 else 0.0)
        replicas_out.append(ready + len(booting))
        ready_out.append(ready)
        delay_out.append(delay)
        scrape_acc[0] += served
        scrape_acc[1] += capacity
        scrape_acc[2] += 1
        scrape_delays.append((cfg.ttft_base_s + delay, arriving))
        if (i + 1) % scrape_every == 0:
            window.push((scrape_acc[0], scrape_acc[1], scrape_delays))
            served_w = sum(s for s, _, _ in window.items)
            cap_w = sum(c for _, c, _ in window.items)
            ttfts = [d for _, _, ds in window.items for d in ds]
            signals = Signals(
                queue_waiting=queue,
                ttft_p99_seconds=weighted_quantile([t for t, _ in ttfts], [n for _, n in ttfts], 0.99)
                if any(n > 0 for _, n in ttfts)
                else None,
                gpu_util_percent=100.0 * served_w / cap_w if cap_w > 0 else None,
            )
            scrape_acc = [0.0, 0.0, 0]
            scrape_delays = []

    steps_per_minute = max(1, round(60 / step))
    minute_ok = []
    for m in range(0, len(demand), steps_per_minute):
        ttft = [cfg.ttft_base_s + d for d in delay_out[m : m + steps_per_minute]]
        minute_ok.append(weighted_quantile(ttft, demand[m : m + steps_per_minute], 0.99) <= cfg.ttft_slo_s)
    return Result(policy.name, step, list(demand), replicas_out, ready_out, delay_out, minute_ok, events, cfg)


def replicas_for(rate_rps: float, cfg: FleetConfig) -> int:
    """Replicas that serve ``rate_rps`` within the SLO."""
    return max(1, math.ceil(rate_rps / cfg.capacity_rps - 1e-9))


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
