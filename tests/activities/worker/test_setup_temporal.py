"""``tideplane setup temporal`` on a Temporal dev server that has none of tideplane's search attributes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from infra.sandbox.ports import free_port
from workers.cli.setup import create_commands, custom_attributes
from workflows.core.search_attributes import CLI_TYPES

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
async def bare_server():
    """A dev server started without --search-attribute: like a namespace nobody has set up."""
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(BIN / "temporal"), port=free_port())
    try:
        yield env
    finally:
        await env.shutdown()


def setup_temporal(address: str, *flags: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(BIN), "HOME": str(Path.home())}  # no payload key: setup sends no payloads
    return subprocess.run([str(BIN / "tideplane"), "setup", "temporal", "--address", address, *flags],
                          capture_output=True, text=True, timeout=60, env=env)


async def test_setup_adds_what_is_missing_once_and_then_finds_it(bare_server):
    client = bare_server.client
    address = client.service_client.config.target_host
    assert not set(CLI_TYPES) & set(await custom_attributes(client, "default"))

    first = setup_temporal(address, "--namespace", "default")
    assert first.returncode == 0, first.stderr
    assert [line for line in first.stdout.splitlines() if line.startswith("added ")] == [
        f"added {name} ({kind})" for name, kind in CLI_TYPES.items()
    ]
    assert {name: kind for name, kind in (await custom_attributes(client, "default")).items() if name in CLI_TYPES} == CLI_TYPES

    again = setup_temporal(address, "--namespace", "default")
    assert again.returncode == 0, again.stderr
    assert "added " not in again.stdout
    assert [line for line in again.stdout.splitlines() if line.startswith("found ")] == [
        f"found {name} ({kind})" for name, kind in CLI_TYPES.items()
    ]


def test_print_gives_the_temporal_cli_lines_and_registers_nothing():
    printed = setup_temporal("127.0.0.1:1", "--namespace", "prod", "--print")  # nothing listens there
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == create_commands("prod")
    assert "temporal operator search-attribute create --namespace prod --name TideplaneCanaryPercent --type Int" in printed.stdout


async def test_a_rollout_in_a_namespace_without_them_fails_at_once_naming_the_attribute_and_the_command():
    """Started as `temporal workflow start` starts it (no search attributes given), ModelRollout used to
    fail its first workflow task on the upsert, for ever; now it fails at once, before any cluster call."""
    import types
    import uuid

    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import ApplicationError
    from temporalio.worker import Worker

    from activities.rollout.rollout_activities import RolloutActivities
    from tests.workflows.rollout.test_rollout import CLUSTER_CHANGES, Fleet, rollout_input
    from workflows.rollout.workflow import ModelRollout

    env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(BIN / "temporal"), port=free_port(),
                                                data_converter=pydantic_data_converter)
    try:
        fleet = Fleet(env.client)
        real_check = types.MethodType(RolloutActivities.check_search_attributes, object())  # uses no client of ours
        activities = [real_check if getattr(a, "__name__", "") == "check_search_attributes" else a for a in fleet.activities()]
        queue = f"bare-{uuid.uuid4().hex[:8]}"
        async with Worker(env.client, task_queue=queue, workflows=[ModelRollout], activities=activities):
            handle = await env.client.start_workflow("ModelRollout", rollout_input(), id=f"rollout-{queue}", task_queue=queue)
            with pytest.raises(WorkflowFailureError) as failed:
                await handle.result()
        error = failed.value.cause
        assert isinstance(error, ApplicationError) and error.type == "SearchAttributesMissing"
        assert "TideplaneDeployment (Keyword)" in error.message and "TideplaneCanaryPercent (Int)" in error.message
        assert "tideplane setup temporal --namespace default" in error.message
        assert not [name for name in fleet.names() if name in CLUSTER_CHANGES]
    finally:
        await env.shutdown()
