"""``tideplane schedules apply FILE`` / ``delete DEPLOYMENT`` / ``list``: floor profiles as Temporal Schedules.

Each floor entry of the file becomes one Schedule (calendar spec in the profile's time zone,
overlap SKIP) whose action starts ScheduleFloor, which sets the floor of the deployment's
ReactiveScaling loop; a ``prewarm`` block becomes a Schedule of PredictivePrewarm. Applying
reconciles: the file declares every floor and pre-warm schedule of the Temporal namespace, so
schedules are created, updated in place, left alone when unchanged (a fingerprint of what the file
declares rides in the action's memo), and tideplane's schedules the file does not declare are
deleted. ``tideplane schedules delete DEPLOYMENT`` removes one deployment's.

workers/cli/main.py wires these in with ``add_schedules_commands(subparsers)``; each subcommand sets
``func(args, settings) -> int``: the CLI builds the Settings once and passes them.
``python -m workers.cli.scaling ...`` runs them on their own.
"""

from __future__ import annotations

from workers.cli.errors import FAILED, report
import argparse
import asyncio
import json
import sys
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleCalendarSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleSpec,
)
from temporalio.service import RPCError, RPCStatusCode

from workers.cli.model_files import load_model_file
from workers.cli.temporal_schedules import apply_schedule, delete_schedule, fingerprinted
from workers.client import connect
from workers.config import Settings, load_settings
from workflows.core import naming
from workflows.scaling.decide import ScalingPolicy
from workflows.scaling.floors import FloorEntry, ScheduleFile, ScheduleFloor, ScheduleFloorInput
from workflows.scaling.prewarm import PredictivePrewarm, PrewarmInput


# A floor missed while the server or worker was down still applies if caught up within this.
CATCHUP = timedelta(hours=1)


class ScheduleFileError(ValueError):
    """The schedule file is invalid; the message names the field or time zone."""


def load_schedule_file(path: Path) -> ScheduleFile:
    return load_model_file(path, ScheduleFile, "schedule file", ScheduleFileError)


def _temporal_weekday(weekday: int) -> int:
    """Python's Monday = 0 to Temporal's Sunday = 0."""
    return (weekday + 1) % 7


def floor_spec(entry: FloorEntry, time_zone: str) -> ScheduleSpec:
    if len(entry.weekdays) == 7:
        days = [ScheduleRange(0, 6)]
    else:
        days = [ScheduleRange(_temporal_weekday(d)) for d in entry.weekdays]
    calendar = ScheduleCalendarSpec(
        second=[ScheduleRange(0)],
        minute=[ScheduleRange(entry.minute)],
        hour=[ScheduleRange(entry.hour)],
        day_of_week=days,
        comment=f"floor {entry.replicas} at {entry.at} {','.join(entry.days)}",
    )
    return ScheduleSpec(calendars=[calendar], time_zone_name=time_zone)


def desired_schedules(file: ScheduleFile, task_queue: str) -> dict[str, Schedule]:
    """Schedule ID -> Schedule for everything the file declares."""
    out: dict[str, Schedule] = {}
    for item in file.schedules:
        tz = file.zone_of(item)
        for entry in item.floors:
            sid = naming.floor_schedule_id(item.deployment, entry.key)
            out[sid] = fingerprinted(Schedule(
                action=ScheduleActionStartWorkflow(
                    ScheduleFloor.run,
                    ScheduleFloorInput(deployment=item.deployment, replicas=entry.replicas),
                    id=naming.scheduled_workflow_id(sid),
                    task_queue=task_queue,
                    static_summary=f"floor {entry.replicas} for {item.deployment} ({entry.at} {tz})",
                ),
                spec=floor_spec(entry, tz),
                policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=CATCHUP),
            ))
        if item.prewarm is not None:
            p = item.prewarm
            sid = naming.prewarm_schedule_id(item.deployment)
            out[sid] = fingerprinted(Schedule(
                action=ScheduleActionStartWorkflow(
                    PredictivePrewarm.run,
                    PrewarmInput(
                        deployment=item.deployment,
                        time_zone=tz,
                        weeks=p.weeks,
                        startup_seconds=p.startup_seconds,
                        quantile=p.quantile,
                        ttl_seconds=2 * 60 * p.every_minutes,
                        sizing=ScalingPolicy() if p.replica_capacity_rps is None else ScalingPolicy(replica_capacity_rps=p.replica_capacity_rps),
                    ),
                    id=naming.scheduled_workflow_id(sid),
                    task_queue=task_queue,
                ),
                spec=ScheduleSpec(
                    calendars=[ScheduleCalendarSpec(second=[ScheduleRange(0)], minute=[ScheduleRange(0, 59, p.every_minutes)], hour=[ScheduleRange(0, 23)])],
                    time_zone_name=tz,
                ),
                policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=CATCHUP),
            ))
    return out


