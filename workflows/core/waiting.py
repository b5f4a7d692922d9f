"""How a workflow waits: durably, for a condition or a timeout, with a summary the web UI shows."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Callable

from temporalio import workflow


async def wait_until(condition: Callable[[], bool], timeout: timedelta | None = None, summary: str | None = None) -> bool:
    """Wait for ``condition`` (durably: a timer in the history); False when ``timeout`` came first."""
    try:
        await workflow.wait_condition(condition, timeout=timeout, timeout_summary=summary)
    except asyncio.TimeoutError:
        return False
    return True
