"""``tideplane registry ...``: register, list, show, deprecate, run or schedule retention.

workers/cli/main.py wires these in with ``add_registry_commands(subparsers)``; every subcommand sets
``func(args, settings) -> int``: the CLI builds the Settings once and passes them.
``python -m workers.cli.registry ...`` runs them on their own. The registry itself is
``activities.registry.Registry``, the same store the worker's activities use.
"""

from __future__ import annotations

from workers.cli.errors import FAILED, report
import argparse
import asyncio
import sys
from datetime import datetime, timezone
from pathlib import Path

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
)

from activities.clients.s3 import S3Client
from activities.registry.store import Registry, RegistryError
from workers.cli.progress import ProgressLine
from workflows.core.transfer import size
from workers.cli.wording import counted
from workers.client import connect
from workers.config import Settings, load_settings
from workflows.core.naming import RETENTION_SCHEDULE_ID, RETENTION_WORKFLOW_ID
from workflows.registry.retention import RegistryRetention, RetentionInput, RetentionResult, render_plan
from workflows.registry.schema import ANY_DEPLOYMENT, AdapterOf, parse_quantization, parse_ref


def open_registry(settings: Settings) -> Registry:
    """The registry in the configured weights bucket."""
    return Registry(
        S3Client(settings.aws_endpoint_url, settings.aws_region),
        settings.weights_bucket,
        allowed_buckets=settings.weights_buckets,
    )


def _status(status) -> str:
    if status.state == "canary":
        return f"canary {status.percent}% since {status.since:%Y-%m-%d %H:%M}"
    if status.state in ("stable", "deprecated"):
        return f"{status.state} since {status.since:%Y-%m-%d %H:%M}"
    return status.state


def _ref(text: str, need_version: bool) -> tuple[str, str | None]:
    try:
        model, version = parse_ref(text)
    except ValueError as exc:
        raise SystemExit(f"tideplane: error: {exc}") from None
    if need_version and version is None:
        raise SystemExit(f"tideplane: error: expected MODEL@VERSION, got {text!r}")
    return model, version


def cmd_register(args, settings: Settings) -> int:
    model, version = _ref(args.ref, need_version=True)
    try:
        quant = parse_quantization(args.quantization)
    except ValueError as exc:
        raise SystemExit(f"tideplane: error: --quantization: {exc}") from None
    adapter = None
    if args.base:
        base_model, base_version = _ref(args.base, need_version=True)
        adapter = AdapterOf(base_model=base_model, base_version=base_version)
    progress = ProgressLine(f"register {args.ref}", _register_bytes(args.source))
    try:
        manifest = open_registry(settings).register(
            model, version, args.source, quant, args.image, progress=progress, adapter=adapter
        )
    finally:
        progress.close()
    what = f"LoRA adapter of {manifest.adapter.base_ref}" if manifest.adapter else ""
    print(f"registered {manifest.ref}: {counted(len(manifest.weights.files), 'file')}, {size(manifest.weights.size_bytes)}"
          + (f", {what}" if what else ""))
    print(f"  location {manifest.weights.location}\n  digest   {manifest.weights.digest}")
    return 0


def _register_bytes(source: str) -> int | None:
    """What a register reads: local files twice (checksum, then upload); s3:// sizes are unknown upfront."""
    root = Path(source)
    if source.startswith("s3://") or not root.exists():
        return None
    files = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else [root]
    return 2 * sum(p.stat().st_size for p in files)


def cmd_list(args, settings: Settings) -> int:
    versions = open_registry(settings).list_versions([args.model] if args.model else None)
    print(f"{'MODEL':24} {'VERSION':16} {'SIZE':>10} {'QUANT':12} STATUS")
    for v in versions:
        gone = " (weights deleted)" if v.weights_deleted_at else ""
        where = "; ".join(
            f"{s.state}{f' {s.percent}%' if s.state == 'canary' else ''} on {d}"
            for d, s in sorted(v.deployments.items()) if d != ANY_DEPLOYMENT
        )
        where = f" ({where})" if where else ""
        print(f"{v.model:24} {v.version:16} {size(v.size_bytes):>10} {v.quantization:12} {_status(v.status)}{where}{gone}")
    return 0


def cmd_show(args, settings: Settings) -> int:
    model, version = _ref(args.ref, need_version=False)
    registry = open_registry(settings)
    if version is None:
        args.model = model
        return cmd_list(args, settings)
    manifest = registry.resolve(model, version, verify=True) if args.verify else registry.show(model, version)
    print(manifest.model_dump_json(indent=2))
    if args.verify:
        print(f"verified: every file matches its sha256 (set digest {manifest.weights.digest})", file=sys.stderr)
    return 0


def cmd_deprecate(args, settings: Settings) -> int:
    model, version = _ref(args.ref, need_version=True)
    manifest = open_registry(settings).deprecate(model, version, args.reason)
    print(f"{manifest.ref}: {_status(manifest.status)}")
    return 0


