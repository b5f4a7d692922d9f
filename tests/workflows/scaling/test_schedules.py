"""`tideplane schedules apply/list` against a real Temporal dev server.

Checks that applying is idempotent and reconciles (unchanged, updated keeping a pause, deleted
when the file no longer declares it, `schedules: []` and `schedules delete`), that the server
fires each floor at the profile's local time (its next action times), that a schedule's action
really sets the loop's floor, that a bad time zone is refused by name, and that the CLI exits
cleanly after using Temporal.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from zoneinfo import ZoneInfo

import pytest
import pytest_asyncio
import yaml
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.servers import BIN
from tests.workflows.scaling.test_scaling import FakeDeployment
from workers.cli import scaling as schedules
from workers.config import Settings
from workflows.core import naming, search_attributes
from workflows.scaling.floors import ScheduleFloor
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput
from workflows.scaling.prewarm import PredictivePrewarm

TZ = "Asia/Tokyo"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def dev_env():
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        data_converter=pydantic_data_converter,
        search_attributes=list(search_attributes.ALL),
        ui=False,
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def cli_settings(dev_env) -> Settings:
    """What `tideplane` reads from the environment, pointed at the dev server."""
    return Settings(temporal_address=dev_env.client.service_client.config.target_host)


def profile(deployment: str, floors: list[dict], time_zone: str = TZ, prewarm: dict | None = None) -> dict:
    entry = {"deployment": deployment, "floors": floors}
    if prewarm:
        entry["prewarm"] = prewarm
    return {"time_zone": time_zone, "schedules": [entry]}


FLOORS = [
    {"at": "08:50", "replicas": 6, "days": ["weekdays"]},
    {"at": "09:00", "replicas": 8, "days": ["weekdays"]},
    {"at": "21:00", "replicas": 3},
    {"at": "02:00", "replicas": 1},
]


async def ids_for(client, deployment: str, expected: int) -> set[str]:
    """Schedule list is eventually consistent: wait until it shows ``expected`` of this deployment's."""
    _, name = naming.split_deployment(deployment)
    for _ in range(100):
        ids = {r["id"] for r in await schedules.describe_all(client) if f"/{name}" in r["id"]}
        if len(ids) == expected:
            return ids
        await asyncio.sleep(0.1)
    raise AssertionError(f"schedules of {deployment}: {ids}, expected {expected}")


async def test_apply_is_idempotent_and_fires_at_local_times(dev_env, tmp_path):
    client = dev_env.client
    deployment = f"llm-serving/c{uuid.uuid4().hex[:6]}"
    path = tmp_path / "floors.yaml"
    path.write_text(yaml.safe_dump(profile(deployment, FLOORS, prewarm={"every_minutes": 15})))
    file = schedules.load_schedule_file(path)

    first = await schedules.apply(client, file, "tq")
    assert sorted(o for _, o in first) == ["created"] * 5
    ids = await ids_for(client, deployment, 5)
    second = await schedules.apply(client, file, "tq")
    assert sorted(o for _, o in second) == ["unchanged"] * 5
    assert await ids_for(client, deployment, 5) == ids

    rows = {r["id"]: r for r in await schedules.describe_all(client) if r["id"] in ids}
    _, name = naming.split_deployment(deployment)
    for entry in file.schedules[0].floors:
        sid = f"floor/llm-serving/{name}/{entry.key}"
        desc = await client.get_schedule_handle(sid).describe()
        for when in desc.info.next_action_times[:3]:
            local = when.astimezone(ZoneInfo(TZ))
            assert (local.hour, local.minute) == (entry.hour, entry.minute)
            assert local.weekday() in entry.weekdays
        assert rows[sid]["time_zone"] == TZ and f"floor {entry.replicas}" in rows[sid]["what"]
        assert desc.schedule.policy.overlap.name == "SKIP"

    # dropping an entry from the file deletes its schedule
    path.write_text(yaml.safe_dump(profile(deployment, FLOORS[1:])))
    outcomes = dict(await schedules.apply(client, schedules.load_schedule_file(path), "tq"))
    assert outcomes[f"floor/llm-serving/{name}/0850-mon-tue-wed-thu-fri"] == "deleted"
    assert outcomes[f"prewarm/llm-serving/{name}"] == "deleted"
    assert len(await ids_for(client, deployment, 3)) == 3


