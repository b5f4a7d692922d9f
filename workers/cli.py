"""The ``tideplane`` command: the local sandbox, the worker and the demo.

Workflows are started and steered with the ``temporal`` CLI; this covers what it cannot do.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from benchmarks.cli import add_bench_commands
from infra.grafana import import_help
from infra.sandbox.config import DEFAULT_CONFIG, SandboxConfigError
from infra.sandbox.launcher import DEFAULT_STATE_DIR, Sandbox, SandboxError
from workers.config import SettingsError
from workers.registry_cli import add_registry_commands
from workers.schedules import add_schedules_commands


def _sandbox_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=Path, default=Path(os.environ.get("TIDEPLANE_SANDBOX_DIR", DEFAULT_STATE_DIR)), help="where env, kubeconfig, pids and logs go (default %(default)s)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="sandbox config: node pools, profiles, demand")
    parser.add_argument("--time-scale", type=float, default=None, help="sandbox seconds per real second (overrides the config)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tideplane", description="Control plane for LLM inference fleets on Kubernetes GPU clusters.")
    commands = parser.add_subparsers(dest="command", required=True)
    sandbox = commands.add_parser("sandbox", help="the local GPU-cluster sandbox")
    sandbox.add_argument("action", choices=("up", "down", "status", "spot-interrupt"))
    sandbox.add_argument("node", nargs="?", help="spot-interrupt: the node whose instance EC2 reclaims")
    sandbox.add_argument("--rebalance", action="store_true", help="spot-interrupt: send a rebalance recommendation only (no termination)")
    _sandbox_options(sandbox)
    commands.add_parser("worker", help="run the Temporal worker (settings from TIDEPLANE_* / the sandbox env file)")
    demo = commands.add_parser("demo", help="start the sandbox and the worker, then run the demo story")
    _sandbox_options(demo)
    add_registry_commands(commands)
    add_schedules_commands(commands)
    add_bench_commands(commands)
    return parser


def _sandbox(args: argparse.Namespace) -> int:
    if args.action == "spot-interrupt":
        from infra.sandbox.spot import spot_interrupt_running

        if not args.node:
            raise SystemExit("usage: tideplane sandbox spot-interrupt NODE [--rebalance]")
        done = spot_interrupt_running(args.state_dir, args.node, rebalance=args.rebalance)
        print(f"{done.kind} sent for {done.instance_id} (node {done.node})" + ("; instance terminated" if done.terminated else ""))
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # "Found credentials" on every client
    try:
        if args.command == "sandbox":
            return _sandbox(args)
        if args.command == "worker":
            from workers.worker import run_worker

            asyncio.run(run_worker())
            return 0
        if args.command == "demo":
            from workers.demo import run

            return run(args.state_dir, args.config, args.time_scale)
        return args.func(args)
    except (SandboxConfigError, SettingsError) as exc:
        print(f"tideplane: {exc}", file=sys.stderr)
        return 2
    except (SandboxError, RuntimeError) as exc:
        print(f"tideplane: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
