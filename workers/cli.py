"""The ``tideplane`` command: the local sandbox, the worker and the demo.

Workflows are started and steered with the ``temporal`` CLI; this covers what it cannot do.
The sandbox, demo and bench commands import their modules inside the command, so the worker
image (infra/k8s/Containerfile), which holds neither the sandbox nor the benchmarks, runs
``tideplane worker`` (tests/unit/test_image.py builds that file set and proves it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

import temporalio.runtime

from workers.codec_server import add_codec_server_command
from workers.config import SettingsError, load_settings
from workers.cost_cli import add_cost_commands
from workers.node_cache_cli import add_node_cache_commands
from workers.quotas_cli import add_quotas_commands
from workers.registry_cli import add_registry_commands
from workers.schedules import add_schedules_commands


def _sandbox_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=Path, default=None, help="where env, kubeconfig, pids and logs go (default $TIDEPLANE_SANDBOX_DIR, else .tideplane/sandbox)")
    parser.add_argument("--config", type=Path, default=None, help="sandbox config: node pools, profiles, demand (default infra/sandbox/sandbox.yaml)")
    parser.add_argument("--time-scale", type=float, default=None, help="sandbox seconds per real second (overrides the config)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tideplane", description="Control plane for LLM inference fleets on Kubernetes GPU clusters.")
    commands = parser.add_subparsers(dest="command", required=True)
    sandbox = commands.add_parser("sandbox", help="the local GPU-cluster sandbox")
    actions = sandbox.add_subparsers(dest="action", required=True)
    for action, what in (("up", "start it in the background"), ("down", "stop what `up` started, and the worker"), ("status", "each component, up or down")):
        _sandbox_options(actions.add_parser(action, help=what))
    spot = actions.add_parser("spot-interrupt", help="EC2 reclaiming a spot node's instance: the notice, then the termination")
    spot.add_argument("node", help="the spot node whose instance EC2 reclaims")
    spot.add_argument("--rebalance", action="store_true", help="send a rebalance recommendation only (no termination)")
    _sandbox_options(spot)
    replay = actions.add_parser("spot-replay", help="replay a spot availability trace on the sandbox's spot pools")
    replay.add_argument("--trace", type=Path, required=True, help="availability folder (benchmarks/traces.load_availability's format)")
    replay.add_argument("--pool", action="append", required=True, metavar="ZONE=POOL", help="the spot pool that plays a trace zone (repeat)")
    replay.add_argument("--sample-seconds", type=float, default=30.0, help="real seconds per trace sample")
    replay.add_argument("--start", type=int, default=0, help="first sample")
    replay.add_argument("--steps", type=int, default=None, help="samples to replay (default: to the end)")
    _sandbox_options(replay)
    commands.add_parser("worker", help="run the Temporal worker (settings from TIDEPLANE_* / the sandbox env file)")
    demo = commands.add_parser("demo", help="start the sandbox and the worker, then run the demo story")
    _sandbox_options(demo)
    add_registry_commands(commands)
    add_schedules_commands(commands)
    add_cost_commands(commands)
    add_node_cache_commands(commands)
    add_quotas_commands(commands)
    add_codec_server_command(commands)
    # Parsed by benchmarks.cli inside _bench: numpy, matplotlib and the simulators load only when asked for.
    bench = commands.add_parser("bench", help="benchmarks on real traces (tideplane bench --help)", add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    return parser


def _bench(argv: list[str]) -> int:
    from benchmarks.cli import add_bench_commands

    parser = argparse.ArgumentParser(prog="tideplane")
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def _with_sandbox(args: argparse.Namespace) -> int:
    """``sandbox`` and ``demo``: the sandbox's defaults and errors, loaded only for these commands."""
    from infra.sandbox.config import DEFAULT_CONFIG, SandboxConfigError
    from infra.sandbox.launcher import DEFAULT_STATE_DIR

    args.state_dir = args.state_dir or Path(os.environ.get("TIDEPLANE_SANDBOX_DIR", DEFAULT_STATE_DIR))
    args.config = args.config or DEFAULT_CONFIG
    try:
        if args.command == "demo":
            from workers.demo import run

            return run(args.state_dir, args.config, args.time_scale)
        return _sandbox(args)
    except SandboxConfigError as exc:  # a ValueError; SandboxError is a RuntimeError, answered in main
        print(f"tideplane: {exc}", file=sys.stderr)
        return 2


