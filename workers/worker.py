"""The tideplane Temporal worker: every workflow and activity, on task queue ``settings().task_queue``.

Activities are mostly synchronous (kubernetes, boto3 and prometheus-api-client are blocking
clients), so they run on a thread pool. SIGTERM or SIGINT stops polling, lets running activities
finish, then exits — what Kubernetes expects from a pod being replaced.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.worker import Worker

from activities import registry as registry_activities
from activities import scaling as scaling_activities
from activities import spot as spot_activities
from workers import telemetry
from workers.config import Settings, settings
from workflows import spot as spot_workflows

log = logging.getLogger("tideplane.worker")

# Registered on the worker; each feature adds its workflow classes and activity functions here.
WORKFLOWS: list[type] = [*spot_workflows.WORKFLOWS]
ACTIVITIES: list = [
    *spot_activities.ACTIVITIES,
    *registry_activities.ACTIVITIES,
    *scaling_activities.ACTIVITIES,
    *telemetry.ACTIVITIES,
]

MAX_CONCURRENT_ACTIVITIES = 32
SHUTDOWN_GRACE = timedelta(seconds=30)  # running activities get this long to finish on SIGTERM


async def connect(config: Settings, runtime: Runtime | None = None) -> Client:
    """A Temporal client with the pydantic data converter (every tideplane payload is a model)."""
    return await Client.connect(
        config.temporal_address,
        namespace=config.temporal_namespace,
        data_converter=pydantic_data_converter,
        runtime=runtime,
    )


async def run_worker(stop: asyncio.Event | None = None) -> None:
    """Poll until ``stop`` is set (or SIGTERM/SIGINT arrives), then shut down gracefully."""
    config = settings()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = telemetry.start_metrics_server(config.metrics_port) if config.metrics_port else None
    client = await connect(config, metrics.runtime if metrics else None)
    with ThreadPoolExecutor(max_workers=MAX_CONCURRENT_ACTIVITIES) as executor:
        worker = Worker(
            client,
            task_queue=config.task_queue,
            workflows=WORKFLOWS,
            activities=ACTIVITIES,
            activity_executor=executor,
            max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
            graceful_shutdown_timeout=SHUTDOWN_GRACE,
        )
        async with worker:
            log.info("worker polling task queue %r on %s (namespace %s)", config.task_queue, config.temporal_address, config.temporal_namespace)
            await stop.wait()
            log.info("stopping: finishing running activities")
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    if metrics:
        metrics.close()
