"""The scaling bench's lower bound (issue 34 item 3): the cheapest fleet with the same cold start.

An integer programme over decision slots, solved by HiGHS (``scipy.optimize.milp``). Per slot t:
``order[t]`` replicas ordered (paid from the order, serving from ``cold_start_slots`` later) and
``alive[t]`` replicas ready (at most the slot before's plus the orders that became ready: releases
are free and immediate); per minute a binary ``skip[m]``. Each slot of an unskipped minute has
``alive[t] >= need[t]``; at most ``skip_share`` of the minutes are skipped. The initial fleet is
free to choose and ready at t=0, as every policy's is. Cost: replica-slots paid, starting ones included.

What makes it a bound rather than a policy: it knows the whole trace ahead, decides every slot,
and a slot is taken to be within the SLO when its ready replicas carry its mean arrival rate at the
per-replica capacity the policies size on (the load test, ``benchmarks.loadtest``). Where the
solver stops at its time limit, the cost reported is HiGHS's dual bound: still a lower bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

SKIP_SHARE = 0.005  # of minutes: the bound keeps 99.5 % of minutes at SLO
TIME_LIMIT_S = 300.0


@dataclass(frozen=True)
class Bound:
    gpu_hours: float
    slo_minutes_percent: float  # minutes the schedule meets, of the trace's minutes
    request_slo_percent: float  # requests arriving in met minutes (the skipped minutes' count as missed)
    skipped_minutes: int
    optimal: bool  # False: stopped at the time limit; gpu_hours is then the solver's dual bound
    solver_seconds: float


def slot_needs(arrivals_per_slot: list[float], slot_s: float, capacity_rps: float) -> list[int]:
    """Ready replicas each slot needs: its mean arrival rate over the per-replica capacity, rounded up."""
    return [math.ceil(a / slot_s / capacity_rps - 1e-9) for a in arrivals_per_slot]


def cold_start_slots(cold_start_s: float, slot_s: float) -> int:
    """The cold start in whole slots, rounded down: a shorter cold start can only make the fleet cheaper,
    so the programme stays a lower bound."""
    return int(cold_start_s // slot_s)


def cheapest_schedule(needs: list[int], cold_slots: int, slots_per_minute: int, skip_share: float = SKIP_SHARE,
                      time_limit_s: float = TIME_LIMIT_S) -> tuple[float, list[int], list[int], list[int], bool]:
    """(replica-slots paid, orders per slot, ready replicas per slot, skipped minutes, solved to optimality)."""
    n = len(needs)
    if n == 0:
        return 0.0, [], [], [], True
    if cold_slots < 0 or slots_per_minute < 1:
        raise ValueError(f"cold_slots must be >= 0 and slots_per_minute >= 1, got {cold_slots} and {slots_per_minute}")
    minutes = -(-n // slots_per_minute)
    allowance = math.floor(skip_share * minutes + 1e-9)
    order, alive, skip = np.arange(n), n + np.arange(n), 2 * n + np.arange(minutes)
    cost = np.concatenate([np.minimum(cold_slots, n - np.arange(n)), np.ones(n), np.zeros(minutes)]).astype(float)
    terms: list[tuple[int, int, float]] = []  # (constraint, variable, coefficient)
    lower: list[float] = []
    upper: list[float] = []

    def add(entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        terms.extend((len(lower), var, coef) for var, coef in entries)
        lower.append(lo)
        upper.append(hi)

    for t in range(1, n):  # alive[t] <= alive[t-1] + order[t - cold]
        ready_orders = [(order[t - cold_slots], -1.0)] if t >= cold_slots else []
        add([(alive[t], 1.0), (alive[t - 1], -1.0)] + ready_orders, -np.inf, 0.0)
    for t, need in enumerate(needs):  # alive[t] + need * skip[minute] >= need
        if need > 0:
            add([(alive[t], 1.0), (skip[t // slots_per_minute], float(need))], float(need), np.inf)
    add([(s, 1.0) for s in skip], 0.0, float(allowance))
    r, c, v = zip(*terms)
    matrix = coo_matrix((v, (r, c)), shape=(len(lower), 2 * n + minutes)).tocsr()
    hi = np.concatenate([np.full(2 * n, np.inf), np.ones(minutes)])
    result = milp(cost, constraints=LinearConstraint(matrix, lower, upper), integrality=np.ones(2 * n + minutes),
                  bounds=Bounds(np.zeros(2 * n + minutes), hi), options={"time_limit": time_limit_s})
    if result.x is None:
        raise RuntimeError(f"the bound's programme found no schedule: {result.message}")
    x = np.round(result.x).astype(int)
    paid = float(result.fun) if result.status == 0 else float(result.mip_dual_bound)
    return paid, list(x[order]), list(x[alive]), [m for m in range(minutes) if x[skip[m]]], result.status == 0


def lower_bound(arrivals_per_slot: list[float], slot_s: float, capacity_rps: float, cold_start_s: float,
                gpus_per_replica: int, skip_share: float = SKIP_SHARE, time_limit_s: float = TIME_LIMIT_S) -> Bound:
    """The bound over one trace (or a scored span of it): requests arriving per slot of ``slot_s``
    seconds (a divisor of a minute), the per-replica capacity the policies size on, the fresh-node cold start."""
    if slot_s <= 0 or 60 % slot_s:
        raise ValueError(f"the slot must divide a minute, got {slot_s} s")
    began = time.perf_counter()
    needs = slot_needs(arrivals_per_slot, slot_s, capacity_rps)
    per_minute = round(60 / slot_s)
    paid, _, _, skipped, optimal = cheapest_schedule(needs, cold_start_slots(cold_start_s, slot_s), per_minute, skip_share, time_limit_s)
    minutes = -(-len(needs) // per_minute)
    total = sum(arrivals_per_slot)
    missed = sum(sum(arrivals_per_slot[m * per_minute : (m + 1) * per_minute]) for m in skipped)
    return Bound(
        gpu_hours=paid * slot_s / 3600 * gpus_per_replica,
        slo_minutes_percent=100.0 * (minutes - len(skipped)) / minutes if minutes else 100.0,
        request_slo_percent=100.0 * (total - missed) / total if total else 100.0,
        skipped_minutes=len(skipped), optimal=optimal, solver_seconds=time.perf_counter() - began,
    )