async def _ids_with_prefix(client: Client, prefixes: list[str]) -> list[str]:
    return [s.id async for s in await client.list_schedules() if any(s.id.startswith(p + "/") or s.id == p for p in prefixes)]


TIDEPLANE_PREFIXES = [naming.FLOOR_SCHEDULE_PREFIX, naming.PREWARM_SCHEDULE_PREFIX]


async def apply(client: Client, file: ScheduleFile, task_queue: str) -> list[tuple[str, str]]:
    """Reconcile tideplane's schedules with the file: (id, created | updated | unchanged | deleted).

    An update keeps the schedule's state (a pause set with the temporal CLI stays).
    """
    wanted = desired_schedules(file, task_queue)
    outcomes = [(sid, await apply_schedule(client, sid, schedule)) for sid, schedule in wanted.items()]
    for sid in await _ids_with_prefix(client, TIDEPLANE_PREFIXES):
        if sid not in wanted and await delete_schedule(client, sid):
            outcomes.append((sid, "deleted"))
    return outcomes


async def delete_deployment(client: Client, deployment: str) -> list[str]:
    """Delete every floor and pre-warm schedule of ``deployment``; the IDs deleted."""
    prefixes = [naming.schedule_prefix(kind, deployment) for kind in TIDEPLANE_PREFIXES]
    return [sid for sid in await _ids_with_prefix(client, prefixes) if await delete_schedule(client, sid)]


async def describe_all(client: Client) -> list[dict]:
    """Every tideplane floor/pre-warm schedule with its action and next run in local time."""
    rows = []
    for sid in sorted(await _ids_with_prefix(client, TIDEPLANE_PREFIXES)):
        try:
            desc = await client.get_schedule_handle(sid).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # deleted; the list lags behind
                continue
            raise
        spec = desc.schedule.spec
        tz = spec.time_zone_name or "UTC"
        comment = spec.calendars[0].comment if spec.calendars else ""
        nxt = desc.info.next_action_times[0].astimezone(ZoneInfo(tz)) if desc.info.next_action_times else None
        rows.append(
            {
                "id": sid,
                "time_zone": tz,
                "what": comment or "predictive pre-warm",
                "next": nxt.isoformat(timespec="minutes") if nxt else "-",
                "paused": desc.schedule.state.paused,
            }
        )
    return rows


def cmd_apply(args, config: Settings) -> int:
    try:
        file = load_schedule_file(args.file)
    except ScheduleFileError as exc:
        report(f"{exc}", FAILED)
        return 2

    async def run():
        return await apply(await connect(config), file, config.task_queue)

    for sid, outcome in asyncio.run(run()):
        print(f"{outcome:9} {sid}")
    return 0


def cmd_list(args, config: Settings) -> int:

    async def run():
        return await describe_all(await connect(config))

    rows = asyncio.run(run())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'SCHEDULE':44} {'TIME ZONE':18} {'NEXT (local)':18} WHAT")
    for r in rows:
        print(f"{r['id']:44} {r['time_zone']:18} {r['next'][:16]:18} {r['what']}{' (paused)' if r['paused'] else ''}")
    return 0


def cmd_delete(args, config: Settings) -> int:
    try:
        naming.split_deployment(args.deployment)
    except ValueError as exc:
        report(f"{exc}", FAILED)
        return 2

    async def run():
        return await delete_deployment(await connect(config), args.deployment)

    deleted = asyncio.run(run())
    for sid in deleted:
        print(f"{'deleted':9} {sid}")
    if not deleted:
        print(f"no floor or pre-warm schedules for {args.deployment}")
    return 0


def add_schedules_commands(subparsers) -> None:
    """Add ``schedules apply FILE``, ``schedules delete DEPLOYMENT`` and ``schedules list`` to the tideplane CLI's subparsers."""
    schedules = subparsers.add_parser("schedules", help="time-of-day floors and predictive pre-warm as Temporal Schedules")
    sub = schedules.add_subparsers(dest="schedules_command", required=True)
    p = sub.add_parser("apply", help="make tideplane's schedules what a YAML/JSON file declares (creates, updates, deletes the undeclared)")
    p.add_argument("file", type=Path)
    p.set_defaults(func=cmd_apply)
    p = sub.add_parser("delete", help="delete one deployment's floor and pre-warm schedules")
    p.add_argument("deployment", help="NAMESPACE/NAME")
    p.set_defaults(func=cmd_delete)
    p = sub.add_parser("list", help="the floor and pre-warm schedules with their next run")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)


def main(argv: list[str] | None = None, settings: Settings | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tideplane")
    add_schedules_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args, settings or load_settings())


if __name__ == "__main__":
    sys.exit(main())
