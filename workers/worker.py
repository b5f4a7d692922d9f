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

from pydantic import ValidationError
from temporalio.worker import Worker

from activities import cloud, cost, gpu, kube, metrics, registry, scaling, serving, storage
from workers import telemetry
from workers.client import connect
from workers.config import settings
from workflows.spot.reclaim import SpotReclaim
from workflows.spot.return_to_spot import ReturnToSpot
from workflows.spot.watcher import SpotInterruptionWatcher
from workflows.cost.report import CostReport
from workflows.scaling.node_pools import NodePoolScaling
from workflows.registry.retention import RegistryRetention
from workflows.rollout.workflow import ModelRollout
from workflows.scaling.loop import PredictivePrewarm, ReactiveScaling, ScheduleFloor

log = logging.getLogger("tideplane.worker")

WORKFLOWS: list[type] = [
    ModelRollout,
    ReactiveScaling,
    ScheduleFloor,
    PredictivePrewarm,
    NodePoolScaling,
    RegistryRetention,
    CostReport,
    SpotInterruptionWatcher,
    SpotReclaim,
    ReturnToSpot,
]
ACTIVITIES: list = [
    *storage.ACTIVITIES,
    *kube.ACTIVITIES,
    *serving.ACTIVITIES,
    *metrics.ACTIVITIES,
    *registry.ACTIVITIES,
    *scaling.ACTIVITIES,
    *cloud.ACTIVITIES,
    *gpu.ACTIVITIES,
    *telemetry.ACTIVITIES,
    cost.collect_cost_inputs,
]

MAX_CONCURRENT_ACTIVITIES = 32
SHUTDOWN_GRACE = timedelta(seconds=30)  # running activities get this long to finish on SIGTERM


async def run_worker(stop: asyncio.Event | None = None) -> None:
    """Poll until ``stop`` is set (or SIGTERM/SIGINT arrives), then shut down gracefully."""
    config = settings()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    endpoint = telemetry.start_metrics_server(config.metrics_port) if config.metrics_port else None
    client = await connect(config, endpoint.runtime if endpoint else None)
    with ThreadPoolExecutor(max_workers=MAX_CONCURRENT_ACTIVITIES) as executor:
        worker = Worker(
            client,
            task_queue=config.task_queue,
            workflows=WORKFLOWS,
            activities=ACTIVITIES,
            activity_executor=executor,
            max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
            graceful_shutdown_timeout=SHUTDOWN_GRACE,
            # A bad input fails the workflow naming the field, instead of retrying its task forever.
            workflow_failure_exception_types=[ValidationError],
        )
        async with worker:
            log.info("worker polling task queue %r on %s (namespace %s)", config.task_queue, config.temporal_address, config.temporal_namespace)
            await stop.wait()
            log.info("stopping: finishing running activities")
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    if endpoint:
        endpoint.close()
