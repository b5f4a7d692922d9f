"""Each simulated pod on its own address: with the emulator handing out loopback pod IPs
(``--pod-network 127.N``), the fleet simulator serves a Ready pod's ``/metrics`` on
``<podIP>:<port>``, as Prometheus' Kubernetes discovery would scrape it, labelled as vLLM labels
its samples (``model_name``, ``engine``), never with the pod's deployment or version."""

from __future__ import annotations

import subprocess
import sys

import httpx
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tests.kube_fixtures import ROOT, run_kube_api
from tests.sandbox_fixtures import wait_until
from infra.sandbox.ports import free_port, wait_for_port

NS = "llm-serving"
POD_LABELS = {"app.kubernetes.io/managed-by": "tideplane", "app.kubernetes.io/name": "chat",
              "app.kubernetes.io/version": "1.3.0", "tideplane.io/model": "llama"}


def _metrics(url: str) -> str | None:
    try:
        answer = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return answer.text if answer.status_code == 200 else None


def test_a_ready_pod_serves_its_own_vllm_metrics_on_its_ip():
    with run_kube_api(100, "--pod-network", "127.77") as kube_url:
        port = free_port()
        fleet = subprocess.Popen([sys.executable, "-m", "infra.sandbox.fleet_simulator", "--kube-url", kube_url,
                                  "--port", str(port), "--time-scale", "100", "--tick", "0.1"], cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port)
            core = client.CoreV1Api(client.ApiClient(client.Configuration(host=kube_url)))
            core.create_namespace({"metadata": {"name": NS}})
            core.create_node({"metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a"}},
                              "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"}}})
            core.create_namespaced_pod(NS, {"metadata": {"name": "chat-a", "labels": POD_LABELS}, "spec": {"containers": [
                {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "ports": [{"name": "http", "containerPort": 8000}]}]}})
            ip = wait_until(lambda: core.read_namespaced_pod("chat-a", NS).status.pod_ip, 10, "a pod IP")
            assert ip.startswith("127.77.")
            text = wait_until(lambda: _metrics(f"http://{ip}:8000/metrics"), 20, f"the pod's /metrics on {ip}:8000")
        finally:
            fleet.terminate()
            fleet.wait(10)
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    running = [s for s in samples if s.name == "vllm:num_requests_running"]
    assert running and running[0].labels == {"model_name": "llama", "engine": "0"}
    assert not [s for s in samples if {"deployment", "version", "namespace", "pod"} & set(s.labels)]
