"""``tideplane cost report``: the CostReport's Markdown table on the terminal.

The report is a workflow (workflows/cost/report.py) whose result holds the table and its Markdown;
this runs one now (a worker must be polling) and prints the Markdown, or with ``--latest`` prints
the last completed run's (the daily schedule's or anyone's) without running anything.

workers/cli/main.py wires it in with ``add_cost_commands(subparsers)``; the subcommand sets
``func(args, settings) -> int``: the CLI builds the Settings once and passes them.
``python -m workers.cli.cost cost report`` runs it on its own.
"""

from __future__ import annotations

import argparse
import sys

from workers.cli.reports import print_report, window_hours
from workers.config import Settings, load_settings
from workflows.cost.report import CostReport, CostReportInput, CostReportResult


def cmd_report(args, config: Settings) -> int:
    return print_report(args, config, CostReport.run, CostReportInput(window_hours=args.window_hours), "CostReport", CostReportResult,
                        "cost-report", "tideplane cost report")


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
