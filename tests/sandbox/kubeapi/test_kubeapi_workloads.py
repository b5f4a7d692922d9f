"""Deployments own ReplicaSets that own pods; rollout history and undo; rollout conditions; Jobs
and DaemonSets.

Through the official client and the stock kubectl against one emulated cluster (time scale 100:
sandbox seconds pass 100 times faster) for the module, each test in a namespace of its own.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from activities.clients.kube import KubeClient
from activities.rollout.serving_pods import DELETION_COST, mark_deletion_costs
from tests.kube_fixtures import emulated_cluster, kube_wait as wait, namespace_for
from workflows.core.naming import GPU_RESOURCE
from workflows.node_cache.contract import LABEL_COMPONENT, NODE_CACHE_JOB_COMPONENT


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A cluster with two 8-GPU nodes."""
    with emulated_cluster(tmp_path_factory.mktemp("kubectl")) as cluster:
        core = client.CoreV1Api(cluster.api)
        for name in ("gpu-a", "gpu-b"):
            core.create_node({"metadata": {"name": name}, "status": {"allocatable": {GPU_RESOURCE: "8", "pods": "110"}}})
        core.create_namespaced_config_map("tideplane-sandbox", {
            "metadata": {"name": "fleet-profiles"},
            "data": {"default": json.dumps({"load_seconds": 1}), "slow": json.dumps({"load_seconds": 100000}),
                     "crash": json.dumps({"crash_on_start": True})}})
        yield cluster


@pytest.fixture
def ns(cluster, request) -> str:
    return namespace_for(cluster.api, request)


def deployment(name: str, image: str, replicas: int = 2, model: str = "chat", **spec) -> dict:
    labels = {"app": name, "tideplane.io/model": model}
    return {"metadata": {"name": name}, "spec": {
        "replicas": replicas, "selector": {"matchLabels": {"app": name}}, **spec,
        "template": {"metadata": {"labels": labels},
                     "spec": {"containers": [{"name": "vllm", "image": image,
                                              "resources": {"limits": {GPU_RESOURCE: "1"}}}]}}}}


def complete(apps: client.AppsV1Api, name: str, ns: str) -> bool:
    dep = apps.read_namespaced_deployment(name, ns)
    status = dep.status
    return (status.observed_generation == dep.metadata.generation and status.updated_replicas == dep.spec.replicas
            and status.available_replicas == dep.spec.replicas == status.replicas)


def test_replica_sets_history_and_undo(cluster, ns):
    api, kubectl = cluster.api, cluster.kubectl
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment(ns, deployment("chat", "vllm:1"))
    wait(lambda: complete(apps, "chat", ns), "revision 1 rolled out")
    apps.patch_namespaced_deployment("chat", ns, {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "image": "vllm:2"}]}}}})
    wait(lambda: complete(apps, "chat", ns), "revision 2 rolled out")

    rss = {rs.metadata.annotations["deployment.kubernetes.io/revision"]: rs
           for rs in apps.list_namespaced_replica_set(ns).items}
    assert set(rss) == {"1", "2"}
    assert (rss["1"].spec.replicas, rss["2"].spec.replicas) == (0, 2)
    assert rss["2"].metadata.owner_references[0].kind == "Deployment"
    assert rss["2"].status.ready_replicas == 2
    pods = [p for p in core.list_namespaced_pod(ns).items if not p.metadata.deletion_timestamp]
    assert {p.metadata.owner_references[0].name for p in pods} == {rss["2"].metadata.name}

    table = kubectl("get", "rs", "-n", ns)
    assert table.returncode == 0, table.stderr
    assert table.stdout.split("\n")[0].split() == ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]
    history = kubectl("rollout", "history", "deployment/chat", "-n", ns)
    assert history.returncode == 0, history.stderr
    assert [line.split()[0] for line in history.stdout.splitlines()[2:] if line.strip()] == ["1", "2"]

    undo = kubectl("rollout", "undo", "deployment/chat", "-n", ns)
    assert undo.returncode == 0, undo.stderr
    wait(lambda: complete(apps, "chat", ns)
         and apps.read_namespaced_deployment("chat", ns).spec.template.spec.containers[0].image == "vllm:1",
         "the undo rolled out")
    wait(lambda: {p.spec.containers[0].image for p in core.list_namespaced_pod(ns).items} == {"vllm:1"},
         "the old pods to finish Terminating")
    revisions = {rs.metadata.name: rs.metadata.annotations["deployment.kubernetes.io/revision"]
                 for rs in apps.list_namespaced_replica_set(ns).items}
    assert revisions == {rss["1"].metadata.name: "3", rss["2"].metadata.name: "2"}  # revision 1 came back as 3
    status = kubectl("rollout", "status", "deployment/chat", "-n", ns, "--timeout=10s")
    assert status.returncode == 0 and "successfully rolled out" in status.stdout


