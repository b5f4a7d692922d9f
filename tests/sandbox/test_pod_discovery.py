"""The sandbox's stand-in for Prometheus' Kubernetes pod discovery (infra/sandbox/pod_discovery.py):
the target groups it makes against the pod role's documented meta labels, and the real Prometheus
running the shipped serving job on its file over the emulator's pods."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
from kubernetes import client

from infra.k8s.monitoring import render
from infra.prometheus import prometheus_process
from infra.sandbox.pod_discovery import PodDiscovery, on_file_sd, pod_target_groups
from infra.sandbox.ports import free_port
from tests.kube_fixtures import run_kube_api
from tests.servers import serve_exposition

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/vllm/vllm-0.32.0.prom"
NS = "llm-serving"
SERVING_LABELS = {"app.kubernetes.io/managed-by": "tideplane", "app.kubernetes.io/name": "chat",
                  "app.kubernetes.io/version": "1.3.0", "tideplane.io/model": "llama"}


def _serving_pod(name: str, port: int = 8000) -> dict:
    return {
        "metadata": {"name": name, "labels": SERVING_LABELS},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                                 "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}]}]},
    }


def test_one_target_per_container_port_with_the_pod_roles_meta_labels():
    pod = {
        "metadata": {"name": "chat-a", "namespace": NS, "uid": "u-1", "labels": {"app.kubernetes.io/name": "chat"},
                     "annotations": {"tideplane.io/spec-hash": "h1"},
                     "ownerReferences": [{"kind": "ReplicaSet", "name": "chat-rs", "controller": True}]},
        "spec": {"nodeName": "gpu-1", "containers": [
            {"name": "vllm", "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"},
                                       {"name": "grpc", "containerPort": 9000, "protocol": "TCP"}]},
            {"name": "sidecar"}]},
        "status": {"podIP": "127.1.0.5", "hostIP": "10.0.0.1", "phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }
    groups = pod_target_groups(pod)
    assert [g["targets"] for g in groups] == [["127.1.0.5:8000"], ["127.1.0.5:9000"], ["127.1.0.5"]]
    assert groups[0]["labels"] == {
        "__meta_kubernetes_namespace": NS, "__meta_kubernetes_pod_name": "chat-a", "__meta_kubernetes_pod_ip": "127.1.0.5",
        "__meta_kubernetes_pod_ready": "true", "__meta_kubernetes_pod_phase": "Running", "__meta_kubernetes_pod_node_name": "gpu-1",
        "__meta_kubernetes_pod_host_ip": "10.0.0.1", "__meta_kubernetes_pod_uid": "u-1",
        "__meta_kubernetes_pod_controller_kind": "ReplicaSet", "__meta_kubernetes_pod_controller_name": "chat-rs",
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "chat", "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name": "true",
        "__meta_kubernetes_pod_annotation_tideplane_io_spec_hash": "h1",
        "__meta_kubernetes_pod_annotationpresent_tideplane_io_spec_hash": "true",
        "__meta_kubernetes_pod_container_name": "vllm", "__meta_kubernetes_pod_container_port_number": "8000",
        "__meta_kubernetes_pod_container_port_name": "http", "__meta_kubernetes_pod_container_port_protocol": "TCP",
    }
    assert groups[1]["labels"]["__meta_kubernetes_pod_container_port_name"] == "grpc"
    assert "__meta_kubernetes_pod_container_port_name" not in groups[2]["labels"]  # a container without ports: the bare IP
    assert groups[2]["labels"]["__meta_kubernetes_pod_container_name"] == "sidecar"
    del pod["status"]["conditions"]
    assert pod_target_groups(pod)[0]["labels"]["__meta_kubernetes_pod_ready"] == "unknown"
    del pod["status"]["podIP"]
    assert pod_target_groups(pod) == []  # starting or evicted: no targets


def _wait(condition, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.3)


def test_prometheus_scrapes_the_emulators_serving_pods_through_the_bridge_with_the_shipped_relabelling(tmp_path, request):
    """The bridge over the emulator's pods (``--pod-network 127.31``), the shipped serving job with
    only its kubernetes_sd_configs swapped for the bridge's file: /api/v1/targets lists the pod at
    its own address, discovered labels from the bridge, and the labels the relabel rules make."""
    targets_file = tmp_path / "pods.json"
    with run_kube_api(100, "--pod-network", "127.31") as kube_url:
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=kube_url)))
        core.create_namespace({"metadata": {"name": NS}})
        core.create_node({"metadata": {"name": "gpu-a", "labels": {"kubernetes.io/hostname": "gpu-a"}},
                          "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"}}})
        port = free_port()
        core.create_namespaced_pod(NS, _serving_pod("chat-a", port))
        stop = threading.Event()
        request.addfinalizer(stop.set)  # the bridge ends with the test, not relisting a stopped emulator
        threading.Thread(target=PodDiscovery(kube_url, targets_file).run_forever, args=(stop,), daemon=True).start()

        def running_group():
            groups = json.loads(targets_file.read_text()) if targets_file.exists() else []
            return next((g for g in groups if g["labels"]["__meta_kubernetes_pod_phase"] == "Running"), None)
        group = _wait(running_group)
        assert group, targets_file.read_text() if targets_file.exists() else "no file"
        [address] = group["targets"]
        pod_ip = group["labels"]["__meta_kubernetes_pod_ip"]
        assert pod_ip.startswith("127.31.") and address == f"{pod_ip}:{port}"
        engine = serve_exposition(FIXTURE.read_text(), pod_ip, port)

        [shipped] = [j for j in render.scrape_configs() if j["job_name"] == render.SERVING_JOB]
        job = on_file_sd(shipped, targets_file)
        assert job["relabel_configs"] == shipped["relabel_configs"] and "honor_labels" not in job
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}
        try:
            with prometheus_process(tmp_path / "prometheus", config) as url:
                def scraped():
                    try:
                        active = httpx.get(f"{url}/api/v1/targets", timeout=2).json()["data"]["activeTargets"]
                    except (httpx.HTTPError, ValueError, KeyError):
                        return None
                    return [t for t in active if t["health"] == "up"] and active
                targets = _wait(scraped)
                series = httpx.get(f"{url}/api/v1/query", params={"query": "vllm:num_requests_running"}, timeout=5).json()["data"]["result"]
        finally:
            engine.shutdown()
    [target] = targets
    assert target["scrapeUrl"] == f"http://{address}/metrics" and target["health"] == "up", target
    assert target["discoveredLabels"]["__meta_kubernetes_pod_name"] == "chat-a"
    assert target["discoveredLabels"]["__meta_kubernetes_pod_label_app_kubernetes_io_version"] == "1.3.0"
    assert target["discoveredLabels"]["__meta_kubernetes_pod_container_port_name"] == "http"
    assert {k: target["labels"][k] for k in ("namespace", "pod", "deployment", "version", "node")} == {
        "namespace": NS, "pod": "chat-a", "deployment": "chat", "version": "1.3.0", "node": "gpu-a"}
    [sample] = series
    assert sample["metric"]["deployment"] == "chat" and sample["metric"]["version"] == "1.3.0"
