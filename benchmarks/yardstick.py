"""The scaling bench's output contract (issue 34): what every ``tideplane bench scaling`` run writes.

- ``scaling-<trace>-results.csv``: one row per policy, trace and seed, with the policy's family
  (``FAMILIES``), the split it was scored on (``tuning``: the data tideplane was tuned on;
  ``held-out``: everything else), GPU-hours, minutes within the TTFT SLO and requests within it;
- ``scaling-<trace>-summary.md``: per trace and family, the cheapest member reaching
  ``SUMMARY_SLO`` % of minutes (mean over seeds) and the most any member reaches;
- ``scaling-<trace>-results.png``: GPU-hours against SLO minutes, one line per family and trace.

A consumer compares families at equal SLO from the CSV alone, so its columns are fixed here.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.bound import Bound
from infra.fleetmodel.fleet import Result, fine_value

CONTRACT_COLUMNS = ["policy", "family", "trace", "split", "seed", "gpu_hours", "slo_minutes_percent", "request_slo_percent", "warm_pool"]
FAMILIES = ("tideplane", "static", "keda-rate", "keda-waiting", "keda-in_flight", "hpa-gpu-util", "bound", "ideal")
SUMMARY_SLO = 99.5  # SLO minutes, %: the level the summary prices each family at
PLOT_LABELS = {"bound": "bound (same cold start)", "ideal": "ideal (zero cold start)"}
SUMMARY_COLUMNS = ["trace", "split", "family", "warm_pool", "policies", "cheapest_policy_at_slo", "gpu_hours_at_slo", "best_slo_minutes_percent"]


def contract_family(policy: str) -> str:
    """The contract's family of a bench policy name (the oracle, zero cold start, is ``ideal``)."""
    if policy == "oracle":
        return "ideal"
    for fam in FAMILIES:
        if policy == fam or policy.startswith(fam + "-") or (fam == "hpa-gpu-util" and policy.startswith("hpa-")):
            return fam
    raise ValueError(f"policy {policy!r} belongs to none of the contract's families {FAMILIES}")


def request_slo_percent(result: Result) -> float:
    """Requests whose first token came within the TTFT SLO, percent (to the 2 % of ``fine_bins``)."""
    total = within = 0.0
    for hour in result.hour_fine:
        for k, weight in hour.items():
            total += weight
            if fine_value(k) <= result.config.ttft_slo_s:
                within += weight
    return 100.0 * within / total if total else 100.0


def contract_rows(scored: list[tuple[str, bool, list[int], list[list[Result]]]], warm_pool: set[str]) -> list[dict]:
    """Rows of the CSV. ``scored``: (trace label, tuned on it, seeds, runs per seed per policy);
    ``warm_pool``: the policies whose replicas may start from a warm pool."""
    out = []
    for trace, tuning, seeds, runs in scored:
        for seed, seed_runs in zip(seeds, runs):
            seen = set()
            for r in seed_runs:
                if r.policy in seen:
                    continue  # static sizes that coincide (a short trace)
                seen.add(r.policy)
                out.append({
                    "policy": r.policy, "family": contract_family(r.policy), "trace": trace, "split": "tuning" if tuning else "held-out",
                    "seed": seed, "gpu_hours": round(r.gpu_hours, 2), "slo_minutes_percent": round(r.slo_minutes_percent, 3),
                    "request_slo_percent": round(request_slo_percent(r), 3), "warm_pool": "yes" if r.policy in warm_pool else "no",
                })
    return out


def bound_row(trace: str, tuning: bool, seed: int, bound: Bound) -> dict:
    """The lower bound's row (``benchmarks.bound``): its GPU-hours at exactly the minutes it meets;
    its requests within the SLO are those of the minutes it meets (a skipped minute's count as missed)."""
    return {
        "policy": "bound", "family": "bound", "trace": trace, "split": "tuning" if tuning else "held-out", "seed": seed,
        "gpu_hours": round(bound.gpu_hours, 2), "slo_minutes_percent": round(bound.slo_minutes_percent, 3),
        "request_slo_percent": round(bound.request_slo_percent, 3), "warm_pool": "no",
    }


def _means(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """(trace, policy) -> the row with GPU-hours and SLO figures averaged over its seeds."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["trace"], row["policy"]), []).append(row)
    return {
        key: {**same[0], "gpu_hours": statistics.mean(r["gpu_hours"] for r in same),
              "slo_minutes_percent": statistics.mean(r["slo_minutes_percent"] for r in same)}
        for key, same in groups.items()
    }


def _warm_pool_of(members: list[dict]) -> str:
    """``yes``, ``no``, or ``some`` where a family mixes both (tideplane's ablation)."""
    kinds = {m["warm_pool"] for m in members}
    return kinds.pop() if len(kinds) == 1 else "some"


def summary(rows: list[dict]) -> list[dict]:
    """Per trace and family: the cheapest policy whose mean SLO minutes reach ``SUMMARY_SLO``."""
    by_family: dict[tuple[str, str], list[dict]] = {}
    for row in _means(rows).values():
        by_family.setdefault((row["trace"], row["family"]), []).append(row)
    out = []
    for (trace, fam), members in by_family.items():
        good = [m for m in members if m["slo_minutes_percent"] >= SUMMARY_SLO]
        cheapest = min(good, key=lambda m: m["gpu_hours"]) if good else None
        out.append({
            "trace": trace, "split": members[0]["split"], "family": fam,
            "warm_pool": _warm_pool_of(members),
            "policies": len(members),
            "cheapest_policy_at_slo": cheapest["policy"] if cheapest else f"none reaches {SUMMARY_SLO:g} %",
            "gpu_hours_at_slo": f"{cheapest['gpu_hours']:,.1f}" if cheapest else "",
            "best_slo_minutes_percent": f"{max(m['slo_minutes_percent'] for m in members):.2f}",
        })
    return out


def plot(rows: list[dict], path: Path) -> None:
    """One panel per trace; in each, one line per family through its policies (means over seeds), by GPU-hours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    means = list(_means(rows).values())
    trace_names = list(dict.fromkeys(r["trace"] for r in means))
    fig, axes = plt.subplots(1, len(trace_names), figsize=(7 * len(trace_names), 5.5), squeeze=False)
    for ax, trace in zip(axes[0], trace_names):
        on_trace = [r for r in means if r["trace"] == trace]
        for fam in FAMILIES:
            members = sorted((r for r in on_trace if r["family"] == fam), key=lambda r: r["gpu_hours"])
            if members:
                warm = any(r["warm_pool"] == "yes" for r in members)
                ax.plot([r["slo_minutes_percent"] for r in members], [r["gpu_hours"] for r in members], marker="o", lw=1,
                        label=f"{fam} (warm pool)" if warm else PLOT_LABELS.get(fam, fam))
        ax.set_yscale("log")
        ax.set_xlabel("minutes with p99 TTFT within the SLO, %")
        ax.set_ylabel("GPU-hours (log)")
        ax.set_title(f"{trace} ({on_trace[0]['split']})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