def _sandbox(args: argparse.Namespace) -> int:
    from infra.grafana import import_help
    from infra.sandbox.launcher import Sandbox

    if args.action == "spot-interrupt":
        from infra.sandbox.spot import spot_interrupt_running

        done = spot_interrupt_running(args.state_dir, args.node, rebalance=args.rebalance)
        print(f"{done.kind} sent for {done.instance_id} (node {done.node})" + ("; instance terminated" if done.terminated else ""))
        return 0
    if args.action == "spot-replay":
        from infra.sandbox.spot import SpotInterruptRefused, spot_replay_running

        pools = dict(p.split("=", 1) for p in args.pool if "=" in p)
        if len(pools) != len(args.pool):
            raise SpotInterruptRefused(f"--pool takes ZONE=POOL, got {args.pool}")
        for change in spot_replay_running(args.state_dir, args.trace, pools, args.sample_seconds, args.start, args.steps):
            print(f"sample {change.step}: {change.zone} {change.change} ({change.pool}" + (f": {', '.join(change.instances)})" if change.instances else ")"))
        return 0
    sandbox = Sandbox(args.state_dir, config_path=args.config, time_scale=args.time_scale)
    if args.action == "up":
        urls = sandbox.up()
        for name, url in urls.items():
            print(f"{name:<12} {url}")
        print(f"\nsource {sandbox.env_file}   # points temporal, kubectl, boto3 and the worker here")
        return 0
    if args.action == "down":
        stopped = sandbox.down()
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        return 0
    status = sandbox.status()
    if not status:
        print(f"no sandbox running from {sandbox.state_dir}")
        return 1
    for name, entry in status.items():
        print(f"{name:<12} {'up' if entry['up'] else 'DOWN':<5} {entry['url']}")
    print("\n" + import_help(sandbox.urls()["prometheus"]))
    return 0 if all(entry["up"] for entry in status.values()) else 1


# HTTP and cloud client libraries log every request (httpx "HTTP Request: ...") or credential lookup
# at INFO: in the worker's log they drowned tideplane's own lines. Their warnings still show.
QUIET_LOGGERS = ("httpx", "httpcore", "urllib3", "kubernetes", "botocore", "boto3", "s3transfer")


def configure_logging() -> None:
    """INFO for tideplane (and the Temporal SDK), WARNING for the HTTP and cloud clients."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _temporal_runtime_started() -> bool:
    """True once this process connected a Temporal client on the SDK's default runtime."""
    ref = getattr(temporalio.runtime, "_runtime_ref", None)
    return getattr(ref, "_default_runtime", None) is not None


def _leave(code: int) -> NoReturn:
    """End a command that used Temporal without interpreter teardown.

    The Temporal client's Rust (tokio) threads outlive the event loop; when CPython finalizes
    while one of them calls back into Python, it aborts with rc 134 "Fatal Python error:
    PyGILState_Release" after the output was printed (temporalio/sdk-python#300). The command's
    work is done and its output flushed here, so nothing is lost by skipping the teardown.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing left to write to
            pass
    logging.shutdown()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """The ``tideplane`` entry point. A command that opened a Temporal client exits through
    ``_leave``: a one-shot command once its output is printed, the worker once its graceful
    shutdown has finished (its pid file removed, its activities done)."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    configure_logging()
    code = _dispatch(args, unknown)
    if _temporal_runtime_started():
        _leave(code)
    return code


def _dispatch(args: argparse.Namespace, unknown: list[str]) -> int:
    try:
        if args.command in ("sandbox", "demo"):
            return _with_sandbox(args)
        if args.command == "bench":
            return _bench(unknown + args.bench_args)  # `bench -h` leaves -h in unknown
        config = load_settings()  # once, passed down: nothing reads settings from a global
        if args.command == "worker":
            from workers.worker import run_worker

            asyncio.run(run_worker(config))
            return 0
        return args.func(args, config)
    except SettingsError as exc:
        print(f"tideplane: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"tideplane: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