def test_min_ready_seconds_delays_availability(cluster, ns):
    apps = client.AppsV1Api(cluster.api)
    apps.create_namespaced_deployment(ns, deployment("chat", "vllm:1", replicas=1, minReadySeconds=200))
    wait(lambda: apps.read_namespaced_deployment("chat", ns).status.ready_replicas == 1, "ready")
    status = apps.read_namespaced_deployment("chat", ns).status
    assert not status.available_replicas  # 200 sandbox seconds = 2 s after Ready
    available = next(c for c in status.conditions if c.type == "Available")
    assert (available.status, available.reason) == ("False", "MinimumReplicasUnavailable")
    wait(lambda: apps.read_namespaced_deployment("chat", ns).status.available_replicas == 1, "available", 5)


def test_progress_deadline_exceeded(cluster, ns):
    """A version whose pods never become Ready: Progressing False/ProgressDeadlineExceeded after
    progressDeadlineSeconds, as `kubectl rollout status` reports."""
    api, kubectl = cluster.api, cluster.kubectl
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment(ns, deployment("chat", "vllm:1", replicas=1, model="slow",
                                                     progressDeadlineSeconds=100))

    def progressing():
        conditions = apps.read_namespaced_deployment("chat", ns).status.conditions or []
        return next((c for c in conditions if c.type == "Progressing"), None)

    assert progressing().reason in ("NewReplicaSetCreated", "ReplicaSetUpdated")
    wait(lambda: progressing().reason == "ProgressDeadlineExceeded", "the progress deadline", 5)
    cond = progressing()
    assert cond.status == "False" and cond.message.endswith("has timed out progressing.")
    status = kubectl("rollout", "status", "deployment/chat", "-n", ns, "--timeout=5s")
    assert status.returncode == 1 and "exceeded its progress deadline" in status.stderr


def test_deleting_a_deployment_takes_its_replica_sets_and_pods(cluster, ns):
    apps, core = client.AppsV1Api(cluster.api), client.CoreV1Api(cluster.api)
    apps.create_namespaced_deployment(ns, deployment("chat", "vllm:1"))
    wait(lambda: len(core.list_namespaced_pod(ns).items) == 2, "pods")
    apps.delete_namespaced_deployment("chat", ns)
    wait(lambda: not apps.list_namespaced_replica_set(ns).items and not core.list_namespaced_pod(ns).items,
         "replica sets and pods gone")


def test_a_replica_set_of_its_own_keeps_its_replicas(cluster, ns):
    apps, core = client.AppsV1Api(cluster.api), client.CoreV1Api(cluster.api)
    rs = deployment("solo", "vllm:1", replicas=3)
    apps.create_namespaced_replica_set(ns, rs)
    wait(lambda: len(core.list_namespaced_pod(ns).items) == 3, "3 pods")
    apps.patch_namespaced_replica_set_scale("solo", ns, {"spec": {"replicas": 1}})
    wait(lambda: len(core.list_namespaced_pod(ns).items) == 1, "scaled to 1")


def job(name: str, model: str, **spec) -> dict:
    return {"metadata": {"name": name}, "spec": {**spec, "template": {
        "metadata": {"labels": {"tideplane.io/model": model}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "stage", "image": "stager:1"}]}}}}


def job_conditions(batch: client.BatchV1Api, name: str, ns: str) -> dict[str, str]:
    return {c.type: c.reason for c in batch.read_namespaced_job(name, ns).status.conditions or [] if c.status == "True"}


def test_jobs_run_to_completion_or_fail_after_the_backoff_limit(cluster, ns):
    api, kubectl = cluster.api, cluster.kubectl
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job(ns, job("stage-weights", "chat", completions=3, parallelism=2))
    wait(lambda: "Complete" in job_conditions(batch, "stage-weights", ns), "the job to complete")
    status = batch.read_namespaced_job("stage-weights", ns).status
    assert (status.succeeded, status.failed, status.active) == (3, None, None)
    pods = core.list_namespaced_pod(ns, label_selector="job-name=stage-weights").items
    assert len(pods) == 3 and {p.status.phase for p in pods} == {"Succeeded"}
    assert pods[0].status.container_statuses[0].state.terminated.reason == "Completed"

    batch.create_namespaced_job(ns, job("broken", "crash", backoffLimit=1))
    wait(lambda: job_conditions(batch, "broken", ns).get("Failed") == "BackoffLimitExceeded", "the job to fail")
    assert batch.read_namespaced_job("broken", ns).status.failed == 2
    assert kubectl("get", "jobs", "-n", ns).returncode == 0


