"""End-to-end fixtures: the whole sandbox (once per session), moto for the tests that bring their
own cluster, and what several modules share: the sandbox's Kubernetes and Temporal clients, its
model registry, and a ``tideplane worker`` process per module."""

from __future__ import annotations

import pytest
from kubernetes import client
from temporalio.client import Client

from activities.clients.s3 import S3Client
from activities.registry.store import Registry
from infra.sandbox.kubeclient import api_client
from infra.sandbox.launcher import AWS_ENV, WEIGHTS_BUCKET
from tests.e2e.worker_process import WorkerProcess
from tests.sandbox_fixtures import _reset_sandbox_after_module, sandbox, sandbox_env  # noqa: F401
from tests.servers import moto_url  # noqa: F401


@pytest.fixture(scope="module")
def kube(sandbox) -> client.ApiClient:  # noqa: F811 - the fixture imported above
    """The admin's client of the sandbox's Kubernetes API."""
    return api_client(sandbox.urls["kubeapi"])


@pytest.fixture(scope="module")
async def temporal(sandbox) -> Client:  # noqa: F811
    """A client of the sandbox's Temporal server, with its payload key (the sandbox's worker encrypts)."""
    return await Client.connect(sandbox.urls["temporal"], data_converter=sandbox.data_converter)


@pytest.fixture(scope="module")
def registry(sandbox) -> Registry:  # noqa: F811
    """The model registry in the sandbox's S3 (moto)."""
    s3 = S3Client(
        sandbox.urls["moto"], AWS_ENV["AWS_DEFAULT_REGION"],
        access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"], secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    return Registry(s3, WEIGHTS_BUCKET)


@pytest.fixture(scope="module")
def worker(sandbox, tmp_path_factory) -> WorkerProcess:  # noqa: F811
    """A ``tideplane worker`` process on the sandbox's task queue, stopped after the module."""
    proc = WorkerProcess(sandbox.env, tmp_path_factory.mktemp("worker") / "worker.log")
    proc.start()
    yield proc
    proc.stop()
