"""``tideplane rollout``: start, watch and steer a ModelRollout from the terminal, as a
``kubectl argo rollouts`` user expects.

Every command sends what a ``temporal`` user sends (docs/reference.md#modelrollout): ``start`` is
``temporal workflow start`` with the input validated here first against the same pydantic model
(``apply`` the same for each spec that changed, after an ``abort`` of the run it supersedes);
``pause``/``resume``/``abort`` are the signals, ``promote`` the update, ``get`` and ``status`` the
``status`` and ``result`` queries, so the two clients stay interchangeable. ``NAME`` is the
deployment, ``NAMESPACE/NAME`` (the workflow ID ``rollout/NAMESPACE/NAME``).

``status`` exits 0 promoted, 1 rolled back or aborted (or failed), 2 paused, 3 still running
(``--timeout`` waits that long for an end or a pause first). ``get --watch`` redraws in place on a
terminal and prints one line per change otherwise; the demo follows its rollouts with the same
renderer (``render``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import datetime, timezone
from collections.abc import Awaitable, Callable
from typing import Any, TextIO
from pathlib import Path

from pydantic import BaseModel, ValidationError
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from workers.cli.progress import progress_text
from workers.cli.errors import CliError, out_format, print_data, read_spec
from workers.client import connect
from workers.config import Settings
from workflows.core.naming import TASK_QUEUE, rollout_workflow_id, workflow_link
from workflows.core.transfer import DownloadProgress, rate
from workflows.rollout.contract import STAGE_WEIGHTS
from workflows.rollout.types import AbortInput, PauseInput, PromoteInput, RolloutInput, RolloutResult, RolloutStatus, Stage
from workflows.rollout.client import rollout_result, start_rollout

DEFAULT_UI = "http://localhost:8233"
POLL_SECONDS = 1.0
# `tideplane rollout status` exit codes (docs/reference.md)
PROMOTED, FAILED, PAUSED, RUNNING = 0, 1, 2, 3


# ---- rendering (pure: a status and a result in, lines out) -----------------------------------


def ladder(status: RolloutStatus) -> str:
    """``1 → [5] → 50 → 100``: the ladder with the current step in brackets."""
    parts = []
    for index, weight in enumerate(status.steps):
        current = status.step == index and status.stage in (Stage.CANARY, Stage.PAUSED)
        parts.append(f"[{weight}]" if current else str(weight))
    return " → ".join(parts)


def heartbeat_progress(details: dict, seconds: float) -> DownloadProgress | None:
    """The download's progress from stage_weights' heartbeat (bytes_done, bytes_total,
    bytes_per_second; without a rate, bytes_done over the ``seconds`` its attempt has run); None
    without byte counts."""
    try:
        progress = DownloadProgress.model_validate(details)
    except ValidationError:
        return None
    if progress.bytes_total <= 0:
        return None
    if "bytes_per_second" not in details:  # heartbeats from before the rate was in them
        progress.bytes_per_second = rate(progress.bytes_done, seconds)
    return progress


def download_line(progress: DownloadProgress) -> str:
    """``download [#####...............] 4.0 GiB of 16.0 GiB (25 %)  40.0 MiB/s  ETA 5m07s``, with
    the time of a report the rollout received (its heartbeat line has none: it is fresh)."""
    at = f"  (at {progress.reported_at:%H:%M:%S})" if progress.reported_at else ""
    return f"download {progress_text(progress.bytes_done, progress.bytes_total, progress.bytes_per_second)}{at}"


def render(
    status: RolloutStatus | None, result: RolloutResult | None = None, state: str | None = None,
    download: DownloadProgress | None = None,
) -> list[str]:
    """What ``get`` shows: stage, ladder, weights, replicas, each gate's value against its threshold,
    the last verdict, the pause reason, pre-staging progress and, once ended, the outcome."""
    if status is None:
        return ["waiting for the first workflow task (is a worker polling the tideplane task queue?)"]
    head = f"{status.deployment}  {status.version}  stage {status.stage.value}"
    if state and state != "RUNNING":
        head += f"  ({state.lower()})"
    lines = [head, f"ladder   {ladder(status)} %"]
    weights = {status.version: status.weight}
    if status.stable_version:
        weights = {status.stable_version: 100 - status.weight, **weights}
    lines.append("weights  " + ", ".join(f"{v} {w} %" for v, w in weights.items()))
    if status.replicas:
        lines.append("replicas " + ", ".join(f"{v} {n}" for v, n in status.replicas.items()))
    if status.paused:
        lines.append(f"PAUSED   {status.pause_reason}  (tideplane rollout resume|promote --force|abort)")
    verdict = status.last_verdict
    if verdict is not None:
        ev = verdict.evaluation
        lines.append(f"verdict  {ev.verdict.value} at {verdict.weight} % ({verdict.at:%H:%M:%S}){': ' + ev.reason if ev.reason else ''}")
        for check in ev.checks:
            mark = "ok  " if check.passed else "FAIL"
            lines.append(f"  {mark} {check.gate:<20} {check.value:>10.4g}  vs {check.threshold:.4g}")
        for gate in ev.missing:
            lines.append(f"  ??   {gate:<20} no data")
        a = status.analysis
        lines.append(f"step     {a.passes} pass, {a.failures} fail, {a.inconclusives} inconclusive, {a.errors} metric errors")
    for verdict_of in (status.golden, status.shadow):
        if verdict_of is not None:
            lines.append(verdict_of.describe())
    if status.stage is Stage.STAGING:
        download = download or status.download  # the heartbeat unread: the rollout's last report
    if download is not None:
        lines.append(download_line(download))
    for node in status.nodes:
        lines.append(f"staging  {node.describe()}")
    if result is not None:
        lines.append(f"outcome  {result.outcome.value}: {result.reason}")
    return lines


def exit_code(status: RolloutStatus | None, result: RolloutResult | None, state: str) -> int:
    """0 promoted, 1 rolled back / aborted / failed, 2 paused, 3 running."""
    if result is not None:
        return PROMOTED if result.outcome.value == "promoted" else FAILED
    if state != "RUNNING":
        return FAILED  # failed before a result (bad input, nothing changed), cancelled, terminated
    return PAUSED if status is not None and status.paused else RUNNING


# ---- reading a rollout -----------------------------------------------------------------------


class Snapshot(BaseModel):
    workflow_id: str
    run_id: str | None
    state: str
    status: RolloutStatus | None
    result: RolloutResult | None
    download: DownloadProgress | None = None  # stage_weights' progress, from its last heartbeat

    @property
    def code(self) -> int:
        return exit_code(self.status, self.result, self.state)


async def snapshot(handle: WorkflowHandle) -> Snapshot:
    desc = await handle.describe()
    status = result = None
    try:
        status = await handle.query("status", result_type=RolloutStatus)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            result = await handle.query("result", result_type=RolloutResult | None)
    except RPCError:
        pass  # no workflow task yet, or a run from before the result query: status alone
    return Snapshot(workflow_id=handle.id, run_id=desc.run_id, state=desc.status.name if desc.status else "UNKNOWN",
                    status=status, result=result, download=_download(desc))


def _download(desc) -> DownloadProgress | None:
    """The weights download's progress from the pending stage_weights activity's heartbeat (plain
    JSON payloads only: an encrypted heartbeat stays unread here)."""
    for pending in desc.raw_description.pending_activities:
        if pending.activity_type.name != STAGE_WEIGHTS or not pending.heartbeat_details.payloads:
            continue
        payload = pending.heartbeat_details.payloads[-1]
        if payload.metadata.get("encoding") != b"json/plain":
            return None
        try:
            details = json.loads(payload.data)
        except ValueError:
            return None
        started = pending.last_started_time.ToDatetime(tzinfo=timezone.utc) if pending.HasField("last_started_time") else None
        seconds = (datetime.now(timezone.utc) - started).total_seconds() if started else 0.0
        return heartbeat_progress(details if isinstance(details, dict) else {}, seconds)
    return None


async def watch(
    handle: WorkflowHandle, stream: TextIO, until_paused: bool = False, timeout: float | None = None,
    each: Callable[[Snapshot], Awaitable[bool]] | None = None,
) -> Snapshot:
    """Redraw the view in place on a terminal (one block per change otherwise) until the run ends;
    ``each`` is awaited with every snapshot and returns True when it printed (the demo prints the
    web UI's current details from it)."""
    tty, drawn, shown = stream.isatty(), 0, None
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        snap = await snapshot(handle)
        lines = render(snap.status, snap.result, snap.state, snap.download)
        if lines != shown:
            if tty:
                stream.write(f"\x1b[{drawn}F\x1b[J" if drawn else "")
                stream.write("\n".join(lines) + "\n")
                drawn = len(lines)
            else:
                stream.write("\n".join(lines) + "\n---\n")
            stream.flush()
            shown = lines
        if each is not None and await each(snap):
            drawn = 0  # it printed below the view: redraw under what it printed
        if snap.state != "RUNNING" or (until_paused and snap.code == PAUSED):
            return snap
        if deadline is not None and time.monotonic() >= deadline:
            return snap
        await asyncio.sleep(POLL_SECONDS)


# ---- commands --------------------------------------------------------------------------------


def _config(args, config: Settings) -> Settings:
    update = {k: v for k, v in (("temporal_address", args.address), ("temporal_namespace", args.namespace)) if v}
    return config.model_copy(update=update) if update else config


def _deployment(name: str) -> str:
    if name.count("/") != 1 or not all(name.split("/")):
        raise CliError(f"NAME must be NAMESPACE/NAME of the deployment, got {name!r}", code=2)
    return name


def rollout_spec(args) -> RolloutInput:
    """The rollout input from FILE (YAML or JSON) and/or flags, validated as the workflow will."""
    spec: dict[str, Any] = read_spec(args.file) if args.file else {}
    for field in ("deployment", "model", "version", "image", "replicas"):
        if (value := getattr(args, field, None)) is not None:
            spec[field] = value
    return validated(spec)


def validated(spec: dict[str, Any], source: str = "") -> RolloutInput:
    """``spec`` as the workflow will read it; a usage error naming each wrong field otherwise."""
    try:
        return RolloutInput.model_validate(spec)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in exc.errors())
        raise CliError(f"{source}{': ' if source else ''}invalid rollout: {problems}", code=2) from None


async def _start(args, config: Settings) -> int:
    inp = rollout_spec(args)
    if args.dry_run:
        print(f"valid: {inp.model} {inp.version} to {inp.deployment}")
        return 0
    client = await connect(config)
    handle = await start_rollout(client, inp, task_queue=config.task_queue or TASK_QUEUE)
    print(f"started {handle.id} (run {handle.result_run_id})")
    print(workflow_link(args.ui_url, config.temporal_namespace, handle.id))
    return 0


SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def spec_files(paths: list[str]) -> list[str]:
    """The files named, a directory standing for its *.yaml, *.yml and *.json (sorted), as a
    GitOps job applies a folder of release specs."""
    files: list[str] = []
    for path in paths:
        folder = Path(path)
        if folder.is_dir():
            found = sorted(str(f) for f in folder.iterdir() if f.suffix in SPEC_SUFFIXES and f.is_file())
            if not found:
                raise CliError(f"{path}: no *.yaml, *.yml or *.json rollout spec in it", code=2)
            files += found
        else:
            files.append(path)
    return files


async def _apply(args, config: Settings) -> int:
    """Make each spec's deployment run that spec (``kubectl apply`` for rollouts): every file is
    validated before anything starts, and one deployment named twice is refused. A spec equal to
    the deployment's last run's input is left as it is, running or ended (applying again changes
    nothing; ``retry`` reruns a rolled-back one); a changed spec aborts a running rollout (which
    rolls back), waits for its end and starts the new one; no run yet starts one."""
    specs: dict[str, tuple[str, RolloutInput]] = {}
    for path in spec_files(args.files):
        inp = validated(read_spec(path), path)
        if inp.deployment in specs:
            raise CliError(f"{path}: deployment {inp.deployment} is also in {specs[inp.deployment][0]}", code=2)
        specs[inp.deployment] = (path, inp)
    client = await connect(config)
    queue = config.task_queue or TASK_QUEUE
    for deployment, (path, inp) in specs.items():
        handle = _handle(client, rollout_workflow_id(deployment))
        try:
            state = (await handle.describe()).status
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            state = None
        if state is not None and (await _last_input(handle, client)).model_dump() == inp.model_dump():
            print(f"{deployment}: unchanged ({state.name.lower()}, {path})")
            continue
        if state == WorkflowExecutionStatus.RUNNING:
            print(f"{deployment}: spec changed, aborting the running rollout (it rolls back) ...", flush=True)
            await handle.signal("abort", AbortInput(reason=f"superseded by {path} ({inp.model} {inp.version})"))
            try:
                ended = await asyncio.wait_for(rollout_result(handle), args.timeout)
            except asyncio.TimeoutError:
                raise CliError(f"{deployment}: the running rollout did not end within {args.timeout:.0f}s of its abort; "
                               "nothing new was started (apply again once it has)", code=1) from None
            print(f"{deployment}: previous rollout {ended.outcome.value}")
        new = await start_rollout(client, inp, task_queue=queue)
        print(f"{deployment}: {'superseded' if state == WorkflowExecutionStatus.RUNNING else 'started'} {new.id} "
              f"(run {new.result_run_id}) {workflow_link(args.ui_url, config.temporal_namespace, new.id)}")
    return 0


def _handle(client: Client, workflow_id: str) -> WorkflowHandle:
    return client.get_workflow_handle(workflow_id)


def _id(name: str) -> str:
    return rollout_workflow_id(_deployment(name))


async def _get(args, config: Settings) -> int:
    wid = _id(args.name)  # a bad NAME is a usage error before any connection
    handle = _handle(await connect(config), wid)
    if args.watch and args.output == "text":
        snap = await watch(handle, sys.stdout)
        return snap.code
    snap = await snapshot(handle)
    if args.output == "text":
        print("\n".join(render(snap.status, snap.result, snap.state, snap.download)))
    else:
        print_data(snap.model_dump(mode="json"), args.output)
    return 0


async def _status(args, config: Settings) -> int:
    wid = _id(args.name)  # a bad NAME is a usage error before any connection
    handle = _handle(await connect(config), wid)
    deadline = time.monotonic() + (args.timeout or 0)
    while True:
        snap = await snapshot(handle)
        if snap.code != RUNNING or time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_SECONDS)
    words = {PROMOTED: "promoted", FAILED: "not promoted", PAUSED: "paused", RUNNING: "running"}
    if args.output == "text":
        reason = snap.result.reason if snap.result else (snap.status.pause_reason if snap.status and snap.status.paused else "")
        stage = snap.status.stage.value if snap.status else snap.state.lower()
        print(f"{words[snap.code]} ({stage}){': ' + reason if reason else ''}")
    else:
        print_data({**snap.model_dump(mode="json"), "exit_code": snap.code, "summary": words[snap.code]}, args.output)
    return snap.code


