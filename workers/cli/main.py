"""The ``tideplane`` command: the worker, each capability's commands, the local sandbox and the demo.

Workflows are started and steered with the ``temporal`` CLI; this covers what it cannot do.
The sandbox, demo and bench commands import their modules inside the command, so the worker
image (infra/k8s/Containerfile), which holds neither the sandbox nor the benchmarks, runs
``tideplane worker`` (tests/unit/worker/test_image.py builds that file set and proves it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import NoReturn

import temporalio.runtime

from workers.cli.cost import add_cost_commands
from workers.cli.node_cache import add_node_cache_commands
from workers.cli.quality import add_golden_commands
from workers.cli.quotas import add_quotas_commands
from workers.cli.registry import add_registry_commands
from workers.cli.rollout import add_rollout_commands
from workers.cli.schema import add_schema_commands
from workers.cli.completion import add_completion_command
from workers.cli.errors import FAILED, USAGE, explain, report
from workers.cli.sandbox import add_demo_command, add_sandbox_commands, with_sandbox
from workers.cli.scaling import add_schedules_commands
from workers.cli.setup import add_setup_commands
from workers.codec_server import add_codec_server_command
from workers.config import SettingsError, load_settings


class Parser(argparse.ArgumentParser):
    """Every usage error, in any subcommand, begins like every other error: ``tideplane: error:``."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"tideplane: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tideplane", description="Control plane for LLM inference fleets on Kubernetes GPU clusters.")
    parser.add_argument("--version", action="version", version=f"tideplane {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_sandbox_commands(commands)
    add_rollout_commands(commands)
    add_schema_commands(commands)
    add_completion_command(commands, parser)
    commands.add_parser("worker", help="run the Temporal worker (settings from TIDEPLANE_* / the sandbox env file)")
    add_demo_command(commands)
    add_golden_commands(add_registry_commands(commands))
    add_schedules_commands(commands)
    add_setup_commands(commands)
    add_cost_commands(commands)
    add_node_cache_commands(commands)
    add_quotas_commands(commands)
    add_codec_server_command(commands)
    # Parsed by benchmarks.cli inside _bench: numpy, matplotlib and the simulators load only when asked for.
    bench = commands.add_parser("bench", help="benchmarks on real traces (tideplane bench --help)", add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tideplane")
    except PackageNotFoundError:
        return "unknown"


def _bench(argv: list[str]) -> int:
    from benchmarks.cli import add_bench_commands, run

    parser = argparse.ArgumentParser(prog="tideplane")
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *argv])
    return run(args)


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
    code = run(argv)
    if _temporal_runtime_started():
        _leave(code)
    return code


def run(argv: list[str] | None = None) -> int:
    """Parse and run one command; its exit code (the table in workers/cli/errors.py)."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    configure_logging()
    return _dispatch(args, unknown)


def _dispatch(args: argparse.Namespace, unknown: list[str]) -> int:
    try:
        if args.command in ("sandbox", "demo"):
            return with_sandbox(args)
        if args.command == "bench":
            return _bench(unknown + args.bench_args)  # `bench -h` leaves -h in unknown
        config = load_settings()  # once, passed down: nothing reads settings from a global
        if args.command == "worker":
            from workers.worker import run_worker

            asyncio.run(run_worker(config))
            return 0
        return args.func(args, config)
    except SettingsError as exc:
        return report(str(exc), USAGE)
    except SystemExit as exc:  # a command's `raise SystemExit("error: ...")`: the same one line
        if isinstance(exc.code, str):  # a missing or unreadable file is a usage error, as everywhere
            unreadable = any(w in exc.code for w in ("No such file", "Is a directory", "Permission denied"))
            return report(exc.code, USAGE if unreadable else FAILED)
        raise
    except Exception as exc:  # noqa: BLE001 - one line for an outside system that is down, never a traceback
        explained = explain(exc)
        if explained is not None:
            return report(*explained)
        if isinstance(exc, RuntimeError):
            return report(str(exc), FAILED)
        raise


if __name__ == "__main__":
    sys.exit(main())
