"""Activity-tier fixtures: moto, a fresh emulated cluster, and the activity classes built as the
worker builds them, with their clients pointed at the servers a test started (clients a test does
not use point nowhere)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.clients.s3 import S3Client
from activities.clients.vllm import VllmClient
from activities.rollout.rollout_activities import RolloutActivities
from activities.rollout.serving_pods import ServingPods
from tests.kube_fixtures import kube_api, kube_api_url  # noqa: F401 - a fresh emulated cluster (test_registry)
from tests.servers import moto_url  # noqa: F401

NOWHERE = "http://127.0.0.1:9"  # the discard port: a client a test does not use


def build_rollout(
    kubeconfig: str | None = None,
    s3_endpoint: str = NOWHERE,
    prometheus_url: str = NOWHERE,
    model_cache_dir: Path = Path("/var/cache/tideplane/models"),
    gateway: str = "inference-gateway",
    service_url_template: str = "http://{service}.{namespace}:8000",
    weights_buckets: list[str] | None = None,
    image_prefixes: list[str] | None = None,
) -> RolloutActivities:
    return RolloutActivities(
        KubeClient.connect(kubeconfig) if kubeconfig else KubeClient(client.ApiClient()),
        S3Client(s3_endpoint, "us-east-1"),
        PrometheusClient(prometheus_url),
        VllmClient(),
        ServingPods(model_cache_dir=model_cache_dir),
        gateway=gateway,
        service_url_template=service_url_template,
        weights_buckets=weights_buckets,
        image_prefixes=image_prefixes,
    )


@pytest.fixture(scope="session")
def make_rollout() -> Callable[..., RolloutActivities]:
    """``make_rollout(kubeconfig=..., s3_endpoint=..., prometheus_url=..., model_cache_dir=...)``."""
    return build_rollout