async def _signal(args, config: Settings) -> int:
    wid = _id(args.name)  # a bad NAME is a usage error before any connection
    handle = _handle(await connect(config), wid)
    if args.rollout_command == "pause":
        await handle.signal("pause", PauseInput(reason=args.reason) if args.reason else PauseInput())
    elif args.rollout_command == "resume":
        await handle.signal("resume")
    else:
        await handle.signal("abort", AbortInput(reason=args.reason) if args.reason else AbortInput())
    print(f"{args.rollout_command} sent to {handle.id}")
    return 0


async def _promote(args, config: Settings) -> int:
    wid = _id(args.name)  # a bad NAME is a usage error before any connection
    handle = _handle(await connect(config), wid)
    ack = await handle.execute_update("promote", PromoteInput(full=args.full, force=args.force).model_dump())
    print(ack["accepted"] if isinstance(ack, dict) else ack)
    return 0


async def _last_input(handle: WorkflowHandle, client: Client) -> RolloutInput:
    history = await handle.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    (value,) = await client.data_converter.decode(started.input.payloads, [RolloutInput])
    return value


async def _retry(args, config: Settings) -> int:
    """Start the last run's input again (as ``kubectl argo rollouts retry``): refused while one runs."""
    wid = _id(args.name)
    client = await connect(config)
    handle = _handle(client, wid)
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        raise CliError(f"{handle.id} is still running: abort it first, or wait for its end", code=1)
    new = await start_rollout(client, await _last_input(handle, client), task_queue=config.task_queue or TASK_QUEUE)
    print(f"started {new.id} again (run {new.result_run_id})")
    print(workflow_link(args.ui_url, config.temporal_namespace, new.id))
    return 0


