"""A fleet of vLLM replicas under a scaling policy, in simulated time; two interchangeable modes.

The control loop is shared: Prometheus scrapes every ``scrape_s``; a policy sees what the product's
signal queries would read (``workflows.scaling.contract.DEFAULT_SIGNAL_QUERIES``: waiting and
running requests summed, KV-cache usage max, TTFT p99 as ``histogram_quantile`` over the rate of
vLLM's buckets in a 1-minute window, DCGM utilisation averaged over the serving pods) and is asked
for replicas every ``interval_s``; a replica ordered at t serves from ``t + cold_start_s`` and is
paid for from t. Each minute is within the SLO when the p99 TTFT of the requests whose first token
came in that minute is at most ``ttft_slo_s``: by ``histogram_quantile`` over vLLM's buckets
(what an alert or a dashboard shows) and exactly (reported beside it).

Modes (``Backend``):
- ``RequestLevel``: every request through ``infra.fleetmodel.replica.Replica`` (continuous
  batching, KV cache, preemption), each to the Ready replica with the fewest requests outstanding,
  as the gateway routes (or round robin, a bare Service's). For slices of hours.
- ``Aggregate``: the same engine as mean-field steady state per step: per-replica step time from
  the batch the load keeps in flight, a fleet-wide FIFO backlog once the replicas saturate
  (step-time blow-up, ``max_num_seqs`` or KV cache), TTFT per prompt-size quantile. For 14 days.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from dataclasses import dataclass, field, replace
from collections.abc import Hashable, Mapping
from typing import Literal, Protocol, TypeVar

import numpy as np

from infra.fleetmodel.engine import Engine, load_engine
from infra.fleetmodel.metrics import TTFT_BUCKETS, bucket_counts_of, dcgm_gpu_util, exact_quantile, exact_quantile_of, histogram_quantile
from infra.fleetmodel.replica import Replica, Request
from infra.fleetmodel.sizes import SizeMix
from workflows.scaling.decide import Signals

SATURATION = 0.97  # a replica's step time diverges as its token load -> 1; it stops admitting more here


@dataclass(frozen=True)
class FleetConfig:
    engine: str | None = None  # calibration.yaml engine (None: its default_engine)
    cold_start_s: float = 240.0  # node boot + image pull + weight load + warm-up
    ttft_slo_s: float = 2.0  # p99 TTFT target of a minute
    scrape_s: float = 15.0
    rate_window_s: float = 60.0
    step_s: float = 5.0  # aggregate mode's step (the request-level mode has none)
    gpu_hour_price: float = 10.32  # $/GPU-hour: a3-highgpu-8g on demand / 8 (SkyNomad trace metadata, us-central1)

    def load(self) -> Engine:
        return load_engine(self.engine)


class Policy(Protocol):
    """A controller: called every ``interval_s`` with what Prometheus shows, returns desired replicas."""

    name: str
    interval_s: float

    def initial(self) -> int: ...

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int: ...


@dataclass
class Scrape:
    """What one scrape interval produced, as the exporters would show it at its end."""

    ttft: tuple[np.ndarray, np.ndarray]  # (seconds, requests) of the first tokens emitted in the interval
    waiting: float
    running: float
    kv_usage_max: float
    gpu_util: float | None  # mean DCGM_FI_DEV_GPU_UTIL over the serving replicas (None: none serve)
    preemptions: int = 0


class Backend(Protocol):
    def serve(self, t0: float, t1: float, ready: int) -> Scrape: ...


@dataclass
class Result:
    policy: str
    mode: str
    scrape_s: float
    gpus_per_replica: int
    arrivals: list[float]  # requests arriving per scrape interval
    replicas: list[int]  # replicas paid for in each scrape interval (starting + ready)
    ready: list[int]
    minute_p99_hist: list[float]  # histogram_quantile(0.99) of each minute's TTFT (nan: no request)
    minute_p99_exact: list[float]
    hour_buckets: list[list[float]]  # TTFT bucket counts of each hour
    hour_fine: list[dict[int, float]]  # each hour's TTFTs in 2 %-wide bins (``fine_bins``): the "exact" p99 of a span
    scale_steps: list[int]  # the scrape intervals in which the policy changed its replicas
    preemptions: int
    config: FleetConfig
    # per scrape, what capacity held in standby costs (a warm pool's disks), in GPU-hours per hour
    standby: list[float] = field(default_factory=list)

    @property
    def gpu_hours(self) -> float:
        """GPU-hours paid: replicas from their order, plus standby capacity in GPU-hour equivalents."""
        return (sum(self.replicas) * self.gpus_per_replica + sum(self.standby)) * self.scrape_s / 3600

    @property
    def standby_gpu_hours(self) -> float:
        return sum(self.standby) * self.scrape_s / 3600

    @property
    def cost(self) -> float:
        return self.gpu_hours * self.config.gpu_hour_price

    def _ok(self, values: list[float]) -> float:
        ok = sum(1 for v in values if not v > self.config.ttft_slo_s)  # nan (no request) counts as within
        return 100.0 * ok / len(values) if values else 100.0

    @property
    def slo_minutes_percent(self) -> float:
        """Minutes whose histogram_quantile p99 TTFT is within the SLO, percent."""
        return self._ok(self.minute_p99_hist)

    @property
    def slo_minutes_percent_exact(self) -> float:
        return self._ok(self.minute_p99_exact)

    @property
    def ttft_p99_hist(self) -> float:
        """histogram_quantile(0.99) over the whole run's TTFT buckets."""
        return histogram_quantile(0.99, TTFT_BUCKETS, [sum(c) for c in zip(*self.hour_buckets)]) if self.hour_buckets else math.nan

    @property
    def ttft_p99_exact(self) -> float:
        """p99 of the TTFTs themselves (to 2 %), not interpolated inside vLLM's buckets."""
        merged: dict[int, float] = {}
        for hour in self.hour_fine:
            for k, w in hour.items():
                merged[k] = merged.get(k, 0.0) + w
        return exact_quantile([(fine_value(k), w) for k, w in merged.items()], 0.99)

    @property
    def scale_events(self) -> int:
        return len(self.scale_steps)

    def hours(self, start_h: int, end_h: int) -> Result:
        """The same run scored over hours [start_h, end_h) only (the policy ran all along)."""
        per_hour = round(3600 / self.scrape_s)
        scrapes = slice(start_h * per_hour, end_h * per_hour)
        return replace(
            self, arrivals=self.arrivals[scrapes], replicas=self.replicas[scrapes], ready=self.ready[scrapes], standby=self.standby[scrapes],
            scale_steps=[i - scrapes.start for i in self.scale_steps if scrapes.start <= i < scrapes.stop],
            minute_p99_hist=self.minute_p99_hist[start_h * 60 : end_h * 60], minute_p99_exact=self.minute_p99_exact[start_h * 60 : end_h * 60],
            hour_buckets=self.hour_buckets[start_h:end_h], hour_fine=self.hour_fine[start_h:end_h],
        )


