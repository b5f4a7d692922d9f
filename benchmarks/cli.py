"""``tideplane bench scaling|spot|staging|control-plane|batching|models``; also ``python -m benchmarks.cli ...``.

Each command prints its table (markdown) and writes its files under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks import traces

RESULTS = Path(__file__).resolve().parent / "results"


def _scaling(args: argparse.Namespace) -> int:
    from benchmarks import scaling, yardstick
    from infra.fleetmodel.fleet import FleetConfig

    from infra.fleetmodel.coldstart import load_cold_start

    cold_start = args.cold_start if args.cold_start is not None else load_cold_start().fresh_s
    cfg = FleetConfig(engine=args.engine, cold_start_s=cold_start, ttft_slo_s=args.slo, scrape_s=args.scrape,
                      step_s=args.step, gpu_hour_price=args.gpu_price)
    floors = scaling.floors_from_file(args.schedule, args.start or scaling.DEFAULT_START) if args.schedule else scaling.Floors()
    overrides = json.loads(args.policy) if args.policy else None
    reports = scaling.run(args.trace, args.out, cfg, seeds=tuple(args.seeds), category=args.category, clients=args.clients,
                          days=args.days, overrides=overrides, tuned=not args.no_tune, floors=floors,
                          jobs=args.jobs)
    for report in reports:
        print(f"\n## {report.label} ({'IN-SAMPLE: tideplane tuned here' if report.in_sample else 'out-of-sample'})")
        print("\nAblation (each lever added to the ones above; GPU-hours include the warm pool's disks and launches):")
        print(scaling.markdown_table(report.ablation, scaling.ABLATION_COLUMNS) + "\n")
        print(scaling.markdown_table(report.table, scaling.COLUMNS))
        print("\nAt equal SLO minutes (histogram_quantile), interpolated on each baseline's curve:")
        print(scaling.markdown_table(report.comparison, scaling.COMPARE_COLUMNS))
    print(f"\n## Summary: each family's cheapest policy at {yardstick.SUMMARY_SLO:g} % SLO minutes (CSV: *-results.csv under --out)")
    print(scaling.markdown_table(yardstick.summary(scaling.contract(reports)), yardstick.SUMMARY_COLUMNS))
    return 0


def _spot(args: argparse.Namespace) -> int:
    from benchmarks import spot

    model = spot.Model(target=args.target, notice_s=args.notice, cold_start_s=args.cold_start,
                       on_demand_capacity=args.on_demand_capacity, warm_start_s=args.warm_start,
                       warm_disk_usd_per_hour=args.warm_disk_cost)
    settings = spot.Settings(availability=args.availability, max_overprovision=args.max_overprovision,
                             window_s=args.window, stabilisation_s=args.stabilisation, warm_pool=args.warm_pool)
    table = spot.run(args.trace, args.out, model, settings, region=args.region, split_day=args.split_day,
                     sweep=not args.no_sweep)
    print(spot.markdown_table(table))
    return 0


def _staging(args: argparse.Namespace) -> int:
    from benchmarks import node_cache as staging

    if args.nodes:
        measured = int(args.size_gib * 2**30) if args.size_gib else 60 * 2**20
        table = staging.run_nodes(args.out, sorted(set(args.nodes)), measured_bytes=measured)
        print(staging.markdown_table(table, staging.NODE_COLUMNS))
        return 0
    table = staging.run(args.out, size_bytes=int((args.size_gib or 2.0) * 2**30), files=args.files, repeats=args.repeats)
    print(staging.markdown_table(table))
    return 0


def _control_plane(args: argparse.Namespace) -> int:
    import asyncio

    from benchmarks import control_plane

    table = asyncio.run(control_plane.run(args.out, loops=args.loops, duration_s=args.duration, interval_s=args.interval,
                                            iterations_per_run=args.iterations_per_run))
    print(control_plane.markdown_table(table))
    return 0


def _batching(args: argparse.Namespace) -> int:
    from benchmarks import batching

    rows = batching.run(args.out, args.traces, args.ttft_slo, args.tpot_slo, args.duration, args.seed, args.engine)
    print(batching.markdown_table(rows))
    return 0


def _models(args: argparse.Namespace) -> int:
    from benchmarks import models
    from infra.fleetmodel.fleet import FleetConfig

    cfg = FleetConfig(cold_start_s=args.cold_start, ttft_slo_s=args.slo, step_s=args.step, gpu_hour_price=args.gpu_price)
    outcome = models.run(args.out, cfg, days=args.days, seed=args.seed, tail=args.tail,
                         max_compute_share=args.max_compute_share, gpus_per_node=args.gpus_per_node, path=args.trace)
    print(models.markdown_table(models.summary(outcome), models.SUMMARY_COLUMNS))
    print()
    print(models.markdown_table(models.curve_rows(outcome), models.CURVE_COLUMNS))
    print()
    print(models.markdown_table(models.rows(outcome), models.COLUMNS))
    return 0


def _coordination(args: argparse.Namespace) -> int:
    from benchmarks import coordination

    print(coordination.markdown_table(coordination.run_all(args.out)))
    return 0


def add_bench_commands(subparsers) -> None:
    """Registers ``bench`` and its benchmarks on the ``tideplane`` CLI's subparsers."""
    bench = subparsers.add_parser("bench", help="benchmarks on real traces (results under benchmarks/results/)")
    kinds = bench.add_subparsers(dest="bench", required=True)

    s = kinds.add_parser("scaling", help="GPU-hours vs TTFT SLO minutes: oracle, static/HPA/KEDA curves and tideplane on the fleet model")
    s.add_argument("--trace", type=Path, default=traces.SERVEGEN, help="ServeGen .tar.gz or the Azure 2023 .csv (default %(default)s)")
    s.add_argument("--category", default="m-large", help="ServeGen model category (m-large, m-mid)")
    s.add_argument("--clients", type=int, default=None, help="read only the first N ServeGen clients")
    s.add_argument("--days", type=float, default=None, help="simulate only the first N days")
    s.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="arrival draws of the ServeGen traces")
    s.add_argument("--engine", default=None, help="calibrated engine of infra/fleetmodel/calibration.yaml (default: its default_engine)")
    s.add_argument("--step", type=float, default=15.0, help="aggregate-mode step, s (the backlog is kept per second regardless)")
    s.add_argument("--scrape", type=float, default=15.0, help="Prometheus scrape interval, s")
    s.add_argument("--cold-start", type=float, default=None,
                   help="a replica's start on a fresh node, s (default: the sum of infra/fleetmodel/coldstart.yaml's parts)")
    s.add_argument("--slo", type=float, default=2.0, help="p99 TTFT SLO, s")
    s.add_argument("--gpu-price", type=float, default=10.32, help="$ per GPU-hour")
    s.add_argument("--schedule", type=Path, default=None, help="a `tideplane schedules apply` file: floors + prewarm for tideplane")
    s.add_argument("--policy", default=None, help='JSON overrides of ScalingPolicy for tideplane (skips tuning), e.g. \'{"cooldown_seconds": 300}\'')
    s.add_argument("--no-tune", action="store_true", help="tideplane with the bench's derived policy, no overrides")
    s.add_argument("--start", default=None, help="wall-clock time of the trace's t=0 (ISO, default a Monday 00:00 UTC)")
    s.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes running the policies side by side; 1: one after another (figures are the same; default %(default)s)")
    s.add_argument("--out", type=Path, default=RESULTS)
    s.set_defaults(func=_scaling)

    from benchmarks import spot
    from benchmarks.spot import DEFAULT as spot_defaults

    p = kinds.add_parser("spot", help="a spot availability trace: on-demand vs spot-only vs tideplane's spot policy")
    p.add_argument("--trace", type=Path, default=traces.SKYNOMAD,
                   help="availability folder (format: benchmarks/traces.load_availability)")
    p.add_argument("--target", type=int, default=8, help="instances the service needs")
    p.add_argument("--availability", type=float, default=spot_defaults.availability, help="the policy's availability target")
    p.add_argument("--max-overprovision", type=int, default=spot_defaults.max_overprovision, help="spot replicas beyond the target")
    p.add_argument("--window", type=float, default=spot_defaults.window_s, help="preemption-rate history, s")
    p.add_argument("--stabilisation", type=float, default=spot_defaults.stabilisation_s, help="spot healthy this long before on-demand goes, s")
    p.add_argument("--cold-start", type=float, default=240.0, help="a launched instance's start-up until it serves, s")
    p.add_argument("--notice", type=float, default=120.0, help="interruption notice, s (AWS: 120, GCP: 30)")
    p.add_argument("--warm-pool", action=argparse.BooleanOptionalAction, default=spot_defaults.warm_pool,
                   help="hold the policy's warm_pool_needed stopped on-demand instances (EC2 warm pool)")
    p.add_argument("--warm-start", type=float, default=spot.Model.warm_start_s, help="a warm-pool instance's start until it serves, s")
    p.add_argument("--warm-disk-cost", type=float, default=spot.Model.warm_disk_usd_per_hour, help="$ per hour of a stopped instance (its EBS volumes)")
    p.add_argument("--on-demand-capacity", type=int, default=None, help="on-demand instances per region (default: target)")
    p.add_argument("--region", default=None, help="the one-region cluster (default: the region with most zones)")
    p.add_argument("--split-day", type=float, default=7.0, help="tune before this day, hold out after it")
    p.add_argument("--no-sweep", action="store_true", help="skip the settings sweep and its plot")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.set_defaults(func=_spot)

    g = kinds.add_parser("staging", help="stage_weights (hashing, resumable) vs plain boto3 from a moto S3 server;"
                         " with --nodes: N nodes' caches, peer-to-peer vs S3 alone, and a one-file delta")
    g.add_argument("--size-gib", type=float, default=None,
                   help="total size of the weight set (default 2; with --nodes, of the measured model: 0.0586 = 60 MiB)")
    g.add_argument("--nodes", type=int, nargs="+", default=None, help="node counts to stage onto at once, e.g. 1 2 4 8")
    g.add_argument("--files", type=int, default=4, help="number of weight files")
    g.add_argument("--repeats", type=int, default=2, help="timed runs of each method (best is reported)")
    g.add_argument("--out", type=Path, default=RESULTS)
    g.set_defaults(func=_staging)

    c = kinds.add_parser("control-plane", help="N ReactiveScaling loops on a local Temporal dev server")
    c.add_argument("--loops", type=int, nargs="+", default=[100], help="numbers of concurrent loops to measure")
    c.add_argument("--duration", type=float, default=300.0, help="seconds to run each N")
    c.add_argument("--interval", type=float, default=30.0, help="decision interval, s")
    c.add_argument("--iterations-per-run", type=int, default=240, help="decisions per run before continue-as-new")
    c.add_argument("--out", type=Path, default=RESULTS)
    c.set_defaults(func=_control_plane)

    b = kinds.add_parser("batching", help="throughput per GPU at the SLO: tuned batching vs vLLM's defaults on the fleet model")
    b.add_argument("--traces", nargs="+", default=["m-large", "m-mid", "azure-code"], help="request sizes of: ServeGen categories, azure-code")
    b.add_argument("--ttft-slo", type=float, default=2.0, help="p99 TTFT SLO, s")
    b.add_argument("--tpot-slo", type=float, default=0.1, help="p99 TPOT SLO (per request), s")
    b.add_argument("--duration", type=float, default=300.0, help="simulated seconds of arrivals per measured rate")
    b.add_argument("--seed", type=int, default=0, help="arrival and size draws")
    b.add_argument("--engine", default=None, help="calibrated engine of infra/fleetmodel/calibration.yaml (default: its default_engine)")
    b.add_argument("--out", type=Path, default=RESULTS)
    b.set_defaults(func=_batching)

    m = kinds.add_parser("models", help="many models: dedicated per-model GPU pools vs one shared, packed pool (GPU-hours, SLO minutes)")
    m.add_argument("--trace", type=Path, default=traces.SERVEGEN, help="ServeGen .tar.gz (its categories and clients are the models)")
    m.add_argument("--days", type=float, default=7.0, help="simulate the first N days")
    m.add_argument("--seed", type=int, default=0, help="arrival draw")
    m.add_argument("--tail", type=int, default=20, help="at most N small models, one per smaller m-large client (mean 0.2-5 req/s, <= 10 %% of windows missing)")
    m.add_argument("--max-compute-share", type=float, default=0.5,
                   help="compute shares a shared GPU's replicas may add up to; shared replicas run 1/(1-x) slower")
    m.add_argument("--gpus-per-node", type=int, default=8, help="GPUs of a node (the shared pool is also counted on 1-GPU nodes)")
    m.add_argument("--step", type=float, default=15.0, help="aggregate-mode step, s")
    m.add_argument("--cold-start", type=float, default=240.0, help="node boot + weight load + warm-up, s")
    m.add_argument("--slo", type=float, default=2.0, help="p99 TTFT SLO, s")
    m.add_argument("--gpu-price", type=float, default=10.32, help="$ per GPU-hour")
    m.add_argument("--out", type=Path, default=RESULTS)
    m.set_defaults(func=_models)

    o = kinds.add_parser("coordination", help="rollout, scaling and spot on one fleet: tideplane vs Argo-style canary + KEDA-style loop,"
                         " four scenarios (false rollbacks, minutes over SLO, leaked replicas, GPU-hours, time to promote)")
    o.add_argument("--out", type=Path, default=RESULTS)
    o.set_defaults(func=_coordination)


def run(args: argparse.Namespace) -> int:
    """Runs the parsed benchmark; a public trace that is absent is one line naming it and how to get it, exit 2."""
    try:
        return args.func(args)
    except FileNotFoundError as e:
        reason = str(e) if isinstance(e, traces.TraceMissing) else traces.missing(Path(e.filename)) if e.filename else None
        if not reason:
            raise
        print(f"tideplane bench: {reason}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cli", description="tideplane benchmarks")
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