async def _history(args, config: Settings) -> int:
    wid = _id(args.name)
    client = await connect(config)
    runs = []
    async for run in client.list_workflows(f'WorkflowId = "{wid}"'):
        version = run.typed_search_attributes.get(_version_key()) if run.typed_search_attributes else None
        runs.append({"run_id": run.run_id, "version": version, "status": run.status.name if run.status else None,
                     "started": run.start_time.isoformat() if run.start_time else None,
                     "closed": run.close_time.isoformat() if run.close_time else None})
    if args.output == "text":
        for r in runs:
            print(f"{r['started'] or '':<33} {r['version'] or '?':<12} {r['status'] or '':<12} {r['run_id']}")
        if not runs:
            print(f"no runs of {wid}")
    else:
        print_data(runs, args.output)
    return 0


def _version_key():
    from workflows.core.search_attributes import VERSION

    return VERSION


COMMANDS = {"start": _start, "apply": _apply, "get": _get, "status": _status, "pause": _signal, "resume": _signal, "abort": _signal,
            "promote": _promote, "retry": _retry, "history": _history}


def cmd_rollout(args, config: Settings) -> int:
    return asyncio.run(COMMANDS[args.rollout_command](args, _config(args, config)))


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="Temporal frontend host:port (default: TEMPORAL_ADDRESS, else 127.0.0.1:7233)")
    p.add_argument("--namespace", help="Temporal namespace (default: TEMPORAL_NAMESPACE, else default)")


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", type=out_format, default="text", help="text (default), json or yaml")