def signals_of(window: deque, last: Scrape, scrape_s: float) -> Signals:
    """What the loop's default queries return after a scrape (``window``: bucket counts of the rate window)."""
    buckets = [sum(c) for c in zip(*window)] if window else []
    p99 = histogram_quantile(0.99, TTFT_BUCKETS, buckets) if buckets else math.nan
    return Signals(
        queue_waiting=last.waiting,
        running=last.running,
        request_rate=sum(buckets) / (len(window) * scrape_s) if window else None,  # rate of the TTFT count
        kv_cache_usage=last.kv_usage_max,
        ttft_p99_seconds=None if math.isnan(p99) else p99,
        gpu_util_percent=last.gpu_util,
    )


def simulate(backend: Backend, policy: Policy, duration_s: float, cfg: FleetConfig, arrivals: list[float], mode: str) -> Result:
    """Run ``policy`` over ``duration_s`` of the backend's demand; ``arrivals`` per scrape, for the report."""
    engine = cfg.load()
    scrape = cfg.scrape_s
    if 60 % scrape:
        raise ValueError(f"scrape_s must divide a minute, got {scrape}")
    decide_every = max(1, round(policy.interval_s / scrape))
    window: deque = deque(maxlen=max(1, round(cfg.rate_window_s / scrape)))
    ready = policy.initial()  # a fleet that exists at t=0 is already warm
    booting: deque[float] = deque()  # ready-at times, oldest first
    last: Scrape | None = None
    replicas_out, ready_out, minute_hist, minute_exact = [], [], [], []
    standby_out: list[float] = []
    minute_points: list[tuple[np.ndarray, np.ndarray]] = []
    minute_buckets = [0.0] * (len(TTFT_BUCKETS) + 1)
    bounds = np.array(TTFT_BUCKETS)
    hour_buckets: list[list[float]] = []
    hour_fine: list[dict[int, float]] = []
    hour_points: list[tuple[np.ndarray, np.ndarray]] = []  # the hour's TTFTs so far, binned when it ends
    events: list[int] = []
    preemptions = 0
    per_minute = round(60 / scrape)
    steps = math.ceil(duration_s / scrape - 1e-9)
    for i in range(steps):
        now = i * scrape
        while booting and booting[0] <= now:
            booting.popleft()
            ready += 1
        if i and i % decide_every == 0:
            current = ready + len(booting)
            signals = signals_of(window, last, scrape) if last is not None else Signals(error="no scrape yet")
            want = max(0, policy.desired(now, current, ready, signals))
            if want != current:
                events.append(i)
            if want > ready + len(booting):
                # a policy that models its nodes (warm pool, caches) says how long each new replica takes
                starts = getattr(policy, "startup_seconds", None)
                count = want - ready - len(booting)
                for seconds in starts(now, count) if starts else [cfg.cold_start_s] * count:
                    bisect.insort(booting, now + seconds)
            while want < ready + len(booting):
                if booting:
                    booting.pop()  # cancel the newest order first: it is furthest from serving
                else:
                    ready -= 1
            while booting and booting[0] <= now:  # zero cold start: serving at once
                booting.popleft()
                ready += 1
        out = backend.serve(now, min(now + scrape, duration_s), ready)
        preemptions += out.preemptions
        replicas_out.append(ready + len(booting))
        ready_out.append(ready)
        standby_out.append(getattr(policy, "standby_gpu_hours_per_hour", 0.0))
        counts = bucket_counts_of(bounds, *out.ttft)
        window.append(counts)
        last = out
        minute_points.append(out.ttft)
        minute_buckets = [a + b for a, b in zip(minute_buckets, counts)]
        if (i + 1) % per_minute == 0 or i == steps - 1:
            minute_hist.append(histogram_quantile(0.99, TTFT_BUCKETS, minute_buckets))
            minute_exact.append(exact_quantile_of(*_joined(minute_points), 0.99))
            if len(minute_hist) % 60 == 1:
                if hour_fine:
                    hour_fine[-1] = fine_bins(*_joined(hour_points))
                hour_buckets.append(minute_buckets)
                hour_fine.append({})
                hour_points = []
            else:
                hour_buckets[-1] = [a + b for a, b in zip(hour_buckets[-1], minute_buckets)]
            hour_points += minute_points
            minute_points, minute_buckets = [], [0.0] * (len(TTFT_BUCKETS) + 1)
    if hour_fine:
        hour_fine[-1] = fine_bins(*_joined(hour_points))
    return Result(
        policy=policy.name, mode=mode, scrape_s=scrape, gpus_per_replica=engine.gpus, arrivals=list(arrivals),
        replicas=replicas_out, ready=ready_out, minute_p99_hist=minute_hist, minute_p99_exact=minute_exact,
        hour_buckets=hour_buckets, hour_fine=hour_fine, scale_steps=events, preemptions=preemptions, config=cfg,
        standby=standby_out,
    )