async def test_apply_reconciles_and_delete_removes(dev_env, tmp_path, cli_settings, capsys):
    """Removing through tideplane: a changed floor is updated (a pause kept), an entry without
    floors removes its deployment's, `schedules: []` removes all, and `schedules delete` one
    deployment's."""
    client = dev_env.client
    kept, dropped = (f"llm-serving/r{uuid.uuid4().hex[:6]}" for _ in range(2))
    path = tmp_path / "floors.yaml"
    both = {"time_zone": TZ, "schedules": [{"deployment": d, "floors": FLOORS[2:]} for d in (kept, dropped)]}
    path.write_text(yaml.safe_dump(both))
    await schedules.apply(client, schedules.load_schedule_file(path), "tq")
    await ids_for(client, dropped, 2)  # listed, so the next apply can prune them
    _, name = naming.split_deployment(kept)
    paused = client.get_schedule_handle(f"floor/llm-serving/{name}/2100")
    await paused.pause(note="maintenance")

    changed = [{"at": "21:00", "replicas": 4}, FLOORS[3]]
    path.write_text(yaml.safe_dump({"time_zone": TZ, "schedules": [{"deployment": kept, "floors": changed}, {"deployment": dropped}]}))
    outcomes = dict(await schedules.apply(client, schedules.load_schedule_file(path), "tq"))
    assert outcomes[f"floor/llm-serving/{name}/2100"] == "updated"
    assert outcomes[f"floor/llm-serving/{name}/0200"] == "unchanged"
    assert sorted(sid for sid, o in outcomes.items() if o == "deleted" and dropped.split("/")[1] in sid) == [
        f"floor/{dropped}/0200", f"floor/{dropped}/2100"
    ]
    state = (await paused.describe()).schedule.state
    assert state.paused and state.note == "maintenance"
    assert len(await ids_for(client, dropped, 0)) == 0

    path.write_text(yaml.safe_dump({"time_zone": TZ, "schedules": [{"deployment": kept, "floors": changed}]}))
    assert await asyncio.to_thread(schedules.main, ["schedules", "delete", kept], cli_settings) == 0
    assert sorted(capsys.readouterr().out.split()) == sorted(["deleted", f"floor/{kept}/0200", "deleted", f"floor/{kept}/2100"])
    assert await asyncio.to_thread(schedules.main, ["schedules", "delete", kept], cli_settings) == 0  # nothing left: says so
    assert capsys.readouterr().out == f"no floor or pre-warm schedules for {kept}\n"
    assert len(await ids_for(client, kept, 0)) == 0
    assert await asyncio.to_thread(schedules.main, ["schedules", "delete", "chat"], cli_settings) == 2
    assert "deployment must be NAMESPACE/NAME" in capsys.readouterr().err

    path.write_text(yaml.safe_dump(both))
    await schedules.apply(client, schedules.load_schedule_file(path), "tq")
    for deployment in (kept, dropped):  # listed (the list lags behind creates) before it can be pruned
        await ids_for(client, deployment, 2)
    path.write_text("schedules: []\n")
    assert await asyncio.to_thread(schedules.main, ["schedules", "apply", str(path)], cli_settings) == 0
    assert capsys.readouterr().out.count("deleted") >= 4  # these four, and any other test's left over
    for deployment in (kept, dropped):
        assert len(await ids_for(client, deployment, 0)) == 0


async def test_schedule_action_sets_the_loop_floor(dev_env, tmp_path):
    client = dev_env.client
    queue = f"q-{uuid.uuid4()}"
    deployment = f"llm-serving/c{uuid.uuid4().hex[:6]}"
    fake = FakeDeployment(replicas=2)
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[ReactiveScaling, ScheduleFloor, PredictivePrewarm],
        activities=fake.activities(),
        activity_executor=ThreadPoolExecutor(4),
    )
    path = tmp_path / "floors.json"
    path.write_text(yaml.safe_dump(profile(deployment, FLOORS)))
    async with worker:
        loop = await client.start_workflow(
            ReactiveScaling.run, ScalingInput(deployment=deployment), id=naming.scaling_workflow_id(deployment), task_queue=queue
        )
        await schedules.apply(client, schedules.load_schedule_file(path), queue)
        _, name = naming.split_deployment(deployment)
        await client.get_schedule_handle(f"floor/llm-serving/{name}/0900-mon-tue-wed-thu-fri").trigger()
        for _ in range(100):
            status = await loop.query(ReactiveScaling.status)
            if "schedule" in status.floors and fake.replicas == 8:
                break
            await asyncio.sleep(0.1)
        assert status.floors["schedule"].replicas == 8 and fake.replicas == 8
        await loop.terminate()


def test_cli_list_and_invalid_time_zone(cli_settings, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(profile("llm-serving/chat", FLOORS, time_zone="Mars/Olympus_Mons")))
    assert schedules.main(["schedules", "apply", str(bad)], cli_settings) == 2
    assert "unknown time zone 'Mars/Olympus_Mons'" in capsys.readouterr().err
    with pytest.raises(schedules.ScheduleFileError, match=r"schedules.0.floors.0.at: .*expected HH:MM, got '25:00'"):
        bad.write_text(yaml.safe_dump(profile("llm-serving/chat", [{"at": "25:00", "replicas": 1}])))
        schedules.load_schedule_file(bad)

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(profile("llm-serving/cli", [{"at": "07:30", "replicas": 2}])))
    assert schedules.main(["schedules", "apply", str(good)], cli_settings) == 0
    assert "floor/llm-serving/cli/0730" in capsys.readouterr().out
    for _ in range(50):
        assert schedules.main(["schedules", "list"], cli_settings) == 0
        out = capsys.readouterr().out
        if "floor/llm-serving/cli/0730" in out:
            break
    assert "floor/llm-serving/cli/0730" in out and TZ in out and "floor 2 at 07:30" in out


def test_cli_exits_cleanly_after_using_temporal(cli_settings):
    """`tideplane schedules list` run as a process, repeatedly: it used to abort at exit now and
    then (rc 134, "Fatal Python error: PyGILState_Release", temporalio/sdk-python#300)."""
    env = {**os.environ, "TIDEPLANE_TEMPORAL_ADDRESS": cli_settings.temporal_address}
    for run in range(8):
        cli = subprocess.run([str(BIN / "tideplane"), "schedules", "list"], env=env, capture_output=True, text=True, timeout=60)
        assert (cli.returncode, cli.stderr) == (0, ""), f"run {run}: rc {cli.returncode}\n{cli.stderr[-2000:]}"
        assert cli.stdout.startswith("SCHEDULE")
