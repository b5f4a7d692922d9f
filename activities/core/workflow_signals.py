"""Signals from sync activities. ``activity.client()`` exists only in ``async def`` activities;
the blocking ones (boto3, kubernetes) run on the worker's thread pool, so the worker hands them
its own client and event loop through this, once, at start."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from typing import Any

from temporalio.client import Client

log = logging.getLogger(__name__)


class WorkflowSignals:
    """``send(workflow_id, run_id, signal, arg)`` from any thread, without waiting for it: what is
    sent is best effort (progress), never a reason for an activity to stall or fail."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.loop = client, loop

    def send(self, workflow_id: str, run_id: str, signal: str, arg: Any) -> None:
        handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
        asyncio.run_coroutine_threadsafe(handle.signal(signal, arg), self.loop).add_done_callback(_log_failure)


def _log_failure(sent: Future) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.warning("signal not delivered: %s", sent.exception())