_FINE = math.log(1.02)
_PER_FINE, _LOG_MS = 1 / _FINE, math.log(1e-3)
_NO_POINTS = (np.zeros(0), np.zeros(0))


def _joined(points: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, requests) arrays of several scrapes' TTFTs, in order."""
    if not points:
        return _NO_POINTS
    return np.concatenate([p[0] for p in points]), np.concatenate([p[1] for p in points])


def fine_bins(seconds: np.ndarray, requests: np.ndarray) -> dict[int, float]:
    """Requests per 2 %-wide bin of their TTFT (bins grow geometrically from 1 ms; one some request fell
    in is kept at weight 0 too)."""
    if not len(seconds):
        return {}
    k = np.where(seconds > 1e-3, (np.log(np.maximum(seconds, 1e-3)) - _LOG_MS) * _PER_FINE, 0.0).astype(np.int64)
    weights = np.bincount(k, weights=requests)  # in order, as one running sum per bin
    present = np.flatnonzero(np.bincount(k))
    return dict(zip(present.tolist(), weights[present].tolist()))


def fine_value(k: int) -> float:
    """The middle of ``fine_bins``' bin k."""
    return 1e-3 * math.exp((k + 0.5) * _FINE)


# ---------------------------------------------------------------------------------------------
# Request-level mode


Key = TypeVar("Key", bound=Hashable)


def least_queue(queues: Mapping[Key, int]) -> Key | None:
    """The replica with the fewest requests outstanding (waiting + running); ties by key, so the
    choice is stable. The Gateway API Inference Extension's endpoint picker routes on queue depth,
    and Envoy Gateway's default load balancer is LeastRequest (fewest active requests of two drawn)."""
    return min(queues, key=lambda key: (queues[key], key)) if queues else None


Routing = Literal["least_queue", "round_robin"]


