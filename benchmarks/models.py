"""Multi-model benchmark: GPU-hours of dedicated per-model pools against one shared, packed pool.

The models are ServeGen's: each category (m-large, m-mid) is one model serving the sum of its
clients, and a long tail of small models each serves one smaller client of m-large (taken out of
m-large's sum, so no request is counted twice). Every model runs on the fleet model
(``infra.fleetmodel``, aggregate mode) under tideplane's reactive scaling policy (``decide``),
with the same cold start and TTFT SLO, in both setups:

- **dedicated**: every replica holds whole GPUs (vLLM's default ``--gpu-memory-utilization`` 0.9);
- **shared**: a replica claims its model's fraction of an H200 (weights + a KV cache for it; the
  engine gets the KV cache that fraction leaves), and the GPU sharing planner
  (``workflows.scaling.gpu_sharing.pack``) places each new replica: first fit by free memory,
  moving smaller replicas to make room, a new GPU only then; a scale-down removes the replica on
  the emptiest GPU, and an empty GPU is given back. A GPU holding several replicas keeps their
  compute shares (arrivals per replica over one replica's capacity, at placement) at most
  ``max_compute_share``, and every replica on a fraction of a GPU is simulated with its engine
  slowed by ``1 / (1 - max_compute_share)``: time-slicing takes turns, so the co-tenants' work
  is charged to its latency even when they are idle (pessimistic for the shared pool).
  A replica moved to make room restarts: its claim is paid for one extra cold start.

GPU-hours are what the nodes cost: H200s come in 8-GPU instances, so a dedicated pool pays for
its replicas' GPUs rounded up to whole nodes, and the shared pool for every GPU of a node holding
a replica (an empty node is given back). The same replicas are also counted on 1-GPU nodes, which
leaves only what packing saves. SLO minutes are each model's minutes whose p99 TTFT
(``histogram_quantile``) is within the SLO, as in ``bench scaling``.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks import traces
from benchmarks.scaling import SERVEGEN_SOURCE, TideplanePolicy, at_slo, markdown_table, per_scrape, tideplane_policy, unloaded_ttft, write_csv
from infra.fleetmodel.engine import Engine, load_engine
from infra.fleetmodel.fleet import Aggregate, FleetConfig, Result, simulate
from infra.fleetmodel.sizes import load_servegen_sizes
from workflows.core.bounds import MAX_REPLICAS
from workflows.scaling.decide import Signals, demand_rate
from workflows.scaling.gpu_sharing import ModelShare, PackLimits, SharedGpu, SharedReplica, model_demand, pack, share_pool

GPU_MEMORY_GIB = 141  # H200 (infra/fleetmodel/calibration.yaml)
TAIL_RATE_RPS = (0.2, 5.0)  # a long-tail client's mean rate, requests/s
TAIL_MAX_MISSING = 0.1  # share of its windows a long-tail client may lack
# The shared pool's curve: its models' headroom, the share of a replica's saturation throughput
# their SLO sizing counts on (1: all of it, as in the dedicated pools; less keeps more replicas),
# and, at the most headroom, the pool capped at these shares of the GPU memory its models claim at
# their peak, split by share_pool as SharedPoolScaling splits it.
SHARED_HEADROOM = (1.0, 0.7)
POOL_SIZES = (0.85, 0.7, 0.55)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    engine: str  # calibration.yaml engine
    fraction: float  # --gpu-memory-utilization in the shared pool
    trace: traces.RateTrace
    sizes_category: str


@dataclass
class ModelRun:
    spec: ModelSpec
    dedicated: Result
    shared: Result
    solo_capacity_rps: float
    mean_rps: float


@dataclass
class PoolMemberPolicy:
    """A model's own loop inside the shared pool: its decision and load are logged per decision
    time; given the pool's grants (``share_pool``'s answer at those times) it scales to at most them."""

    inner: TideplanePolicy
    grants: dict[int, int] | None = None
    wants: dict[int, int] = field(default_factory=dict)
    load: dict[int, tuple[float, int]] = field(default_factory=dict)  # (arrivals/s, Ready replicas)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def interval_s(self) -> float:
        return self.inner.interval_s

    def initial(self) -> int:
        return self.inner.initial()

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int:
        want = self.inner.desired(now_s, current, ready, signals)
        t = round(now_s)
        self.wants[t], self.load[t] = want, (demand_rate(signals), ready)
        return want if self.grants is None else min(want, self.grants.get(t, want))


@dataclass
class Packing:
    """The shared pool on nodes of ``gpus_per_node`` GPUs."""

    gpus_per_node: int
    paid: list[int]  # GPUs paid for in each scrape interval
    moves: int
    moved_gpu_hours: float
    scrape_s: float

    @property
    def gpu_hours(self) -> float:
        return sum(self.paid) * self.scrape_s / 3600 + self.moved_gpu_hours


def dedicated_paid(run: ModelRun, gpus_per_node: int) -> list[int]:
    """GPUs a model's own pool pays for per scrape: its replicas' GPUs rounded up to whole nodes."""
    per = run.dedicated.gpus_per_replica
    return [math.ceil(n * per / gpus_per_node) * gpus_per_node for n in run.dedicated.replicas]


@dataclass
class SharedSetup:
    """One point of the shared pool's curve: its models' headroom, its size (None: unbounded), what it cost."""

    headroom: float
    pool_gpus: float | None
    results: list[Result]
    packings: list[Packing]

    @property
    def label(self) -> str:
        size = "unbounded" if self.pool_gpus is None else f"{self.pool_gpus:.1f} GPUs"
        return f"sized on {self.headroom:.0%} of a replica's throughput, pool {size}"

    @property
    def slo(self) -> float:
        return statistics.fmean(r.slo_minutes_percent for r in self.results)


@dataclass
class Outcome:
    runs: list[ModelRun]
    packings: list[Packing]
    scrape_s: float
    days: float
    config: dict = field(default_factory=dict)
    curve: list[SharedSetup] = field(default_factory=list)

    @property
    def dedicated_slo(self) -> float:
        return statistics.fmean(r.dedicated.slo_minutes_percent for r in self.runs)

    def shared_at_dedicated_slo(self, gpus_per_node: int) -> tuple[str, float] | None:
        """GPU-hours the shared pool's curve needs for the dedicated pools' SLO minutes: ("=", interpolated),
        or ("≤", its cheapest point) when every point of the curve does better than the dedicated pools;
        None when none reaches them."""
        points = [(s.slo, next(p.gpu_hours for p in s.packings if p.gpus_per_node == gpus_per_node)) for s in self.curve]
        equal = at_slo(points, self.dedicated_slo)
        if equal is not None:
            return "=", equal
        better = [gpuh for slo, gpuh in points if slo >= self.dedicated_slo]
        return ("≤", min(better)) if better else None

    def dedicated_gpu_hours(self, gpus_per_node: int) -> float:
        return sum(sum(dedicated_paid(r, gpus_per_node)) for r in self.runs) * self.scrape_s / 3600


def models(category: str = "m-large", mid_category: str = "m-mid", tail: int = 20, path: Path = traces.SERVEGEN) -> list[ModelSpec]:
    """The two categories as models (8B and 3B) and ``tail`` small clients as 1B/3B models."""
    clients = traces.load_servegen_clients(category, path)

    def mean(trace: traces.RateTrace) -> float:
        known = [w.rate for w in trace.windows if w.rate is not None]
        return statistics.fmean(known) if known else 0.0

    eligible = [
        (mean(t), name) for name, t in clients.items()
        if TAIL_RATE_RPS[0] <= mean(t) <= TAIL_RATE_RPS[1]
        and sum(w.rate is None for w in t.windows) <= TAIL_MAX_MISSING * len(t.windows)
    ]
    chosen = [name for _, name in sorted(eligible, reverse=True)[:tail]]
    specs = [
        ModelSpec(f"{category}-rest", "llama-3.1-8b/H200x1", 0.9,
                  traces.load_servegen(category, path, exclude=frozenset(chosen)), category),
        ModelSpec(mid_category, "llama-3.2-3b/H200x1", 0.45, traces.load_servegen(mid_category, path), mid_category),
    ]
    for i, name in enumerate(chosen):
        engine, fraction = ("llama-3.2-1b/H200x1", 0.15) if i % 2 else ("llama-3.2-3b/H200x1", 0.25)
        specs.append(ModelSpec(f"tail-{name}", engine, fraction, clients[name], category))
    return specs


def slowed(engine: Engine, factor: float) -> Engine:
    """The engine with every step ``factor`` times longer (its GPU time shared with co-tenants)."""
    return replace(engine, overhead_s=engine.overhead_s * factor, flop_s_per_token=engine.flop_s_per_token * factor,
                   weight_read_s=engine.weight_read_s * factor, kv_read_s_per_token=engine.kv_read_s_per_token * factor)


def _run(counts: list[float], sizes, engine: Engine, cfg: FleetConfig, headroom: float = 1.0,
         grants: dict[int, int] | None = None) -> tuple[Result, float, PoolMemberPolicy]:
    """One model under tideplane's reactive policy (sized on ``headroom`` of a replica's throughput;
    capped by the pool's ``grants``); returns the result, one replica's capacity and the policy with its log."""
    probe = Aggregate(counts, cfg.step_s, sizes, engine)
    capacity = statistics.median(probe.window(t).capacity_rps for t in range(0, len(counts), 3600))
    need = math.ceil(max(counts[:60] or [0]) / capacity) if capacity else 1
    overrides = {"capacity_share": headroom}
    policy = PoolMemberPolicy(TideplanePolicy(tideplane_policy(capacity, MAX_REPLICAS, overrides, unloaded_ttft(probe, engine)),
                                              max(1, need), name="tideplane-reactive"), grants)
    backend = Aggregate(counts, cfg.step_s, sizes, engine)
    return simulate(backend, policy, len(counts), cfg, per_scrape(counts, cfg.scrape_s), "aggregate"), capacity, policy


def pool_grants(specs: list[ModelSpec], policies: list[PoolMemberPolicy], pool_gpus: float) -> list[dict[int, int]]:
    """What ``share_pool`` grants each model at each decision time of a pool of ``pool_gpus`` GPUs,
    from the models' own decisions and loads (those of their unbounded run)."""
    grants: list[dict[int, int]] = [{} for _ in policies]
    for t in policies[0].wants:
        demands = [model_demand(spec.name, p.wants[t], p.inner.policy.min_replicas, spec.fraction, *p.load[t])
                   for spec, p in zip(specs, policies)]
        granted = share_pool(pool_gpus, demands)
        for g, spec in zip(grants, specs):
            g[t] = granted[spec.name]
    return grants


