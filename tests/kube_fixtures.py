"""Fixtures for the Kubernetes API emulator: a fresh emulated cluster per test, over real HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from infra.sandbox.kubeclient import kubeconfig_yaml
from infra.sandbox.ports import free_port, wait_for_port
from tests.sandbox_fixtures import wait_until

__all__ = ["EmulatedCluster", "emulated_cluster", "kube_api", "kube_api_url", "kube_kubeconfig", "kube_wait",
           "namespace_for", "run_kube_api", "write_kubeconfig"]

ROOT = Path(__file__).resolve().parents[1]
TIME_SCALE = 100.0  # sandbox seconds per real second: a 30 s model load takes 0.3 s


@contextmanager
def run_kube_api(time_scale: float = TIME_SCALE, *extra_args: str) -> Iterator[str]:
    """Start `python -m infra.sandbox.kubeapi` on a free loopback port; yield its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.sandbox.kubeapi", "--host", "127.0.0.1", "--port", str(port),
         "--time-scale", str(time_scale), *extra_args],
        cwd=ROOT, stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_kubeconfig(url: str, path: Path) -> Path:
    """The admin's kubeconfig (no credentials) for kubectl or `kubernetes.config.load_kube_config`."""
    path.write_text(kubeconfig_yaml(url))
    return path


@pytest.fixture
def kube_api_url() -> Iterator[str]:
    """Base URL of a fresh, empty emulated cluster (time scale 100)."""
    with run_kube_api() as url:
        yield url


@pytest.fixture
def kube_api(kube_api_url: str) -> Iterator[client.ApiClient]:
    """An official `kubernetes.client.ApiClient` talking HTTP to a fresh emulated cluster."""
    config = client.Configuration()
    config.host = kube_api_url
    with client.ApiClient(config) as api_client:
        yield api_client


@pytest.fixture
def kube_kubeconfig(kube_api_url: str, tmp_path: Path) -> Path:
    """Path of a kubeconfig for the same emulated cluster as `kube_api`."""
    return write_kubeconfig(kube_api_url, tmp_path / "kubeconfig")


@dataclass
class EmulatedCluster:
    """One emulated cluster shared by a test module: its URL, an admin client, and kubectl."""

    url: str
    api: client.ApiClient
    kubectl: Callable[..., subprocess.CompletedProcess]


@contextmanager
def emulated_cluster(home: Path) -> Iterator[EmulatedCluster]:
    """A fresh emulator (time scale 100) with an admin ApiClient and a kubectl whose HOME is home."""
    with run_kube_api() as url:
        kubeconfig = write_kubeconfig(url, home / "kubeconfig")

        def kubectl(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], capture_output=True,
                                  text=True, timeout=30, env={"HOME": str(home), "PATH": "/usr/bin:/bin"})

        config = client.Configuration()
        config.host = url
        with client.ApiClient(config) as api_client:
            yield EmulatedCluster(url, api_client, kubectl)


def namespace_for(api_client: client.ApiClient, request: pytest.FixtureRequest) -> str:
    """A namespace named after the requesting test, created for it."""
    name = request.node.name.removeprefix("test_").replace("_", "-")[:50].strip("-")
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": name}})
    return name


def kube_wait(predicate, what: str, timeout: float = 10):
    """wait_until, polling at the emulator's pace (it answers in milliseconds)."""
    return wait_until(predicate, timeout, what, interval=0.05)
