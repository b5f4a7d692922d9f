"""``tideplane setup temporal`` on a Temporal dev server that has none of tideplane's search attributes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
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
    env = {"PATH": str(BIN), "HOME": str(Path.home())}
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