def peak_claim(specs: list[ModelSpec], policies: list[PoolMemberPolicy]) -> float:
    """The most GPU memory (in GPUs) the models' own decisions claim at once."""
    return max(sum(p.wants[t] * spec.fraction for spec, p in zip(specs, policies)) for t in policies[0].wants)


def pack_over_time(runs: list[ModelRun], limits: PackLimits, scrape_s: float, cold_start_s: float,
                   results: list[Result] | None = None) -> Packing:
    """Replay every model's replica count (``results``, default each run's shared one) through the
    planner: GPUs paid for per scrape (every GPU of a node that holds a replica), moves, and the
    GPU-hours of the moved replicas' restarts."""
    results = results if results is not None else [r.shared for r in runs]
    shares = {r.spec.name: ModelShare(model=r.spec.name, gpu_memory_utilization=r.spec.fraction,
                                      weights_gib=load_engine(r.spec.engine).weight_bytes / 2**30) for r in runs}
    gpus: list[SharedGpu] = []
    counter = moves = 0
    moved_gpu_s = 0.0
    paid: list[int] = []
    previous: tuple[int, ...] | None = None
    for i in range(min(len(r.replicas) for r in results)):
        wants = tuple(r.replicas[i] for r in results)
        if wants == previous:
            paid.append(paid[-1])
            continue
        previous = wants
        placed: dict[str, list[tuple[SharedGpu, SharedReplica]]] = {}
        for gpu in gpus:
            for replica in gpu.replicas:
                placed.setdefault(replica.share.model, []).append((gpu, replica))
        adds: list[SharedReplica] = []
        for run, result, want in zip(runs, results, wants):
            mine = placed.get(run.spec.name, [])
            for gpu, replica in sorted(mine, key=lambda gr: (gr[0].used_fraction, gr[0].key))[: max(0, len(mine) - want)]:
                gpu.replicas.remove(replica)  # scale-down: the replica on the emptiest GPU goes
            if want > len(mine):
                load = result.arrivals[i] / scrape_s / max(1, result.ready[i]) / run.solo_capacity_rps
                for _ in range(want - len(mine)):
                    counter += 1
                    adds.append(SharedReplica(name=f"{run.spec.name}#{counter}", share=shares[run.spec.name], compute_share=min(1.0, load)))
        if adds:
            plan = pack(gpus, adds, limits.model_copy(update={"new_node_prefix": f"node{i}"}))
            gpus = plan.gpus
            moves += len(plan.moves)
            fractions = {r.name: r.fraction for g in gpus for r in g.replicas}
            moved_gpu_s += sum(fractions[m.replica] for m in plan.moves) * cold_start_s
        busy_nodes = {g.node for g in gpus if g.replicas}
        gpus = [g for g in gpus if g.node in busy_nodes]  # an empty node is given back
        paid.append(len(gpus))
    return Packing(limits.gpus_per_node, paid, moves, moved_gpu_s / 3600, scrape_s)


