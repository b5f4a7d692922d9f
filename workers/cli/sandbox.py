"""``tideplane sandbox up|down|status|spot-interrupt|spot-replay`` and ``tideplane demo``: the local
GPU-cluster sandbox (infra/sandbox/) and the demo story on it. The sandbox's modules are imported
inside the commands only: the worker image holds no infra/ (tests/unit/worker/test_image.py)."""

from __future__ import annotations

from workers.cli.errors import FAILED, report
import argparse
import os
import sys
from pathlib import Path


def _sandbox_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=Path, default=None, help="where env, kubeconfig, pids and logs go (default $TIDEPLANE_SANDBOX_DIR, else .tideplane/sandbox)")
    parser.add_argument("--config", type=Path, default=None, help="sandbox config: node pools, profiles, demand (default infra/sandbox/sandbox.yaml)")
    parser.add_argument("--time-scale", type=float, default=None, help="sandbox seconds per real second (overrides the config)")


def add_sandbox_commands(commands) -> None:
    """Add ``sandbox up|down|status|spot-interrupt|spot-replay`` to the tideplane CLI's subparsers."""
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


def add_demo_command(commands) -> None:
    """Add ``demo`` to the tideplane CLI's subparsers."""
    demo = commands.add_parser("demo", help="start the sandbox and the worker, then run the demo story")
    _sandbox_options(demo)


def with_sandbox(args: argparse.Namespace) -> int:
    """``sandbox`` and ``demo``: the sandbox's defaults and errors, loaded only for these commands."""
    from infra.sandbox.config import DEFAULT_CONFIG, SandboxConfigError
    from infra.sandbox.launcher import DEFAULT_STATE_DIR

    args.state_dir = args.state_dir or Path(os.environ.get("TIDEPLANE_SANDBOX_DIR", DEFAULT_STATE_DIR))
    args.config = args.config or DEFAULT_CONFIG
    try:
        if args.command == "demo":
            from workers.cli.demo import run

            return run(args.state_dir, args.config, args.time_scale)
        return _sandbox(args)
    except SandboxConfigError as exc:  # a ValueError; SandboxError is a RuntimeError, answered in main
        report(f"{exc}", FAILED)
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
