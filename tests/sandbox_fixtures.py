"""The whole sandbox (Temporal, moto, Kubernetes API emulator, cloud, fleet simulator, Prometheus)
on free ports, once per test session.

Use ``sandbox`` for URLs and paths, ``sandbox_env`` to also point this test's environment (boto3,
the temporal CLI, ``load_settings()``) at it.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from temporalio.converter import DataConverter

from infra.sandbox.config import DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, SandboxConfig
from infra.sandbox.kubeclient import api_client
from infra.sandbox.launcher import Ports, Sandbox, SandboxError
from infra.sandbox.nodes import aws_clients, restore_pools
from infra.sandbox.worker_identity import WORKER_NAMESPACE
from infra.sandbox.worker_identity import enable_serving_namespace
from workers.client import data_converter
from workers.config import Settings
from workflows.core.naming import (
    GPU_RESOURCE, LABEL_APP, LABEL_MANAGED_BY, LABEL_MODEL, LABEL_VERSION, MANAGED_BY, NODE_POOL, versioned_name,
)

# Fast enough for tests: a replica is Ready 1 s (real) after it is scheduled, a new node joins in ~4 s.
TEST_TIME_SCALE = 20
TEST_CONFIG = {
    "time_scale": TEST_TIME_SCALE,
    "node_pools": [
        {"name": "gpu-on-demand", "count": 2, "capacity_type": "on-demand", "zones": ["us-east-1a", "us-east-1b"], "gpus": 4, "gpu_memory_gib": 80},
        {"name": "gpu-spot", "count": 1, "capacity_type": "spot", "zones": ["us-east-1c"], "gpus": 4, "gpu_memory_gib": 80},
        {"name": "gpu-shared", "count": 0, "capacity_type": "on-demand", "instance_type": "p5.4xlarge", "max_nodes": 4, "gpus": 1,
         "gpu_memory_gib": 80, "gpu_sharing": "time-slicing", "gpu_replicas": 4},
        {"name": "cpu", "count": 1, "capacity_type": "on-demand", "instance_type": "m7i.8xlarge", "gpus": 0},
    ],
    "profiles": {"default": {"load_seconds": 20, "error_rate": 0.001, "ttft_seconds": 0.15, "tpot_seconds": 0.025, "capacity_rps": 4}},
    "demand": {},
}


@dataclass
class RunningSandbox:
    sandbox: Sandbox
    urls: dict[str, str]
    env: dict[str, str]
    config: dict

    @property
    def state_dir(self) -> Path:
        return self.sandbox.state_dir

    @property
    def kubeconfig(self) -> Path:
        return self.sandbox.kubeconfig

    @property
    def data_converter(self) -> DataConverter:
        """The sandbox worker's converter (the sandbox's payload key): a client reading what that
        worker wrote (results, queries, current details) needs it."""
        return data_converter(Settings.model_validate(self.env))


_RUNNING: list[RunningSandbox] = []  # the session's sandbox once a test asked for it
_BASE_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", SANDBOX_NAMESPACE, WORKER_NAMESPACE}


def reset_cluster(box: RunningSandbox) -> None:
    """Give the next module the cluster as ``up`` left it: the namespaces tests created (and all
    their pods, so the GPUs they held are free again) deleted, no demand offered, and each node
    pool back at its configured size (a scale-up or a failover a test left behind keeps its nodes)."""
    core = client.CoreV1Api(api_client(box.urls["kubeapi"]))
    created = [ns.metadata.name for ns in core.list_namespace().items if ns.metadata.name not in _BASE_NAMESPACES]
    for name in created:
        core.delete_namespace(name)
    wait_until(lambda: not {ns.metadata.name for ns in core.list_namespace().items} & set(created), 30,
               "the deleted namespaces to finish Terminating")
    demand = core.read_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE)
    demand.data = {}
    core.replace_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, demand)
    pools = SandboxConfig.model_validate(box.config).node_pools
    restore_pools(aws_clients(box.env["AWS_ENDPOINT_URL"])[1], pools)

    def pool_sizes() -> dict[str, int]:
        sizes = dict.fromkeys((p.name for p in pools), 0)
        for node in core.list_node().items:
            pool = (node.metadata.labels or {}).get(NODE_POOL)
            sizes[pool] = sizes.get(pool, 0) + 1
        return sizes

    configured = {p.name: p.count for p in pools}
    wait_until(lambda: pool_sizes() == configured, 60, f"the node pools back at {configured}")


def revive_dead_components(box: RunningSandbox) -> list[str]:
    """Start again, with the same ports and data, every component that died during an earlier
    module, and warn naming each: one crash then fails the module it happened in, not every
    module after it by timeout."""
    dead = [name for name, state in box.sandbox.status().items()
            if not state["up"] and name not in ("temporal-ui", "worker")]  # a worker runs only where a test starts one
    for name in dead:
        warnings.warn(f"sandbox component {name} had died; restarted it for the next module", stacklevel=1)
        box.sandbox.restart(name)
    return dead


@pytest.fixture(scope="module", autouse=True)
def _reset_sandbox_after_module():
    """Modules share one sandbox: what one leaves running must not take another's GPUs, and
    one that died in an earlier module is running again."""
    for box in _RUNNING:
        revive_dead_components(box)
    yield
    for box in _RUNNING:
        reset_cluster(box)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory):
    """A running sandbox; torn down (and checked to leave nothing running) after the session.
    Registered by the e2e and sandbox tiers' conftests: a session running both shares the first."""
    if _RUNNING:
        yield _RUNNING[0]
        return
    state_dir = tmp_path_factory.mktemp("sandbox")
    config_path = state_dir / "sandbox.yaml"
    config_path.write_text(yaml.safe_dump(TEST_CONFIG))
    box = Sandbox(state_dir, Ports.free(), config_path)
    try:
        urls = box.up()
    except SandboxError:  # another process took a chosen port before it was bound: once more
        box = Sandbox(state_dir, Ports.free(), config_path)
        urls = box.up()
    running = RunningSandbox(box, urls, box.env(), TEST_CONFIG)
    _RUNNING.append(running)
    try:
        yield running
    finally:
        _RUNNING.remove(running)
        box.down()