def run(out_dir: Path | None, cfg: FleetConfig, days: float = 7.0, seed: int = 0, tail: int = 20,
        max_compute_share: float = 0.5, gpus_per_node: int = 8, path: Path = traces.SERVEGEN,
        headroom: tuple[float, ...] = SHARED_HEADROOM, pool_sizes: tuple[float, ...] = POOL_SIZES) -> Outcome:
    """Every model in both setups; the shared pool packed on ``gpus_per_node``-GPU nodes and on
    single GPUs, at each ``headroom`` unbounded and, at the most headroom, capped at each of
    ``pool_sizes`` of its peak claim (a model ``share_pool`` grants less is simulated again, capped)."""
    specs = models(tail=tail, path=path)
    limits = PackLimits(gpu_memory_gib=GPU_MEMORY_GIB, max_compute_share=max_compute_share)
    shapes = [limits.model_copy(update={"gpus_per_node": n}) for n in dict.fromkeys((gpus_per_node, 1))]
    slowdown = 1 / (1 - max_compute_share)
    sizes = {c: load_servegen_sizes(c, path, path.with_name(traces.SERVEGEN_DATASETS.name)) for c in {s.sizes_category for s in specs}}
    runs = []
    inputs = []  # per model: what a shared run of it needs
    shared_by_headroom: dict[float, list[tuple[Result, PoolMemberPolicy]]] = {h: [] for h in headroom}
    for spec in specs:
        windows = spec.trace.windows[: math.ceil(days * 86400 / spec.trace.window_s)]
        counts = replace(spec.trace, windows=windows).arrivals(1.0, seed)[: round(days * 86400)]
        model_cfg = replace(cfg, engine=spec.engine)
        dedicated, capacity, _ = _run(counts, sizes[spec.sizes_category], load_engine(spec.engine), model_cfg)
        shared_engine = load_engine(spec.engine, gpu_memory_utilization=spec.fraction)
        if spec.fraction < 0.9:
            shared_engine = slowed(shared_engine, slowdown)
        inputs.append((counts, sizes[spec.sizes_category], shared_engine, model_cfg))
        for h in headroom:
            result, _, policy = _run(*inputs[-1], headroom=h)
            shared_by_headroom[h].append((result, policy))
        runs.append(ModelRun(spec, dedicated, shared_by_headroom[headroom[0]][-1][0], capacity,
                             statistics.fmean(counts) if counts else 0.0))

    def setup(h: float, pool_gpus: float | None, results: list[Result]) -> SharedSetup:
        return SharedSetup(h, pool_gpus, results,
                           [pack_over_time(runs, shape, cfg.scrape_s, cfg.cold_start_s, results) for shape in shapes])

    curve = [setup(h, None, [r for r, _ in shared_by_headroom[h]]) for h in headroom]
    widest = shared_by_headroom[min(headroom)]
    policies = [p for _, p in widest]
    peak = peak_claim(specs, policies)
    for share in pool_sizes:
        pool_gpus = max(share * peak, sum(p.inner.policy.min_replicas * s.fraction for s, p in zip(specs, policies)))
        grants = pool_grants(specs, policies, pool_gpus)
        results = [
            _run(*model_input, headroom=min(headroom), grants=g)[0] if any(g[t] < p.wants[t] for t in g) else r
            for model_input, g, (r, p) in zip(inputs, grants, widest)
        ]
        curve.append(setup(min(headroom), pool_gpus, results))
    outcome = Outcome(runs, curve[0].packings, cfg.scrape_s, days,
                      {"seed": seed, "tail": tail, "max_compute_share": max_compute_share, **cfg.__dict__}, curve)
    if out_dir is not None:
        write(outcome, out_dir)
    return outcome


