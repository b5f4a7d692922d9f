"""``tideplane quotas apply FILE`` and ``tideplane quotas usage``: per-tenant token quotas and the tokens metered.

``apply`` validates the file (errors name the field), keeps the route's Temporal Schedule
(``token-quotas/<namespace>/<route>``: ApplyTokenQuotas with the file every ``--every-minutes``,
so a tenant that spends its monthly quota is cut off within that and let back in when the month
turns) and the daily TokenMetering schedule, then runs ApplyTokenQuotas once and prints what it did.
Applying the same file again changes nothing. ``usage`` runs a TokenMetering now and prints its
table, or with ``--latest`` prints the last completed one's (the daily schedule's or anyone's).

workers/cli/main.py wires these in with ``add_quotas_commands(subparsers)``; each sets
``func(args, settings) -> int``. ``python -m workers.cli.quotas ...`` runs them on their own.
"""

from __future__ import annotations

from workers.cli.errors import FAILED, report
import argparse
import asyncio
import sys
from datetime import timedelta
from pathlib import Path

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)

from workers.cli.reports import print_report, run_now, window_hours
from workers.cli.temporal_schedules import apply_schedule, fingerprinted
from workers.cli.model_files import load_model_file
from workers.client import connect
from workers.config import Settings, load_settings
from workflows.core import naming
from workflows.quotas.policy import QuotaFile, QuotaInput
from workflows.quotas.workflow import (
    ApplyTokenQuotas,
    QuotaResult,
    TokenMetering,
    TokenMeteringInput,
    TokenMeteringResult,
    token_metering_schedule,
)


class QuotaFileError(ValueError):
    """The quota file is invalid; the message names the field."""


def load_quota_file(path: Path) -> QuotaFile:
    """YAML or JSON; errors name the field, e.g. ``tenants.0.monthly_tokens``."""
    return load_model_file(path, QuotaFile, "quota file", QuotaFileError)


def quota_schedule(quotas: QuotaFile, task_queue: str, every_minutes: int) -> Schedule:
    """ApplyTokenQuotas with the file every ``every_minutes``; runs never overlap, a missed one is not caught up
    (the next one reads the month's usage anew)."""
    sid = naming.quota_schedule_id(quotas.namespace, quotas.route)
    return fingerprinted(Schedule(
        action=ScheduleActionStartWorkflow(ApplyTokenQuotas.run, QuotaInput(quotas=quotas), id=naming.scheduled_workflow_id(sid),
                                           task_queue=task_queue, static_summary=f"token quotas of {quotas.namespace}/{quotas.route}"),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(minutes=every_minutes))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=timedelta(minutes=every_minutes)),
    ))


async def apply(client: Client, quotas: QuotaFile, task_queue: str, every_minutes: int, timeout: float
                ) -> tuple[list[tuple[str, str]], QuotaResult]:
    """Reconcile the schedules, then apply the quotas now: ((schedule id, outcome), ...), the run's result."""
    schedules = {
        naming.quota_schedule_id(quotas.namespace, quotas.route): quota_schedule(quotas, task_queue, every_minutes),
        naming.TOKEN_METERING_SCHEDULE_ID: fingerprinted(token_metering_schedule(TokenMeteringInput(), task_queue)),
    }
    outcomes = [(sid, await apply_schedule(client, sid, schedule)) for sid, schedule in schedules.items()]
    result = await run_now(client, ApplyTokenQuotas.run, QuotaInput(quotas=quotas),
                           naming.quota_schedule_id(quotas.namespace, quotas.route), task_queue, timeout)
    return outcomes, result


def cmd_apply(args, config: Settings) -> int:
    try:
        quotas = load_quota_file(args.file)
    except QuotaFileError as exc:
        report(f"{exc}", FAILED)
        return 2

    async def run():
        return await apply(await connect(config), quotas, config.task_queue, args.every_minutes, args.timeout)

    try:
        outcomes, result = asyncio.run(run())
    except TimeoutError as exc:
        report(f"{exc}", FAILED)
        return 1
    for sid, outcome in outcomes:
        print(f"{outcome:9} schedule {sid}")
    print(f"{result.outcome:9} BackendTrafficPolicy {result.policy}")
    for tenant in quotas.tenants:
        used = result.month_tokens.get(tenant.name, 0.0)
        state = "REFUSED (monthly quota spent)" if tenant.name in result.over_quota else "served"
        print(f"  {tenant.name:24} {used:>14,.0f} of {tenant.monthly_tokens:>14,} tokens this month, "
              f"{tenant.tokens_per_minute:,}/min: {state}")
    return 0


def cmd_usage(args, config: Settings) -> int:
    return print_report(args, config, TokenMetering.run, TokenMeteringInput(window_hours=args.window_hours), "TokenMetering",
                        TokenMeteringResult,
                        "token-metering", "tideplane quotas usage")


def add_quotas_commands(subparsers) -> None:
    """Add ``quotas apply FILE`` and ``quotas usage`` to the tideplane CLI's subparsers."""
    quotas = subparsers.add_parser("quotas", help="per-tenant token quotas at the gateway, and the tokens metered")
    sub = quotas.add_subparsers(dest="quotas_command", required=True)
    p = sub.add_parser("apply", help="make a route's per-tenant token quotas what a YAML/JSON file declares, and keep them applied")
    p.add_argument("file", type=Path)
    p.add_argument("--every-minutes", type=int, default=5, choices=range(1, 61), metavar="1..60",
                   help="how often the monthly quotas are checked against the metered tokens (default 5)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the first apply (default 120)")
    p.set_defaults(func=cmd_apply)
    p = sub.add_parser("usage", help="run a TokenMetering now and print tokens per tenant, version and class (or --latest)")
    p.add_argument("--window-hours", type=window_hours, default=24.0, help="the window ending now, in hours (0 < h <= 744; default 24)")
    p.add_argument("--latest", action="store_true", help="print the last completed metering instead of running one")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300)")
    p.set_defaults(func=cmd_usage)


def main(argv: list[str] | None = None, settings: Settings | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tideplane")
    add_quotas_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args, settings or load_settings())


if __name__ == "__main__":
    sys.exit(main())
