"""``tideplane bench batching``: throughput per GPU at the SLO, tuned batching vs vLLM's defaults.

For each shipped trace's request sizes (ServeGen m-large and m-mid: the rate-weighted token
distributions of all windows; Azure 2023 code: its requests' own counts), one replica of the
fleet model's calibrated engine (``infra.fleetmodel``: continuous batching, chunked prefill, KV
cache, preemption) serves Poisson arrivals. Per batching setting, the highest arrival rate whose
TTFT p99 and TPOT p99 (vLLM's per-request ``time_per_output_token``) stay within the SLO is found
by bisection; the tuned setting is the rollout's own choice (``choose_setting``) among the
candidates measured at their capacities, and is compared with vLLM's defaults.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from benchmarks import traces
from infra.fleetmodel.engine import load_engine
from infra.fleetmodel.fleet import requests_from_counts
from infra.fleetmodel.metrics import exact_quantile
from infra.fleetmodel.replica import Replica
from infra.fleetmodel.sizes import SizeMix, TokenDist, from_requests, load_servegen_sizes
from workflows.rollout.batching import VLLM_DEFAULT, choose_setting
from workflows.core.batching_settings import BatchingSetting, SweepPoint

CANDIDATES = (
    VLLM_DEFAULT,
    BatchingSetting(max_num_seqs=1024, max_num_batched_tokens=16384),
    BatchingSetting(max_num_seqs=512, max_num_batched_tokens=8192),
    BatchingSetting(max_num_seqs=256, max_num_batched_tokens=4096),
    BatchingSetting(max_num_seqs=256, max_num_batched_tokens=2048),
    BatchingSetting(max_num_seqs=128, max_num_batched_tokens=1024),
    BatchingSetting(max_num_seqs=1024, max_num_batched_tokens=32768, chunked_prefill=False),
)
COLUMNS = ["trace", "setting", "capacity_rps", "tokens_per_s_per_gpu", "ttft_p99_s", "tpot_p99_s", "tuned", "vs_default"]


@dataclass
class Run:
    rate: float
    ttft_p99: float
    tpot_p99: float
    output_tokens_per_s: float


def one_window(mix: SizeMix) -> SizeMix:
    """All of a mix's windows pooled into one distribution each (the trace's overall shape)."""
    def pooled(dists: tuple[TokenDist, ...]) -> TokenDist:
        weights: dict[int, float] = {}
        for d in dists:
            for t, p in d.points:
                weights[t] = weights.get(t, 0.0) + p / len(dists)
        return TokenDist.of(weights)
    return SizeMix(86400.0, (pooled(mix.prompt),), (pooled(mix.output),), mix.source)


def shapes(which: list[str], servegen: Path = traces.SERVEGEN, datasets: Path = traces.SERVEGEN_DATASETS,
           azure: Path = traces.AZURE_CODE) -> dict[str, SizeMix]:
    out = {}
    for name in which:
        if name == "azure-code":
            out[name] = one_window(from_requests(traces.load_azure(azure), 86400.0, "azure-2023/code"))
        else:
            out[name] = one_window(load_servegen_sizes(name, servegen, datasets))
    return out


def serve(setting: BatchingSetting, sizes: SizeMix, rate: float, duration_s: float, seed: int, engine: str | None = None) -> Run:
    """One replica under ``setting`` at ``rate`` req/s for ``duration_s``; requests unfinished at
    the end (a queue that only grows) count as over every SLO."""
    eng = load_engine(engine).with_batching(setting.max_num_seqs, setting.max_num_batched_tokens, setting.chunked_prefill)
    requests = requests_from_counts([rate] * int(duration_s), 1.0, sizes, seed)
    replica = Replica(eng)
    replica.advance_to(duration_s * 1.5, requests)
    done = [r for r in requests if r.finished_s is not None]
    missing = len(requests) - len(done)
    ttfts = [(r.ttft, 1.0) for r in done] + [(math.inf, 1.0)] * missing
    tpots = [((r.finished_s - r.first_token_s) / max(1, r.output_tokens - 1), 1.0) for r in done] + [(math.inf, 1.0)] * missing
    tokens = sum(r.output_tokens for r in done)
    return Run(rate, exact_quantile(ttfts, 0.99) if ttfts else math.inf, exact_quantile(tpots, 0.99) if tpots else math.inf,
               tokens / duration_s / eng.gpus)


def capacity(setting: BatchingSetting, sizes: SizeMix, ttft_slo: float, tpot_slo: float, duration_s: float, seed: int,
             engine: str | None = None, iterations: int = 9) -> Run:
    """The highest rate (bisection) whose run stays within both SLOs."""
    ok = lambda run: run.ttft_p99 <= ttft_slo and run.tpot_p99 <= tpot_slo  # noqa: E731
    low, high = None, 1.0
    while True:  # grow until a rate fails
        run = serve(setting, sizes, high, duration_s, seed, engine)
        if not ok(run):
            break
        low, high = run, high * 2
    lo_rate = low.rate if low else 0.0
    for _ in range(iterations):
        mid = (lo_rate + high) / 2
        run = serve(setting, sizes, mid, duration_s, seed, engine)
        if ok(run):
            low, lo_rate = run, mid
        else:
            high = mid
    return low or Run(0.0, math.inf, math.inf, 0.0)


def run(out: Path, which: list[str], ttft_slo: float, tpot_slo: float, duration_s: float, seed: int, engine: str | None = None) -> list[dict]:
    rows: list[dict] = []
    summary: dict[str, tuple[float, float]] = {}
    for name, sizes in shapes(which).items():
        runs = {s: capacity(s, sizes, ttft_slo, tpot_slo, duration_s, seed, engine) for s in CANDIDATES}
        points = [SweepPoint(setting=s, tokens_per_second=r.output_tokens_per_s, ttft_p99_seconds=r.ttft_p99 if r.rate else None,
                             tpot_p99_seconds=r.tpot_p99 if r.rate else None, requests=1, errors=0) for s, r in runs.items()]
        chosen = choose_setting(points, ttft_slo, tpot_slo).setting
        default = runs[VLLM_DEFAULT].output_tokens_per_s
        for s, r in runs.items():
            rows.append({
                "trace": name, "setting": s.label(), "capacity_rps": round(r.rate, 2), "tokens_per_s_per_gpu": round(r.output_tokens_per_s, 1),
                "ttft_p99_s": round(r.ttft_p99, 3), "tpot_p99_s": round(r.tpot_p99, 4), "tuned": "yes" if s == chosen else "",
                "vs_default": round(r.output_tokens_per_s / default, 3) if default else math.nan,
            })
        summary[name] = (default, runs[chosen].output_tokens_per_s)
    write(out, rows, summary, ttft_slo, tpot_slo, duration_s, engine)
    return rows


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def write(out: Path, rows: list[dict], summary: dict[str, tuple[float, float]], ttft_slo: float, tpot_slo: float,
          duration_s: float, engine: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "batching.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    head = (f"# Batching: throughput per GPU at the SLO (TTFT p99 <= {ttft_slo:g} s, TPOT p99 <= {tpot_slo:g} s)\n\n"
            f"One replica of `{load_engine(engine).name}` in the fleet model, Poisson arrivals for {duration_s:g} s per rate, "
            "highest rate within both SLOs by bisection. `tuned`: the rollout's choice (`choose_setting`) among these.\n\n")
    (out / "batching.md").write_text(head + markdown_table(rows) + "\n")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(summary)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [summary[n][0] for n in names], 0.4, label="vLLM defaults")
    ax.bar([x + 0.2 for x in xs], [summary[n][1] for n in names], 0.4, label="tuned")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("output tokens/s per GPU at the SLO")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "batching.png", dpi=120)
    plt.close(fig)
