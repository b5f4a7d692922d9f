"""The tideplane Temporal worker: every workflow and activity, on the task queue its Settings name.

Activities are mostly synchronous (kubernetes, boto3 and prometheus-api-client are blocking
clients), so they run on a thread pool. SIGTERM or SIGINT stops polling, lets running activities
finish, then exits — what Kubernetes expects from a pod being replaced.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import Callable

from pydantic import ValidationError
from temporalio.runtime import Runtime
from temporalio.worker import Worker

from activities.adapters.adapter_activities import AdapterActivities
from activities.classes.request_class_activities import RequestClassActivities
from activities.clients.aws import AwsClient
from activities.core.notifier import Notifier
from activities.core.workflow_signals import WorkflowSignals
from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.clients.s3 import S3Client
from activities.clients.vllm import VllmClient
from activities.cost.cost_activities import CostActivities
from activities.node_cache.node_cache_activities import NodeCacheActivities
from activities.quality.quality_activities import QualityActivities
from activities.quality.shadow_pairs import ShadowPairsClient
from activities.quotas.quota_activities import QuotaActivities
from activities.registry.registry_activities import RegistryActivities
from activities.rollout.batching_activities import BatchingActivities
from activities.rollout.canary_fleet import CanaryFleetActivities
from activities.rollout.notify_activities import NotifyActivities
from activities.rollout.retire_scheduling import RetireScheduling
from activities.rollout.rollout_activities import RolloutActivities
from activities.rollout.serving_pods import ServingPods
from activities.scaling.node_pool_activities import NodePoolActivities
from activities.scaling.scaling_activities import ScalingActivities
from activities.spot.failover_notices import SpotNotifyActivities
from activities.spot.spot_activities import SpotActivities
from activities.spot.spot_mix_activities import SpotMixActivities
from activities.spot.spot_workflow_starts import SpotWorkflowStarts
from workers import telemetry
from workers.client import connect
from workers.config import Settings
from workflows.adapters import contract as adapters_contract
from workflows.adapters.workflow import AdapterRollout
from workflows.classes import contract as classes_contract
from workflows.classes.workflow import ApplyRequestClasses
from workflows.cost import contract as cost_contract
from workflows.cost.report import CostReport
from workflows.node_cache import contract as node_cache_contract
from workflows.quality import contract as quality_contract
from workflows.quotas import contract as quotas_contract
from workflows.quotas.workflow import ApplyTokenQuotas, TokenMetering
from workflows.registry import contract as registry_contract
from workflows.registry.retention import RegistryRetention
from workflows.rollout import contract as rollout_contract
from workflows.rollout.retire_version import RetireVersion
from workflows.rollout.workflow import ModelRollout
from workflows.scaling import contract as scaling_contract
from workflows.scaling.floors import ScheduleFloor
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.node_pools import NodePoolScaling
from workflows.scaling.prewarm import PredictivePrewarm
from workflows.scaling.shared_pool import SharedPoolScaling
from workflows.spot import contract as spot_contract
from workflows.spot.reclaim import SpotReclaim
from workflows.spot.return_to_spot import ReturnToSpot
from workflows.spot.watcher import SpotInterruptionWatcher

log = logging.getLogger("tideplane.worker")

WORKFLOWS: list[type] = [
    ModelRollout,
    AdapterRollout,
    RetireVersion,
    ReactiveScaling,
    ScheduleFloor,
    PredictivePrewarm,
    NodePoolScaling,
    SharedPoolScaling,
    RegistryRetention,
    CostReport,
    ApplyRequestClasses,
    ApplyTokenQuotas,
    TokenMetering,
    SpotInterruptionWatcher,
    SpotReclaim,
    ReturnToSpot,
]


def activity_methods(instance: object, contract: type) -> list[Callable]:
    """The instance's implementations (bound methods) of every activity its contract class declares."""
    return [getattr(instance, name) for name, member in vars(contract).items() if callable(member) and not name.startswith("_")]


