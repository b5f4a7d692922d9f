"""What Prometheus' Kubernetes pod discovery (prometheus/discovery/kubernetes/pod.go, a client-go
informer) asks the API server, asked of the emulator over plain HTTP: a cluster-wide list of pods
(``limit``, ``resourceVersion=0``) and a watch from the list's resourceVersion
(``allowWatchBookmarks``, ``timeoutSeconds``), with protobuf preferred and JSON accepted; and what
it reads off each pod: its IP, labels, node, phase, Ready condition and named container ports
(the shipped scrape jobs keep the port named ``http``; infra/k8s/monitoring/scrape-configs.yaml)."""

from __future__ import annotations

import json
import time
import urllib.request

from kubernetes import client

from tests.kube_fixtures import run_kube_api

NS = "llm-serving"
ACCEPT = "application/vnd.kubernetes.protobuf,application/json"


def _get(url: str, timeout: float = 10):
    request = urllib.request.Request(url, headers={"Accept": ACCEPT})
    return urllib.request.urlopen(request, timeout=timeout)


def _serving_pod(name: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "tideplane", "app.kubernetes.io/name": "chat",
                                              "app.kubernetes.io/version": "1.3.0", "tideplane.io/model": "llama"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                                 "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]}]},
    }


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def test_pods_list_and_watch_as_prometheus_kubernetes_discovery_reads_them():
    with run_kube_api(100) as url:
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=url)))
        core.create_namespace({"metadata": {"name": NS}})
        core.create_node({"metadata": {"name": "cpu-a", "labels": {"kubernetes.io/hostname": "cpu-a"}},
                          "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"}}})
        with _get(f"{url}/api/v1/pods?limit=500&resourceVersion=0") as answer:
            assert answer.headers["Content-Type"].startswith("application/json")  # JSON when protobuf is only preferred
            listed = json.load(answer)
        assert listed["kind"] == "PodList" and listed["items"] == []
        rv = listed["metadata"]["resourceVersion"]

        core.create_namespaced_pod(NS, _serving_pod("chat-a"))
        watch = _get(f"{url}/api/v1/pods?allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=5&watch=true", timeout=10)
        seen, deadline = [], time.monotonic() + 10
        for line in watch:
            event = json.loads(line)
            if event["type"] == "BOOKMARK":
                continue
            seen.append(event)
            if _ready(event["object"]) or time.monotonic() > deadline:
                break
        watch.close()
        assert seen[0]["type"] == "ADDED" and seen[0]["object"]["metadata"]["name"] == "chat-a"
        pod = seen[-1]["object"]
        assert _ready(pod) and pod["status"]["phase"] == "Running", seen
        # what the pod role turns into __meta_kubernetes_pod_* labels and the target address
        assert pod["status"]["podIP"] and pod["spec"]["nodeName"] == "cpu-a"
        assert pod["metadata"]["labels"]["app.kubernetes.io/version"] == "1.3.0"
        assert pod["spec"]["containers"][0]["ports"][0]["name"] == "http"
        with _get(f"{url}/api/v1/namespaces?limit=500&resourceVersion=0") as answer:
            assert NS in {n["metadata"]["name"] for n in json.load(answer)["items"]}