@pytest.fixture
def sandbox_env(sandbox, monkeypatch):
    """The sandbox, with this test's environment pointing at it."""
    for key, value in sandbox.env.items():
        monkeypatch.setenv(key, value)
    return sandbox


async def wait_for(predicate, timeout: float, what: str, interval: float = 0.3):
    """``wait_until`` for async tests: the (blocking) predicate runs in a thread."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(interval)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll ``predicate`` until it returns something truthy (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def create_logical_deployment(
    api: client.ApiClient, namespace: str, name: str, version: str, model: str, replicas: int, gpus: int = 1,
    container: dict | None = None,
) -> str:
    """Namespace, one version's Deployment + Service, and the HTTPRoute sending it all traffic,
    as tideplane lays them out; returns the versioned Deployment/Service name. ``container``
    replaces fields of the serving container (e.g. its resources and vLLM args)."""
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    labels = {LABEL_APP: name, LABEL_VERSION: version, LABEL_MODEL: model}
    versioned = versioned_name(name, version)
    enable_serving_namespace(core.api_client, namespace)
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": versioned, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": {**labels, LABEL_MANAGED_BY: MANAGED_BY}}, "spec": {"containers": [{
                "name": "vllm", "image": "vllm/vllm-openai:v0.6.3", "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],  # what the serving job scrapes
                **(container or {})}]}},
        },
    })
    core.create_namespaced_service(namespace, {"metadata": {"name": versioned}, "spec": {"selector": labels, "ports": [{"port": 8000}]}})
    custom.create_namespaced_custom_object("gateway.networking.k8s.io", "v1", namespace, "httproutes", {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name},
        "spec": {"rules": [{"backendRefs": [{"name": versioned, "port": 8000, "weight": 100}]}]},
    })
    return versioned
