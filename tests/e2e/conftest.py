"""End-to-end fixtures: the whole sandbox (once per session), moto for the tests that bring their
own cluster, and the sandbox's Kubernetes and Temporal clients several modules share."""

from __future__ import annotations

import pytest
from kubernetes import client
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from infra.sandbox.kubeclient import api_client
from tests.sandbox_fixtures import _reset_sandbox_after_module, sandbox, sandbox_env  # noqa: F401
from tests.servers import moto_url  # noqa: F401


@pytest.fixture(scope="module")
def kube(sandbox) -> client.ApiClient:  # noqa: F811 - the fixture imported above
    """The admin's client of the sandbox's Kubernetes API."""
    return api_client(sandbox.urls["kubeapi"])


@pytest.fixture(scope="module")
async def temporal(sandbox) -> Client:  # noqa: F811
    """A client of the sandbox's Temporal server."""
    return await Client.connect(sandbox.urls["temporal"], data_converter=pydantic_data_converter)