def build_activities(config: Settings, signals: WorkflowSignals | None = None) -> list[Callable]:
    """Every activity this worker runs: the clients built once from ``config`` and passed into
    the activity classes, whose bound methods are registered; ``signals`` (the worker's client)
    lets stage_weights report progress to its rollout."""
    kube = KubeClient.connect(config.kubeconfig, config.kube_in_cluster)
    s3 = S3Client(config.aws_endpoint_url, config.aws_region)
    prometheus = PrometheusClient(config.prometheus_url)
    pods = ServingPods(
        config.model_cache_dir, config.model_cache_pvc, config.otlp_traces_endpoint, config.trace_sample_ratio, config.engine_cache_dir,
        node_cache_dir=config.node_cache_dir, node_cache_image=config.node_cache_image,
        engine_api_key_secret=config.engine_api_key_secret, node_cache_secret=config.node_cache_secret,
    )
    api_key = config.engine_api_key.get_secret_value() if config.engine_api_key else None
    rollout = RolloutActivities(
        kube, s3, prometheus, VllmClient(api_key=api_key), pods, config.gateway, config.service_url_template, config.weights_buckets,
        image_prefixes=config.image_prefixes, image_pinning=config.image_pinning,
        max_replicas=config.max_replicas, max_gpus_per_replica=config.max_gpus_per_replica, signals=signals,
    )
    registry = RegistryActivities(s3, kube, config.weights_bucket, config.weights_buckets)
    cost = CostActivities(prometheus)
    aws = AwsClient(config.aws_region, config.aws_endpoint_url)
    notifier = Notifier(kube, config.notify_webhook_url, config.notify_webhook_format, config.web_ui_url)
    return [
        *activity_methods(rollout, rollout_contract.RolloutActivities),
        *activity_methods(RetireScheduling(), rollout_contract.RetireScheduling),
        *activity_methods(CanaryFleetActivities(kube, prometheus), rollout_contract.CanaryFleetActivities),
        *activity_methods(NotifyActivities(notifier), rollout_contract.NotifyActivities),
        *activity_methods(BatchingActivities(kube, prometheus, VllmClient(api_key=api_key), config.service_url_template), rollout_contract.BatchingActivities),
        *activity_methods(registry, registry_contract.RegistryActivities),
        *activity_methods(
            QualityActivities(VllmClient(api_key=api_key), config.service_url_template, registry.registry, ShadowPairsClient(config.shadow_pairs_url)),
            quality_contract.QualityActivities,
        ),
        *activity_methods(AdapterActivities(kube, registry.registry, config.pod_url_template, api_key=api_key), adapters_contract.AdapterActivities),
        *activity_methods(cost, cost_contract.CostActivities),
        *activity_methods(RequestClassActivities(kube, config.gateway), classes_contract.RequestClassActivities),
        *activity_methods(QuotaActivities(kube, prometheus), quotas_contract.QuotaActivities),
        *activity_methods(ScalingActivities(kube, prometheus), scaling_contract.ScalingActivities),
        *activity_methods(NodePoolActivities(kube, aws), scaling_contract.NodePoolActivities),
        *activity_methods(SpotActivities(kube, aws, config.spot_queue_url), spot_contract.SpotActivities),
        *activity_methods(SpotMixActivities(kube, aws), spot_contract.SpotMixActivities),
        *activity_methods(SpotWorkflowStarts(), spot_contract.SpotWorkflowStarts),
        *activity_methods(SpotNotifyActivities(notifier), spot_contract.SpotNotifyActivities),
        *activity_methods(
            NodeCacheActivities(
                kube, config.node_cache_image, config.node_cache_dir,
                config.node_cache_peer_url_template, config.node_cache_capacity_bytes, config.node_cache_secret,
            ),
            node_cache_contract.NodeCacheActivities,
        ),
    ]


class MetricsPortUnavailable(RuntimeError):
    """The metrics endpoint cannot bind: usually another worker holds the port."""


def _metrics_runtime(config: Settings) -> Runtime | None:
    """The runtime serving /metrics on the configured address, None when the port is 0."""
    if not config.metrics_port:
        return None
    try:
        return telemetry.metrics_runtime(config.metrics_port, config.metrics_host)
    except ValueError as exc:
        raise MetricsPortUnavailable(
            f"cannot serve the worker's metrics on {config.metrics_host}:{config.metrics_port} ({exc}): "
            "is another worker running? Stop it, or set TIDEPLANE_METRICS_PORT to a free port (0 turns the endpoint off)"
        ) from None


@contextmanager
def _pid_file(path: Path | None) -> Iterator[None]:
    """Record this worker's pid in ``path`` while it polls (written once the metrics port is held,
    so a second worker that fails to start leaves the first one's record alone)."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")
    try:
        yield
    finally:
        with suppress(OSError):
            if path.read_text().strip() == str(os.getpid()):
                path.unlink()


MAX_CONCURRENT_ACTIVITIES = 32
SHUTDOWN_GRACE = timedelta(seconds=30)  # running activities get this long to finish on SIGTERM


async def run_worker(config: Settings, stop: asyncio.Event | None = None) -> None:
    """Poll until ``stop`` is set (or SIGTERM/SIGINT arrives), then shut down gracefully."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runtime = _metrics_runtime(config)
    client = await connect(config, runtime)
    with ThreadPoolExecutor(max_workers=MAX_CONCURRENT_ACTIVITIES) as executor:
        worker = Worker(
            client,
            task_queue=config.task_queue,
            workflows=WORKFLOWS,
            activities=build_activities(config, WorkflowSignals(client, loop)),
            activity_executor=executor,
            max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
            graceful_shutdown_timeout=SHUTDOWN_GRACE,
            # A bad input fails the workflow naming the field, instead of retrying its task forever.
            workflow_failure_exception_types=[ValidationError],
        )
        async with worker:
            with _pid_file(config.pid_file):
                log.info("worker polling task queue %r on %s (namespace %s)", config.task_queue, config.temporal_address, config.temporal_namespace)
                await stop.wait()
                log.info("stopping: finishing running activities")
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