def test_daemon_set_runs_a_pod_per_node(cluster, ns):
    api, kubectl = cluster.api, cluster.kubectl
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    ds = deployment("cache", "cache:1")
    del ds["spec"]["replicas"]
    apps.create_namespaced_daemon_set(ns, ds)

    def on_nodes(image: str) -> list[str]:
        return sorted(p.spec.node_name for p in core.list_namespaced_pod(ns).items
                      if p.spec.containers[0].image == image and not p.metadata.deletion_timestamp and p.spec.node_name)

    wait(lambda: on_nodes("cache:1") == ["gpu-a", "gpu-b"], "a pod on each node")
    wait(lambda: apps.read_namespaced_daemon_set("cache", ns).status.number_ready == 2, "both Ready")
    assert apps.read_namespaced_daemon_set("cache", ns).status.desired_number_scheduled == 2
    apps.patch_namespaced_daemon_set("cache", ns, {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "image": "cache:2"}]}}}})
    wait(lambda: on_nodes("cache:2") == ["gpu-a", "gpu-b"], "the new template on each node")
    assert kubectl("rollout", "status", "daemonset/cache", "-n", ns, "--timeout=10s").returncode == 0


def test_scale_down_takes_the_replica_on_the_least_loaded_node(cluster, ns):
    """The ReplicaSet controller honours pod-deletion-cost (lower goes first) as Kubernetes does, and
    the product's mark_deletion_costs prices each replica by the other model pods on its node."""
    api = cluster.api
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment(ns, deployment("spread", "vllm:1", replicas=2))
    wait(lambda: complete(apps, "spread", ns), "one replica per node (the scheduler spreads a set)")
    where = {p.spec.node_name for p in core.list_namespaced_pod(ns, label_selector="app=spread").items}
    assert where == {"gpu-a", "gpu-b"}

    def model_pods() -> dict[str, int]:  # earlier tests' pods count too
        pods = core.list_pod_for_all_namespaces(label_selector="tideplane.io/model").items
        return {n: sum(1 for p in pods if p.spec.node_name == n and not p.metadata.deletion_timestamp) for n in where}

    busy = max(sorted(where), key=model_pods().get)  # made busier still
    core.create_namespaced_pod(ns, {"metadata": {"name": "other", "labels": {"tideplane.io/model": "other"}},
                                    "spec": {"nodeName": busy, "containers": [{"name": "vllm", "image": "vllm:1"}]}})
    mark_deletion_costs(KubeClient(api), ns, "app=spread")
    costs = {p.spec.node_name: p.metadata.annotations[DELETION_COST] for p in core.list_namespaced_pod(ns, label_selector="app=spread").items}
    assert costs == {n: str(count - 1) for n, count in model_pods().items()}, "the other model pods on its node"
    apps.patch_namespaced_deployment_scale("spread", ns, {"spec": {"replicas": 1}})
    wait(lambda: complete(apps, "spread", ns) and len(core.list_namespaced_pod(ns, label_selector="app=spread").items) == 1,
         "scaled down to one")
    [kept] = core.list_namespaced_pod(ns, label_selector="app=spread").items
    assert kept.spec.node_name == busy, "the replica alone on its node went: that node can empty"


def test_a_node_cache_staging_pod_runs_until_its_node_agent_reports_the_exit(cluster, ns):
    """The node agent (infra/sandbox/node_agents.py) runs a staging Job's pod; the kubelet holds it
    Running until the agent's POST /sandbox/exit, then ends it with the report as termination message."""
    batch, core = client.BatchV1Api(cluster.api), client.CoreV1Api(cluster.api)
    staging = job("stage-node", "chat", backoffLimit=0)
    staging["spec"]["template"]["metadata"]["labels"][LABEL_COMPONENT] = NODE_CACHE_JOB_COMPONENT
    staging["spec"]["template"]["spec"]["containers"][0]["args"] = ["node-cache", "stage", "--request", "{}"]
    for name in ("stage-node", "stage-node-bad"):
        batch.create_namespaced_job(ns, {**staging, "metadata": {"name": name}})

    def running(name: str) -> str | None:
        pods = core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
        return pods[0].metadata.name if pods and pods[0].status.phase == "Running" else None

    good, bad = wait(lambda: running("stage-node"), "the pod Running"), wait(lambda: running("stage-node-bad"), "Running")
    time.sleep(0.2)  # 20x past the profile's 1 s load at the cluster's time scale: still running
    assert running("stage-node") == good

    def exit_(name: str, code: int, message: str) -> int:
        body = json.dumps({"namespace": ns, "name": name, "exitCode": code, "message": message}).encode()
        request = urllib.request.Request(f"{cluster.url}/sandbox/exit", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status

    assert exit_(good, 0, '{"origin_bytes": 3}') == 200 and exit_(bad, 1, "NoRoom: full") == 200
    wait(lambda: "Complete" in job_conditions(batch, "stage-node", ns), "the job complete")
    wait(lambda: "Failed" in job_conditions(batch, "stage-node-bad", ns), "the other failed")
    terminated = core.read_namespaced_pod(good, ns).status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.message) == (0, '{"origin_bytes": 3}')
    failed = core.read_namespaced_pod(bad, ns).status.container_statuses[0].state.terminated
    assert (failed.exit_code, failed.message) == (1, "NoRoom: full")
    with pytest.raises(urllib.error.HTTPError):  # a pod the agent does not run cannot be ended this way
        exit_(good, 0, "again")