COLUMNS = ["model", "engine", "shared claim", "mean req/s", "dedicated GPU-h", "dedicated SLO min %", "shared SLO min %", "shared claims GPU-h"]
SUMMARY_COLUMNS = ["setup", "GPU-h", "vs dedicated", "SLO min % (mean of models)", "SLO min % (worst model)", "notes"]


def rows(outcome: Outcome) -> list[dict]:
    return [
        {
            "model": r.spec.name,
            "engine": r.spec.engine,
            "shared claim": f"{r.spec.fraction:g}",
            "mean req/s": f"{r.mean_rps:.2f}",
            "dedicated GPU-h": f"{r.dedicated.gpu_hours:,.0f}",
            "dedicated SLO min %": f"{r.dedicated.slo_minutes_percent:.2f}",
            "shared SLO min %": f"{r.shared.slo_minutes_percent:.2f}",
            "shared claims GPU-h": f"{r.shared.gpu_hours * (r.spec.fraction if r.spec.fraction < 0.9 else 1):,.0f}",
        }
        for r in outcome.runs
    ]


def summary(outcome: Outcome) -> list[dict]:
    def slo(results: list[Result]) -> tuple[str, str]:
        values = [x.slo_minutes_percent for x in results]
        return f"{statistics.fmean(values):.2f}", f"{min(values):.2f}"

    dedicated = slo([r.dedicated for r in outcome.runs])
    shared = slo([r.shared for r in outcome.runs])
    out = []
    for packing in outcome.packings:
        nodes = f"{packing.gpus_per_node}-GPU nodes"
        base = outcome.dedicated_gpu_hours(packing.gpus_per_node)
        out += [
            {"setup": f"dedicated per-model pools, {nodes}", "GPU-h": f"{base:,.0f}", "vs dedicated": "1.00",
             "SLO min % (mean of models)": dedicated[0], "SLO min % (worst model)": dedicated[1],
             "notes": "whole GPUs (--gpu-memory-utilization 0.9), each pool rounded up to whole nodes"},
            {"setup": f"one shared, packed pool, {nodes}", "GPU-h": f"{packing.gpu_hours:,.0f}",
             "vs dedicated": f"{packing.gpu_hours / base:.2f}",
             "SLO min % (mean of models)": shared[0], "SLO min % (worst model)": shared[1],
             "notes": f"{packing.moves} replica moves ({packing.moved_gpu_hours:,.1f} GPU-h of restarts), peak {max(packing.paid)} GPUs"},
        ]
        equal = outcome.shared_at_dedicated_slo(packing.gpus_per_node)
        if outcome.curve:
            out.append({
                "setup": f"shared pool at the dedicated SLO minutes, {nodes}",
                "GPU-h": "no point of the curve reaches it" if equal is None else f"{equal[0]} {equal[1]:,.0f}",
                "vs dedicated": "–" if equal is None else f"{equal[0]} {equal[1] / base:.2f}",
                "SLO min % (mean of models)": dedicated[0], "SLO min % (worst model)": "–",
                "notes": f"on the shared pool's curve ({len(outcome.curve)} points: headroom and pool size, share_pool): = interpolated,"
                         " ≤ every point does better than the dedicated SLO, the cheapest shown",
            })
    return out


