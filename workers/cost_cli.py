"""``tideplane cost report``: the CostReport's Markdown table on the terminal.

The report is a workflow (workflows/cost/report.py) whose result holds the table and its Markdown;
this runs one now (a worker must be polling) and prints the Markdown, or with ``--latest`` prints
the last completed run's (the daily schedule's or anyone's) without running anything.

workers/cli.py wires it in with ``add_cost_commands(subparsers)``; the subcommand sets
``func(args, settings) -> int``: the CLI builds the Settings once and passes them.
``python -m workers.cost_cli cost report`` runs it on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime, timezone

from temporalio.client import Client

from workers.client import connect
from workers.config import Settings, load_settings
from workflows.cost.report import CostReport, CostReportInput, CostReportResult


async def run_now(client: Client, run, arg, id_prefix: str, task_queue: str, timeout: float):
    """Start a report workflow (ID ``<id_prefix>/cli-<time>``) and wait for its result; TimeoutError after ``timeout`` s."""
    workflow_id = f"{id_prefix}/cli-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}"
    handle = await client.start_workflow(run, arg, id=workflow_id, task_queue=task_queue)
    try:
        return await asyncio.wait_for(handle.result(), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(
            f"no result after {timeout:g} s: is a worker polling task queue {task_queue!r}? ({workflow_id} keeps running)"
        ) from None


async def latest_result(client: Client, workflow_type: str, result_type: type):
    """The result of the most recently started ``workflow_type`` run that completed, None when there is none."""
    query = f'WorkflowType = "{workflow_type}" AND ExecutionStatus = "Completed"'
    async for execution in client.list_workflows(query, limit=1):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id, result_type=result_type)
        return await handle.result()
    return None


def print_report(args, config: Settings, run, arg, workflow_type: str, result_type: type, id_prefix: str, command: str) -> int:
    """Run a report workflow now and print its ``markdown``, or with ``args.latest`` the last completed one's."""

    async def fetch():
        client = await connect(config)
        if args.latest:
            return await latest_result(client, workflow_type, result_type)
        return await run_now(client, run, arg, id_prefix, config.task_queue, args.timeout)

    try:
        result = asyncio.run(fetch())
    except TimeoutError as exc:
        print(f"tideplane: {exc}", file=sys.stderr)
        return 1
    if result is None:
        print(f"tideplane: no completed {workflow_type} yet (run `{command}`, or wait for the daily schedule)", file=sys.stderr)
        return 1
    print(result.markdown)
    return 0


def cmd_report(args, config: Settings) -> int:
    return print_report(args, config, CostReport.run, CostReportInput(window_hours=args.window_hours), "CostReport", CostReportResult,
                        "cost-report", "tideplane cost report")


def window_hours(text: str) -> float:
    """--window-hours within what CostReportInput accepts (0 < h <= 744), said by argparse."""
    hours = float(text)
    if not 0 < hours <= 24 * 31:
        raise ValueError(text)
    return hours


def add_cost_commands(subparsers) -> None:
    """Add ``cost report`` to the tideplane CLI's subparsers."""
    cost = subparsers.add_parser("cost", help="what the fleet cost (the CostReport workflow)")
    sub = cost.add_subparsers(dest="cost_command", required=True)
    p = sub.add_parser("report", help="run a CostReport now and print its Markdown table (or --latest: the last one's)")
    p.add_argument("--window-hours", type=window_hours, default=24.0, help="the window ending now, in hours (0 < h <= 744; default 24)")
    p.add_argument("--latest", action="store_true", help="print the last completed report instead of running one")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the report (default 300)")
    p.set_defaults(func=cmd_report)


def main(argv: list[str] | None = None, settings: Settings | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tideplane")
    add_cost_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args, settings or load_settings())


if __name__ == "__main__":
    sys.exit(main())
