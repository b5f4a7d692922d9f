"""Workflow-tier fixtures: Temporal's time-skipping test server."""

from __future__ import annotations

import pytest

from tests.servers import time_skipping


@pytest.fixture(scope="module")
async def time_skipping_env():
    """Temporal's time-skipping test server with tideplane's search attributes registered.

    One per test module: the server skips time only while nothing is outstanding, so a
    workflow another module left running (a scaling loop without its worker) must not stall
    the next module's clock.
    """
    async with time_skipping() as env:
        yield env
