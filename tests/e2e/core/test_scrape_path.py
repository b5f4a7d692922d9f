"""The shipped scrape block (infra/k8s/monitoring/scrape-configs.yaml) in the real Prometheus: its
relabelling turns a serving pod's labels into the labels every query selects on, on vLLM's own
samples, and keeps only tideplane's running serving pods."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from infra.k8s.monitoring import render
from infra.prometheus import RULE_FILES, prometheus_process
from tests.servers import serve_exposition
from workflows.core.engine_metrics import SCRAPE_LABELS

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests/fixtures/vllm/vllm-0.32.0.prom"
PROMTOOL = "/usr/bin/promtool"


def _load(path: str):
    return yaml.safe_load((ROOT / path).read_text())


def _pod_meta(address: str, namespace: str, pod: str, node: str, port: str, labels: dict[str, str], phase: str = "Running") -> dict:
    """A target group as Prometheus' Kubernetes pod discovery makes it (discovery/kubernetes/pod.go)."""
    meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod, "__meta_kubernetes_pod_node_name": node,
            "__meta_kubernetes_pod_phase": phase, "__meta_kubernetes_pod_container_port_name": port, "__meta_kubernetes_pod_ready": "true"}
    for key, value in labels.items():
        meta[render.meta_label(key)] = value
        meta[render.present(key)] = "true"
    return {"targets": [address], "labels": meta}


def test_the_shipped_relabelling_makes_the_query_labels_on_vllms_own_samples(tmp_path):
    """The real Prometheus, the shipped jobs' relabel_configs verbatim, targets carrying the meta
    labels Kubernetes discovery gives a pod, and an engine exporting vLLM 0.32's exposition (labels
    model_name and engine only): the samples get namespace, pod, deployment, version and node.
    Debian's Prometheus is built without kubernetes_sd_configs (promtool: "field
    kubernetes_sd_configs not found"), so discovery here is a file with the same target groups."""
    serving = serve_exposition(FIXTURE.read_text())
    other = serve_exposition("up_like 1\n")
    address = lambda server: f"127.0.0.1:{server.server_address[1]}"  # noqa: E731
    pod_labels = {"app.kubernetes.io/managed-by": "tideplane", "app.kubernetes.io/name": "chat",
                  "app.kubernetes.io/version": "1.3.0", "tideplane.io/model": "llama"}
    groups = [
        _pod_meta(address(serving), "llm-serving", "chat-v1-3-0-abc", "gpu-node-1", "http", pod_labels),
        _pod_meta(address(other), "llm-serving", "not-ours", "gpu-node-1", "http", {"app.kubernetes.io/name": "chat"}),
        _pod_meta(address(other), "llm-serving", "starting", "gpu-node-2", "http", pod_labels, phase="Pending"),
    ]
    (tmp_path / "pods.json").write_text(json.dumps(groups))
    jobs = _load("infra/k8s/monitoring/scrape-configs.yaml")["scrape_configs"]
    for job in jobs:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["file_sd_configs"] = [{"files": [str(tmp_path / "pods.json")]}]
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs, "rule_files": [str(p) for p in RULE_FILES]}
    try:
        with prometheus_process(tmp_path, config) as url:
            check = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr
            deadline = time.monotonic() + 30
            while True:
                try:
                    series = httpx.get(f"{url}/api/v1/query", params={"query": "vllm:num_requests_running"}, timeout=2).json()["data"]["result"]
                except (httpx.HTTPError, ValueError, KeyError):
                    series = []
                if series or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            targets = httpx.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    finally:
        serving.shutdown()
        other.shutdown()
    [target] = [t for t in targets if t["scrapePool"] == render.SERVING_JOB]  # not the unlabelled pod, not the Pending one
    assert {k: target["labels"][k] for k in SCRAPE_LABELS} == {
        "namespace": "llm-serving", "pod": "chat-v1-3-0-abc", "deployment": "chat", "version": "1.3.0", "node": "gpu-node-1"}
    [sample] = series
    assert sample["metric"] == {"__name__": "vllm:num_requests_running", "job": render.SERVING_JOB, "instance": address(serving),
                                "namespace": "llm-serving", "pod": "chat-v1-3-0-abc", "deployment": "chat", "version": "1.3.0",
                                "node": "gpu-node-1", "model_name": "chat", "engine": "0"}
