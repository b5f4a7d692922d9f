"""Report workflows run from the command line: one run now (a worker must be polling) and its
``markdown`` printed, or the last completed run's (``--latest``); the cost report (cost.py) and the
token usage report (quotas.py) are printed so."""

from __future__ import annotations

import argparse

from workers.cli.errors import FAILED, report
import asyncio
import sys
from datetime import datetime, timezone

from temporalio.client import Client

from workers.client import connect
from workers.config import Settings


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
        report(f"{exc}", FAILED)
        return 1
    if result is None:
        report(f"no completed {workflow_type} yet (run `{command}`, or wait for the daily schedule)", FAILED)
        return 1
    print(result.markdown)
    return 0


def window_hours(text: str) -> float:
    """--window-hours within what CostReportInput accepts (0 < h <= 744), said by argparse."""
    try:
        hours = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of hours, got {text!r}") from None
    if not 0 < hours <= 24 * 31:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 744 (31 days), got {text}")
    return hours