class RequestLevel:
    """Every request through a ``Replica``. ``routing``: ``least_queue`` (the gateway's: each
    request to the replica with the fewest outstanding when it arrives) or ``round_robin`` (a bare
    Service's; replicas are then independent between scrapes and each is advanced on its own). A
    replica taken away hands its unfinished requests back to the others (as clients retry them),
    keeping their arrival times."""

    def __init__(self, requests: list[Request], engine: Engine, routing: Routing = "least_queue"):
        self.engine = engine
        self.routing = routing
        self.requests = sorted((Request(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests), key=lambda r: r.arrival_s)
        self.next = 0
        self.replicas: list[Replica] = []
        self.orphans: list[Request] = []  # arrived while no replica served
        self.rr = 0

    def serve(self, t0: float, t1: float, ready: int) -> Scrape:
        while len(self.replicas) < ready:
            self.replicas.append(Replica(self.engine, clock=t0))
        while len(self.replicas) > ready:
            gone = min(self.replicas, key=lambda r: len(r.running) + len(r.waiting))
            self.replicas.remove(gone)
            for r in [*gone.running, *gone.waiting, *gone.inbound]:
                self.orphans.append(Request(r.arrival_s, r.prompt_tokens, r.output_tokens))
        arriving = list(self.orphans)
        self.orphans = []
        while self.next < len(self.requests) and self.requests[self.next].arrival_s < t1:
            arriving.append(self.requests[self.next])
            self.next += 1
        if not self.replicas:
            self.orphans = arriving
            return Scrape(_NO_POINTS, float(len(arriving)), 0.0, 0.0, None)
        before = [(replica.busy_s, replica.preemptions) for replica in self.replicas]
        if self.routing == "round_robin":
            routed: list[list[Request]] = [[] for _ in self.replicas]
            for r in arriving:
                routed[self.rr % len(self.replicas)].append(r)
                self.rr += 1
            for replica, mine in zip(self.replicas, routed):
                replica.advance_to(t1, mine)
        else:
            for r in arriving:
                for replica in self.replicas:
                    replica.advance_to(r.arrival_s)
                pick = least_queue({i: len(x.inbound) + len(x.waiting) + len(x.running) for i, x in enumerate(self.replicas)})
                self.replicas[pick].advance_to(r.arrival_s, [r])
            for replica in self.replicas:
                replica.advance_to(t1)
        points: list[float] = []
        busy = []
        preempted = 0
        for replica, (before_busy, before_pre) in zip(self.replicas, before):
            busy.append((replica.busy_s - before_busy) / (t1 - t0))
            preempted += replica.preemptions - before_pre
            points.extend(r.ttft for r in replica.first_tokens)
            replica.first_tokens.clear()
            replica.finished.clear()
        return Scrape(
            ttft=(np.array(points, dtype=float), np.ones(len(points))),
            waiting=float(sum(len(r.waiting) for r in self.replicas)),
            running=float(sum(len(r.running) for r in self.replicas)),
            kv_usage_max=max(r.kv_usage for r in self.replicas),
            gpu_util=sum(dcgm_gpu_util(b, self.engine.busy_duty) for b in busy) / len(busy),
            preemptions=preempted,
        )


def requests_from_counts(counts: list[float], step_s: float, sizes: SizeMix, seed: int) -> list[Request]:
    """Requests for per-step arrival counts: fractional counts rounded stochastically, times uniform
    inside the step, sizes drawn from the window's distributions (deterministic for a seed)."""
    rng = random.Random(seed)
    out: list[Request] = []
    samplers: dict[int, tuple] = {}
    for i, n in enumerate(counts):
        whole = int(n) + (rng.random() < n - int(n))
        w = sizes.index(i * step_s)
        if w not in samplers:
            prompt, output = sizes.at(i * step_s)
            samplers[w] = (prompt.sampler(rng), output.sampler(rng))
        draw_p, draw_o = samplers[w]
        out.extend(Request((i + rng.random()) * step_s, draw_p(), draw_o()) for _ in range(whole))
    out.sort(key=lambda r: r.arrival_s)
    return out


# ---------------------------------------------------------------------------------------------
# Aggregate mode

# Prompt-size quantiles (centre, share of requests) whose TTFTs stand for a step's requests: the
# body as one point, the top decile finely, since only the tail decides a p99.
# body as one point, the top decile in five, the 1 % that decides a p99 centred on 0.99.
_PROMPT_POINTS = ((0.45, 0.9), (0.925, 0.05), (0.9625, 0.025), (0.98, 0.01), (0.99, 0.01), (0.9975, 0.005))
_LOOKBACK_S = 60  # seconds of admissions the running gauge sums (a request's residence is seconds)
_QUARTILES = (0.25, 0.75)  # where in a stretch of arrivals the points standing for it come
_GAUSS = ((-math.sqrt(3), 1 / 6), (0.0, 2 / 3), (math.sqrt(3), 1 / 6))  # 3-point Gauss-Hermite: a normal's first five moments
_GAUSS_Z, _GAUSS_P = np.array([z for z, _ in _GAUSS]), np.array([p for _, p in _GAUSS])
_FIRST_OF_GAUSS = np.arange(len(_GAUSS)) == 0
_POINT = math.nan  # the spread of a TTFT that is one point, not a normal (``_spread``)


def _spread(points: list[tuple[float, float, float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, requests) arrays of an interval's TTFTs, in order. Each (mean, requests, sd, floor) is a
    normal over ``_GAUSS``'s points, none below ``floor`` (the step that answers them), or the one
    point (mean, requests) when sd is ``_POINT``: built in numpy, with Python's float arithmetic."""
    if not points:
        return _NO_POINTS
    table = np.array(points, dtype=float)
    single = np.isnan(table[:, 2])
    if single.all():  # no second queued: the steady state's points
        return table[:, 0].copy(), table[:, 1].copy()
    mean, requests, sd, floor = (column[:, None] for column in table.T)
    single = single[:, None]
    seconds = np.where(single, mean, np.maximum(floor, mean + _GAUSS_Z * sd))
    weights = np.where(single, requests, requests * _GAUSS_P)
    keep = ~single | _FIRST_OF_GAUSS
    return seconds[keep], weights[keep]


@dataclass
class _Window:
    """A size window's per-replica constants (means over the mix, saturation throughput)."""

    prompt_mean: float
    output_mean: float
    kv_per_request: float  # E[decode steps x context read]: KV tokens one request keeps read per step, integrated
    prompts: list[tuple[int, float]]
    capacity_rps: float
    prompt_var: float = 0.0  # variance of the prompt tokens
    residences: tuple | None = None  # ``Aggregate._residences``, once computed

    @property
    def decode_steps(self) -> float:
        """Steps a request decodes for (at least one: its first token)."""
        return max(1.0, self.output_mean)

    @property
    def context(self) -> float:
        """KV tokens a request in the decoding batch holds, on average over its decode."""
        return self.kv_per_request / self.decode_steps


class Aggregate:
    """Mean-field replicas and a fleet-wide fluid backlog.

    ``counts`` are arrivals per ``base_s`` (1 s: the resolution of the arrival data). The seconds
    of a ``step_s`` step that cannot queue (no backlog, fewer arrivals than the fleet sustains in a
    second, no batch a burst left still decoding) are merged into one mean-field step; each second
    that queues is run as vLLM's scheduler runs a burst (``_busy``: steps back to back over a FIFO
    fluid queue, the batch it prefills decoding on into the seconds after), so bursts queue as they
    would and the answer hardly depends on ``step_s``. ``bursts``: the requests of one second
    arrive together (real timestamps such as Azure's, 67 in one second) rather than spread over it
    (arrivals drawn from rates).
    """

    def __init__(self, counts: list[float], step_s: float, sizes: SizeMix, engine: Engine, base_s: float = 1.0, bursts: bool = False):
        self.counts, self.base_s, self.sizes, self.engine, self.bursts = counts, base_s, sizes, engine, bursts
        self.rates = np.asarray(counts, dtype=float)  # (the running gauge reads them as an array)
        self.per_step = max(1, round(step_s / base_s))
        self.backlog = 0.0  # requests queued fleet-wide (the sum of ``queue``)
        self.in_flight_rate = 0.0  # admitted req/s per replica, smoothed over a request's residence
        self.queue: deque[list[float]] = deque()  # FIFO of arrival stretches, see ``_busy``
        self.step_end = 0.0  # when the step in progress ends (a busy second's last step may run into the next)
        self.batch = 0.0  # requests decoding per replica
        self.settled = True  # the batch is at the steady state of the arrivals: calm seconds may be merged
        self.last_busy = -1  # the last second run by ``_busy``
        self.queue_var = 0.0  # variance of the work (prompt tokens per replica) arrived since the queue last emptied
        self.windows: dict[int, _Window] = {}

    def window(self, t: float) -> _Window:
        key = self.sizes.index(t)
        if key not in self.windows:
            prompt, output = self.sizes.at(t)
            mp, mo = prompt.mean(), output.mean()
            kv = mo * mp + output.second_moment() / 2
            pts = [(prompt.quantile(q), w) for q, w in _PROMPT_POINTS]
            self.windows[key] = _Window(mp, mo, kv, pts, 0.0, prompt.second_moment() - mp * mp)
            self.windows[key].capacity_rps = self._capacity(self.windows[key])
        return self.windows[key]

    def _state(self, x: float, w: _Window) -> tuple[float, float] | None:
        """(step time, requests in the batch) of a replica serving ``x`` req/s; None when saturated."""
        e = self.engine
        alpha = e.flop_s_per_token * x * (w.prompt_mean + w.output_mean)
        beta = e.kv_read_s_per_token * x * w.kv_per_request
        if alpha >= SATURATION or beta >= SATURATION:
            return None
        tau = max(e.overhead_s / (1 - alpha), (e.overhead_s + e.weight_read_s) / (1 - beta))
        in_batch = x * tau * (w.output_mean + max(1.0, w.prompt_mean / e.max_num_batched_tokens))
        if in_batch > e.max_num_seqs or x * tau * w.kv_per_request > e.kv_capacity_tokens:
            return None
        return tau, in_batch

    def _capacity(self, w: _Window) -> float:
        low, high = 0.0, 1.0
        while self._state(high, w) is not None:
            high *= 2
        for _ in range(40):
            mid = (low + high) / 2
            low, high = (mid, high) if self._state(mid, w) is not None else (low, mid)
        return low

    def serve(self, t0: float, t1: float, ready: int) -> Scrape:
        acc = [0.0, 0.0]  # util x seconds, seconds
        points: list[tuple[float, float, float, float]] = []  # see ``_spread``
        counts, base = self.counts, self.base_s
        i, end = round(t0 / base), round(t1 / base)
        while i < end:
            j = min(end, i + self.per_step)
            w = self.window(i * base)
            quiet = 1.0 if self.bursts else ready * w.capacity_rps * base  # a second this busy cannot queue
            calm, calm_n = 0.0, 0
            for k in range(i, j):
                arriving = counts[k] if k < len(counts) else 0.0
                if self.backlog == 0 and self.settled and arriving <= quiet:
                    calm += arriving
                    calm_n += 1
                    continue
                if calm_n:
                    self._step(calm, calm_n * base, ready, w, points, acc)
                    calm, calm_n = 0.0, 0
                self._busy(k * base, arriving, ready, w, points, acc)
                self.last_busy = k
            if calm_n:
                self._step(calm, calm_n * base, ready, w, points, acc)
            i = j
        util, n = acc
        running = self._running_at(end, ready)
        w = self.window(max(0, end - 1) * base)
        kv = min(1.0, running / ready * w.context / self.engine.kv_capacity_tokens) if ready else 0.0
        return Scrape(ttft=_spread(points), waiting=self.backlog, running=running, kv_usage_max=kv,
                      gpu_util=util / n if ready and n else None)

    def _running_at(self, end: int, ready: int) -> float:
        """Requests in the running batches fleet-wide at the end of second ``end - 1``, as a scrape
        reads the gauge. Each calm second's admissions leave the batch over their residence at that
        second's load (Little's law: ``x * tau * output tokens`` on average), the batch a busy
        second left decays likewise; summed per second from the arrival data, so the reading is the
        same however calm seconds were merged into steps."""
        if not ready:
            return 0.0
        e, base = self.engine, self.base_s
        oldest = max(self.last_busy + 1, end - _LOOKBACK_S, 0)
        total = 0.0
        if end > oldest:
            w = self.window((end - 1) * base)
            grid, residence = self._residences(w)
            rates = self.rates[oldest:end] / (ready * base)  # per replica
            res = np.interp(rates, grid, residence)
            age = (end - 1 - np.arange(oldest, oldest + len(rates))) * base
            total = float(np.sum(rates * ready * res * -np.expm1(-base / res) * np.exp(-age / res)))
        if self.last_busy >= oldest - 1 and self.batch > 0:
            w = self.window(self.last_busy * base)
            tau = e.step_seconds(self.batch, self.batch * w.context)
            total += ready * self.batch * math.exp(-(end - 1 - self.last_busy) * base / (tau * w.decode_steps))
        return min(total, ready * e.max_num_seqs)

    def _residences(self, w: _Window) -> tuple[np.ndarray, np.ndarray]:
        """A replica's load (req/s) on a grid up to saturation, and a request's time in the batch at each."""
        if w.residences is None:
            e = self.engine
            grid = np.linspace(0.0, w.capacity_rps, 129)
            per_request = w.output_mean + max(1.0, w.prompt_mean / e.max_num_batched_tokens)
            taus = [(self._state(x, w) or self._state(w.capacity_rps, w) or (e.overhead_s + e.weight_read_s,))[0] for x in grid]
            w.residences = (grid, np.array(taus) * per_request)
        return w.residences

    def _step(self, arriving: float, span: float, ready: int, w: _Window, points: list, acc: list) -> None:
        """Seconds that do not queue: each request is scheduled at once and prefilled in a step
        shared with the others' tokens, as the load's mean-field steady state has them."""
        e = self.engine
        x = arriving / (ready * span) if ready else 0.0
        state = self._state(x, w) or self._state(w.capacity_rps, w)
        tau, in_batch = state if state else (e.overhead_s + e.weight_read_s, 0.0)
        if arriving > 0:
            others = x * tau * (w.prompt_mean + w.output_mean)
            kv_read = x * tau * w.kv_per_request
            budget = e.max_num_batched_tokens
            for prompt, share in w.prompts:
                chunks = -(-prompt // budget) if e.chunked_prefill else 1
                own = e.frontend_s + e.step_seconds(others + prompt / chunks, kv_read) * chunks
                points.append((own, arriving * share, _POINT, 0.0))
        self.batch = in_batch
        self._gpu_util(x, span, ready, w, tau, acc)

    def _relax(self, batch: float, x: float, span: float, w: _Window) -> float:
        """The decoding batch ``span`` seconds on, with ``x`` req/s per replica admitted as they
        come: it moves to that load's steady state as its requests finish, a ``1/output`` share of
        it per step, so the decode work a burst prefilled is done, not dropped."""
        e = self.engine
        steady = self._state(x, w)
        target, tau0 = (steady[1], steady[0]) if steady else (float(e.max_num_seqs), e.overhead_s + e.weight_read_s)
        prefill = x * tau0 * w.prompt_mean
        tau = e.step_seconds(batch + prefill, batch * w.context + prefill)
        return target + (batch - target) * math.exp(-span / (tau * w.decode_steps))

    def _gpu_util(self, x: float, span: float, ready: int, w: _Window, tau: float, acc: list) -> None:
        e = self.engine
        # DCGM sees the requests in flight, which outlive a one-second step: the admitted rate is
        # smoothed over a request's time in the engine.
        residence = tau * (w.output_mean + 1) + e.frontend_s
        self.in_flight_rate += (x - self.in_flight_rate) * (1 - math.exp(-span / residence))
        smooth = self._state(self.in_flight_rate, w) or self._state(w.capacity_rps, w)
        in_batch = smooth[1] if smooth else self.batch
        busy = 1.0 if self.backlog > 0 else 1 - math.exp(-in_batch)
        acc[0] += span * dcgm_gpu_util(busy, e.busy_duty) if ready else 0.0  # DCGM averages its sample period
        acc[1] += span

    def _busy(self, t0: float, arriving: float, ready: int, w: _Window, points: list, acc: list) -> None:
        """A second that queues, as vLLM's scheduler runs it: steps back to back, each prefilling
        the head of the FIFO queue with the token budget the decoding batch leaves, the step lasting
        what its tokens cost; a request's first token comes at the end of the step that completes
        its prompt. So a burst's steps grow as the queue does (a replica idle at its start answers
        its first requests in milliseconds, a long backlog in full-budget steps), and the decoding
        batch grows with what was prefilled and takes its share of each step's budget."""
        e, base = self.engine, self.base_s
        t1 = t0 + base
        queue = self.queue
        if arriving > 0:
            per_replica = arriving / max(1, ready)
            v0 = self.queue_var
            self.queue_var += per_replica * w.prompt_var
            # (first, last arrival, requests) of the fleet still queued; the second's bounds, its requests
            # per replica, and the variance of the work arrived before it in this busy period
            queue.append([t0, t0 if self.bursts else t1, arriving, t0, t0 if self.bursts else t1, per_replica, v0])
            self.backlog += arriving
        if not ready:
            acc[1] += base
            return
        budget, prompt, ctx = e.max_num_batched_tokens, w.prompt_mean, w.context
        big = [(-(-p // budget), share) for p, share in w.prompts if p > budget and e.chunked_prefill]  # prefilled over several steps
        big_share = sum(share for _, share in big)
        decode_steps = w.decode_steps
        t = max(t0, self.step_end)
        served_total = 0.0
        rest_rate = 0.0  # req/s per replica admitted as they come after the loop (see ``_relax``)
        while t < t1 and queue:
            # what has arrived by t (the last segment may be arriving still)
            lo, hi, n = queue[-1][:3]  # only this second's arrivals may still be arriving
            avail = self.backlog - (n * (hi - t) / (hi - lo) if hi > t else 0.0)
            batch = self.batch
            room = min(max(0.0, budget - batch), max(0.0, e.max_num_seqs - batch) * prompt,
                       max(0.0, e.kv_capacity_tokens - batch * ctx))
            tokens = min(room, avail / ready * prompt)
            step = e.step_seconds(batch + tokens, batch * ctx + tokens)
            full = e.step_seconds(batch + room, batch * ctx + room)  # a step with the whole budget
            per_token = full / max(room, 1.0)  # what one more queued prompt token delays those behind it
            steps = 1
            if tokens >= room > 0:  # a backlog that outlasts several full steps: take them at once
                steps = max(1, min(math.ceil((t1 - t) / full), int(avail / (room / prompt * ready))))
            admit = steps * tokens / prompt * ready  # fleet requests whose prompt these steps complete
            left = admit
            while left > 1e-12 and queue:
                lo, hi, n, s0, s1, n_r, v0 = queue[0]
                arrived = n if hi <= t else n * (t - lo) / (hi - lo)
                take = min(left, arrived)
                if take <= 0:
                    break
                upto = lo + (hi - lo) * take / n if n > 0 else lo  # the fluid taken arrived in [lo, upto]
                # a full step ends inside one replica's prompt: that request's first token comes a step later
                spilled = min(take, ready * left / admit) if tokens >= room - 1e-9 else 0.0
                for f in _QUARTILES:  # the fluid taken arrived uniformly over [lo, upto]
                    at = lo + (upto - lo) * f
                    done = t + (step if steps == 1 else full * (1 + int((admit - left + take * f) / admit * steps)))
                    ttft = done - at + e.frontend_s
                    # the fluid is the mean: the work ahead of a request is a sum of random prompt sizes
                    # arriving at random times; its variance since the queue last emptied spreads the wait
                    u = (at - s0) / (s1 - s0) if s1 > s0 else f
                    var = v0 + n_r * u * w.prompt_var + (0.0 if s1 == s0 else n_r * u * (1 - u) * prompt * prompt)
                    sd = math.sqrt(var) * per_token
                    half = (take - spilled) / len(_QUARTILES)
                    pieces = [(ttft + step, spilled / len(_QUARTILES)), (ttft, half * (1 - big_share))]
                    pieces += [(ttft + (chunks - 1) * step, half * share) for chunks, share in big]
                    for value, weight in pieces:
                        if weight > 0:
                            points.append((value, weight, sd, step))
                left -= take
                self.backlog -= take
                if take >= n * (1 - 1e-9):
                    queue.popleft()
                else:
                    queue[0] = [upto, hi, n - take, s0, s1, n_r, v0]
            served_total += admit
            for _ in range(steps):
                batch += tokens / prompt - batch / decode_steps
            self.batch = batch
            t += step if steps == 1 else steps * full
            if tokens >= room:
                continue
            if not queue:  # the steps took all that had arrived: the queue's random walk restarts
                self.queue_var = 0.0
                continue
            lo, hi, n, s0, s1, n_r, v0 = queue[0]  # this second's arrivals, still coming
            if hi > max(lo, t) and n_r / (s1 - s0) * prompt < room / full and self._state(n_r / (s1 - s0), w):
                # and they come slower than full steps drain them and than the batch can finish them:
                # steps settle at the length whose arrivals they prefill; one waits for the step in
                # progress, then for its own
                rate = n / (hi - lo) / ready * prompt  # prompt tokens per second per replica
                settled = step
                for _ in range(8):
                    settled = e.step_seconds(batch + rate * settled, batch * ctx + rate * settled)
                points.extend(((1 + f) * settled + e.frontend_s, n / len(_QUARTILES), _POINT, 0.0) for f in _QUARTILES)
                served_total += n
                self.backlog -= n
                queue.popleft()
                rest_rate = n / (hi - lo) / ready
                break
            if s1 > s0:
                queue[0] = [lo, hi, n, lo, s1, n_r * (s1 - lo) / (s1 - s0), 0.0]
            self.queue_var = queue[0][5] * w.prompt_var
        if t < t1:  # the queue emptied (or settled) before the second ended: its batch decodes on
            self.batch = self._relax(self.batch, rest_rate, t1 - t, w)
            t = t1
        self.step_end = t
        if not queue:
            self.backlog = self.queue_var = 0.0
        steady = self._state(arriving / (ready * base), w)
        self.settled = not queue and steady is not None and self.batch <= steady[1] * 1.1 + 1.0
        x = served_total / (ready * base)
        tau = e.step_seconds(self.batch + budget, self.batch * ctx)
        self._gpu_util(x, base, ready, w, tau, acc)