CURVE_COLUMNS = ["shared pool", "SLO min % (mean of models)", "SLO min % (worst model)", "GPU-h by node size"]


def curve_rows(outcome: Outcome) -> list[dict]:
    return [
        {
            "shared pool": s.label,
            "SLO min % (mean of models)": f"{s.slo:.2f}",
            "SLO min % (worst model)": f"{min(r.slo_minutes_percent for r in s.results):.2f}",
            "GPU-h by node size": ", ".join(f"{p.gpu_hours:,.0f} ({p.gpus_per_node}-GPU)" for p in s.packings),
        }
        for s in outcome.curve
    ]


def write(outcome: Outcome, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / "models"
    write_csv(stem.with_suffix(".csv"), rows(outcome), COLUMNS)
    write_csv(stem.with_name("models-summary.csv"), summary(outcome), SUMMARY_COLUMNS)
    write_csv(stem.with_name("models-curve.csv"), curve_rows(outcome), CURVE_COLUMNS)
    stem.with_suffix(".md").write_text(
        f"Traces: {SERVEGEN_SOURCE}; first {outcome.days:g} days, arrival seed {outcome.config['seed']}\n"
        f"Fleet: {json.dumps(outcome.config)}\n\n"
        + markdown_table(summary(outcome), SUMMARY_COLUMNS) + "\n\nThe shared pool's curve:\n\n"
        + markdown_table(curve_rows(outcome), CURVE_COLUMNS) + "\n\nPer model:\n\n"
        + markdown_table(rows(outcome), COLUMNS) + "\n"
    )
    plot(outcome, stem.with_suffix(".png"))


def plot(outcome: Outcome, path: Path) -> None:
    """GPUs paid for over time: the dedicated pools stacked by model group against the shared pool."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    packing = outcome.packings[0]
    hours = [i * outcome.scrape_s / 3600 for i in range(len(packing.paid))]
    groups: dict[str, list[float]] = {}
    for r in outcome.runs:
        key = "long tail" if r.spec.name.startswith("tail-") else r.spec.name
        series = groups.setdefault(key, [0.0] * len(hours))
        for i, n in enumerate(dedicated_paid(r, packing.gpus_per_node)[: len(hours)]):
            series[i] += n
    base = outcome.dedicated_gpu_hours(packing.gpus_per_node)
    fig, ax = plt.subplots(figsize=(11, 5.5))
    ax.stackplot(hours, *groups.values(), labels=[f"dedicated: {k}" for k in groups], alpha=0.5)
    ax.plot(hours, packing.paid, color="black", lw=1.2, label="shared, packed pool")
    ax.set_xlabel("hours")
    ax.set_ylabel(f"GPUs paid for ({packing.gpus_per_node}-GPU nodes)")
    ax.set_title(f"{len(outcome.runs)} models: dedicated pools {base:,.0f} GPU-h vs one shared pool"
                 f" {packing.gpu_hours:,.0f} GPU-h ({1 - packing.gpu_hours / base:.0%} less)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