def retention_schedule(task_queue: str, hour: int = 3, minute: int = 0) -> Schedule:
    """Daily RegistryRetention; a run still going when the next is due makes the next skip."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RegistryRetention.run, RetentionInput(), id=RETENTION_WORKFLOW_ID, task_queue=task_queue
        ),
        spec=ScheduleSpec(cron_expressions=[f"{minute} {hour} * * *"]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_retention_schedule(client: Client, task_queue: str, hour: int = 3, minute: int = 0) -> str:
    """Create the daily retention schedule, or bring an existing one up to date: "created" | "updated"."""
    schedule = retention_schedule(task_queue, hour, minute)
    try:
        await client.create_schedule(RETENTION_SCHEDULE_ID, schedule)
        return "created"
    except ScheduleAlreadyRunningError:
        await client.get_schedule_handle(RETENTION_SCHEDULE_ID).update(lambda _: ScheduleUpdate(schedule=schedule))
        return "updated"


def cmd_schedule(args, settings: Settings) -> int:
    async def run() -> str:
        return await ensure_retention_schedule(await connect(settings), settings.task_queue, args.hour, args.minute)

    outcome = asyncio.run(run())
    print(f"schedule {RETENTION_SCHEDULE_ID} {outcome}: RegistryRetention daily at {args.hour:02d}:{args.minute:02d} UTC")
    return 0


def cmd_retention(args, settings: Settings) -> int:
    req = RetentionInput(dry_run=args.dry_run, deprecated_days=args.deprecated_days, rollback_days=args.rollback_days)

    async def run() -> RetentionResult:
        client = await connect(settings)
        workflow_id = f"{RETENTION_WORKFLOW_ID}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
        return await client.execute_workflow(RegistryRetention.run, req, id=workflow_id, task_queue=settings.task_queue)

    result = asyncio.run(run())
    print(render_plan(sorted([*result.deleted, *result.kept], key=lambda d: (d.model, d.version)), result.dry_run))
    verb = "would free" if result.dry_run else "freed"
    print(f"\n{len(result.deleted)} deleted, {len(result.kept)} kept, {verb} {size(result.freed_bytes)}")
    return 0


def answering_registry_errors(func):
    """Registry errors (unknown version, checksum mismatch...) exit 1 with the message."""

    def run(args, settings: Settings) -> int:
        try:
            return func(args, settings)
        except RegistryError as exc:
            report(f"{exc}", FAILED)
            return 1

    return run


def add_registry_commands(subparsers) -> argparse._SubParsersAction:
    """Add ``registry`` and its subcommands to the tideplane CLI's subparsers; the registry's own
    subparsers come back (``registry golden`` is added there: workers/cli/quality.py)."""
    registry = subparsers.add_parser("registry", help="model registry: versions, checksums, status, retention")
    sub = registry.add_subparsers(dest="registry_command", required=True)

    p = sub.add_parser("register", help="register MODEL@VERSION from local files or s3:// weights")
    p.add_argument("ref", metavar="MODEL@VERSION")
    p.add_argument("source", help="a local file or directory (uploaded), or s3://bucket/prefix/ (checksummed in place)")
    p.add_argument("--quantization", default="none", help="none | gguf:Q4_K_M | awq:4 | gptq:4 (default none)")
    p.add_argument("--image", help="serving image the version was validated with")
    p.add_argument("--base", metavar="MODEL@VERSION", help="the files are a LoRA adapter of this registered base model version")
    p.set_defaults(func=answering_registry_errors(cmd_register))

    p = sub.add_parser("list", help="every model's versions and status (reads only the indexes)")
    p.add_argument("model", nargs="?")
    p.set_defaults(func=answering_registry_errors(cmd_list))

    p = sub.add_parser("show", help="MODEL: its versions; MODEL@VERSION: the manifest")
    p.add_argument("ref", metavar="MODEL[@VERSION]")
    p.add_argument("--verify", action="store_true", help="stream every weights file and check its sha256")
    p.set_defaults(func=answering_registry_errors(cmd_show))

    p = sub.add_parser("deprecate", help="mark MODEL@VERSION deprecated (retention deletes it after 30 days)")
    p.add_argument("ref", metavar="MODEL@VERSION")
    p.add_argument("--reason", default="deprecated by hand")
    p.set_defaults(func=answering_registry_errors(cmd_deprecate))

    p = sub.add_parser("retention", help="run RegistryRetention now and print what it deleted and kept")
    p.add_argument("--dry-run", action="store_true", help="print the plan, delete nothing")
    p.add_argument("--deprecated-days", type=float, default=30)
    p.add_argument("--rollback-days", type=float, default=7)
    p.set_defaults(func=answering_registry_errors(cmd_retention))

    p = sub.add_parser("schedule", help="create or update the daily RegistryRetention schedule")
    p.add_argument("--hour", type=int, default=3, choices=range(24), metavar="0-23", help="UTC hour (default 3)")
    p.add_argument("--minute", type=int, default=0, choices=range(60), metavar="0-59")
    p.set_defaults(func=answering_registry_errors(cmd_schedule))
    return sub


def main(argv: list[str] | None = None, settings: Settings | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tideplane")
    add_registry_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args, settings or load_settings())


if __name__ == "__main__":
    sys.exit(main(["registry", *sys.argv[1:]]))
