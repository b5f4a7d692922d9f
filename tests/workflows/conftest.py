"""Workflow-tier fixtures: Temporal's time-skipping test server."""

from __future__ import annotations

import pytest

from tests.servers import time_skipping


@pytest.fixture
async def time_skipping_env():
    """Temporal's time-skipping test server with tideplane's search attributes registered.

    One per test (it starts in about 0.1 s): the server skips time only while nothing is
    outstanding, so a workflow an earlier test left running (a loop whose worker has stopped, a
    task no worker polls) would stall the next test's clock, which then waits in real time.
    """
    async with time_skipping() as env:
        yield env