def add_rollout_commands(subparsers) -> None:
    """Add ``rollout start|apply|get|status|pause|resume|promote|abort|retry|history``."""
    rollout = subparsers.add_parser("rollout", help="start, watch and steer a ModelRollout (kubectl argo rollouts style)")
    sub = rollout.add_subparsers(dest="rollout_command", required=True)

    p = sub.add_parser("start", help="validate a rollout spec here, then start it; prints the workflow ID and web UI link")
    p.add_argument("file", nargs="?", help="a RolloutInput as YAML or JSON (- reads stdin); flags override its fields")
    p.add_argument("--deployment", help="NAMESPACE/NAME")
    p.add_argument("--model")
    p.add_argument("--version", dest="version")
    p.add_argument("--image")
    p.add_argument("--replicas", type=int)
    p.add_argument("--dry-run", action="store_true", help="validate only; start nothing")
    p.add_argument("--ui-url", default=DEFAULT_UI, help=f"the Temporal web UI the link points at (default {DEFAULT_UI})")
    _connection(p)

    p = sub.add_parser("apply", help="make each spec's deployment run that spec: unchanged stays, a changed one supersedes (GitOps)")
    p.add_argument("files", nargs="+", metavar="FILE", help="RolloutInput specs (YAML or JSON); a directory applies its *.yaml, *.yml, *.json")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for a superseded rollout's rollback (default 1800)")
    p.add_argument("--ui-url", default=DEFAULT_UI, help=f"the Temporal web UI the link points at (default {DEFAULT_UI})")
    _connection(p)

    p = sub.add_parser("get", help="the rollout's ladder, gates, weights, replicas, verdict and weights download (bytes, rate, ETA)")
    p.add_argument("name", help="the deployment, NAMESPACE/NAME")
    p.add_argument("-w", "--watch", action="store_true", help="follow until the rollout ends (redrawn in place on a terminal)")
    _output(p)
    _connection(p)

    p = sub.add_parser("status", help="one line; exit 0 promoted, 1 rolled back/aborted, 2 paused, 3 running")
    p.add_argument("name", help="the deployment, NAMESPACE/NAME")
    p.add_argument("--timeout", type=float, default=0.0, help="seconds to wait for an end or a pause (default 0: answer now)")
    _output(p)
    _connection(p)

    for name, what in (("pause", "signal pause"), ("resume", "signal resume"), ("abort", "signal abort: roll back now")):
        p = sub.add_parser(name, help=what)
        p.add_argument("name", help="the deployment, NAMESPACE/NAME")
        if name != "resume":
            p.add_argument("--reason", help="why (shown in the status and the result)")
        _connection(p)

    p = sub.add_parser("promote", help="update promote: end the current step (--full: go to 100 %%)")
    p.add_argument("name", help="the deployment, NAMESPACE/NAME")
    p.add_argument("--full", action="store_true", help="skip every remaining step")
    p.add_argument("--force", action="store_true", help="promote a paused rollout (ends the pause)")
    _connection(p)

    p = sub.add_parser("retry", help="start the last run's input again (after a rollback or an abort)")
    p.add_argument("name", help="the deployment, NAMESPACE/NAME")
    p.add_argument("--ui-url", default=DEFAULT_UI, help=f"the Temporal web UI the link points at (default {DEFAULT_UI})")
    _connection(p)

    p = sub.add_parser("history", help="every run of the deployment's rollout, newest first")
    p.add_argument("name", help="the deployment, NAMESPACE/NAME")
    _output(p)
    _connection(p)
    for parser in sub.choices.values():
        parser.set_defaults(func=cmd_rollout)



