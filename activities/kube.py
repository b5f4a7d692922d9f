"""TEMPORARY (issue 12): the old import paths of the Kubernetes helpers and rollout activities, for
the modules and tests that have not moved yet to ``activities.clients.kube`` (KubeClient and its
helpers) and ``activities.rollout.RolloutActivities``. Deleted once nothing imports it."""

from __future__ import annotations

import functools
from pathlib import Path

from kubernetes import client
from temporalio import activity

from activities.clients.kube import API_TIMEOUT, KubeClient, fail, is_ready, label_selector, read_or_none, selector
from activities.clients.prometheus import PrometheusClient
from activities.clients.s3 import S3Client
from activities.clients.vllm import VllmClient
from activities.rollout import RolloutActivities, ServingPods
from workers.config import settings
from workflows.naming import DeploymentRef
from workflows.rollout.activities import (
    DESCRIBE_DEPLOYMENT,
    ENSURE_VERSION,
    SCALE_VERSION,
    DeploymentState,
    EnsureVersionInput,
    ScaleVersionInput,
)

__all__ = ["API_TIMEOUT", "_fail", "_is_ready", "_label_selector", "_read_or_none", "_selector", "api_client"]
_fail, _read_or_none, _is_ready, _selector, _label_selector = fail, read_or_none, is_ready, selector, label_selector


@functools.cache
def _client_for(kubeconfig: str | None, in_cluster: bool) -> client.ApiClient:
    return KubeClient.connect(kubeconfig, in_cluster).api


def api_client() -> client.ApiClient:
    s = settings()
    return _client_for(str(s.kubeconfig) if s.kubeconfig else None, s.kube_in_cluster)


def _rollout() -> RolloutActivities:
    s = settings()
    return RolloutActivities(
        KubeClient(api_client()),
        S3Client(s.aws_endpoint_url, s.aws_region),
        PrometheusClient(s.prometheus_url),
        VllmClient(),
        ServingPods(Path(s.model_cache_dir), s.model_cache_pvc, s.otlp_traces_endpoint, s.trace_sample_ratio),
        s.gateway,
        s.service_url_template,
    )


@activity.defn(name=DESCRIBE_DEPLOYMENT)
def describe_deployment(ref: DeploymentRef) -> DeploymentState:
    return _rollout().describe_deployment(ref)


@activity.defn(name=ENSURE_VERSION)
def ensure_version(req: EnsureVersionInput) -> None:
    _rollout().ensure_version(req)


@activity.defn(name=SCALE_VERSION)
def scale_version(req: ScaleVersionInput) -> None:
    _rollout().scale_version(req)
