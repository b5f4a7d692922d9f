"""``NodeCacheActivities``: the Jobs that stage a version onto every node of a pool, one per node
(its pod runs ``tideplane node-cache stage``: stager.py), and each node's progress from its pod's
termination message; nodes that hold the version get its label, which serving pods prefer.

The node cache on a node is cache.py (the directory), stager.py (bringing a version in, from peers
and S3) and chunk_server.py (serving chunks to peers); what to fetch, evict and from whom is
decided by workflows/node_cache/chunks.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, already_exists, label_selector
from activities.node_cache.access import node_cache_token_env
from workflows.core.naming import GPU_RESOURCE, LABEL_MODEL, LABEL_VERSION, NODE_POOL
from workflows.node_cache import contract
from workflows.node_cache.chunks import cached_version_label, version_key
from workflows.node_cache.contract import (
    LABEL_COMPONENT,
    NODE_CACHE_JOB_COMPONENT,
    NODE_CACHE_URL_ANNOTATION,
    NODE_STAGING_STATUS,
    START_NODE_STAGING,
    NodeCacheProgress,
    NodeCacheReport,
    NodeCacheRequest,
    NodeCacheStatus,
    Peer,
    StartNodeCacheInput,
)


LABEL_RUN = "tideplane.io/stage-run"
LABEL_NODE = "tideplane.io/node"


# ---- the cache on one node ---------------------------------------------------------------------


# ---- staging one version onto one node -----------------------------------------------------------


# ---- the chunk server (the DaemonSet's, and each sandbox node agent's) -----------------------------


# ---- pre-staging: one Job per node ---------------------------------------------------------------


class NodeCacheActivities(contract.NodeCacheActivities):
    """Creates and reads the staging Jobs (in the rollout's serving namespace) with the worker's Kubernetes client."""

    def __init__(
        self, kube: KubeClient, image: str, cache_dir: Path,
        peer_url_template: str = "http://{node_ip}:8470", capacity_bytes: int | None = None,
        secret: str | None = None,
    ) -> None:
        """``image``: the tideplane image the staging pods run; ``cache_dir``: the cache's hostPath on
        every node; ``peer_url_template``: a node's chunk server when its Node has no annotation."""
        self.kube = kube
        self.image = image
        self.cache_dir = cache_dir
        self.peer_url_template = peer_url_template
        self.capacity_bytes = capacity_bytes
        self.secret = secret  # the node cache's secret: each staging Job gets its version's token from it (access.py)

    @activity.defn(name=START_NODE_STAGING)
    def start_node_staging(self, req: StartNodeCacheInput) -> NodeCacheStatus:
        self.kube.require_namespace(req.namespace)
        nodes = self._pool_nodes(req.pool)
        if not nodes:
            raise ApplicationError(f"no Ready node in pool {req.pool or '(GPU nodes)'} to stage onto", non_retryable=True)
        peers = [Peer(node=n.metadata.name, url=peer_url(n, self.peer_url_template)) for n in nodes]
        pinned = self._pinned(req.model)
        for node in nodes:
            name = node.metadata.name
            request = NodeCacheRequest(
                model=req.model, version=req.version, files=req.files, node=name,
                stagers=[p.node for p in peers], peers=[p for p in peers if p.node != name],
                pinned=pinned, capacity_bytes=self.capacity_bytes,
            )
            try:
                self.kube.batch.create_namespaced_job(req.namespace, self._job(req, name, request), _request_timeout=API_TIMEOUT)
            except ApiException as exc:
                if not already_exists(exc):  # AlreadyExists: an earlier attempt created it
                    raise
        return self.node_staging_status(req)

    @activity.defn(name=NODE_STAGING_STATUS)
    def node_staging_status(self, req: StartNodeCacheInput) -> NodeCacheStatus:
        selector = label_selector({LABEL_RUN: _run_label(req)})
        jobs = self.kube.batch.list_namespaced_job(req.namespace, label_selector=selector, _request_timeout=API_TIMEOUT).items
        pods = self.kube.core.list_namespaced_pod(req.namespace, label_selector=selector, _request_timeout=API_TIMEOUT).items
        nodes = []
        for job in sorted(jobs, key=lambda j: j.metadata.labels.get(LABEL_NODE, "")):
            node = job.spec.template.metadata.labels.get(LABEL_NODE, "")
            done = {c.type for c in (job.status.conditions or []) if c.status == "True"}
            mine = [p for p in pods if (p.metadata.labels or {}).get("job-name") == job.metadata.name]
            if "Complete" in done:
                nodes.append(NodeCacheProgress(node=node, state="staged", report=_report(mine)))
            elif "Failed" in done:
                nodes.append(NodeCacheProgress(node=node, state="failed", message=_last_message(mine)))
            else:
                running = any((p.status.phase or "") == "Running" for p in mine)
                nodes.append(NodeCacheProgress(node=node, state="staging" if running else "pending", message=_last_message(mine)))
        self._label_holders(req, [n.node for n in nodes if n.state == "staged"])
        return NodeCacheStatus(nodes=nodes)

    def _label_holders(self, req: StartNodeCacheInput, staged: list[str]) -> None:
        """Label the nodes that hold the version now (``cached_version_label``): the version's serving
        pods prefer them and load from their cache. A label outliving an eviction costs nothing but
        the preference: the pods' staging init container fetches what the node lacks."""
        if not staged:
            return
        label = cached_version_label(req.model, req.version)
        labelled = {n.metadata.name for n in self.kube.core.list_node(
            label_selector=label_selector({label: "true"}), _request_timeout=API_TIMEOUT).items}
        for node in sorted(set(staged) - labelled):
            try:
                self.kube.core.patch_node(node, {"metadata": {"labels": {label: "true"}}}, _request_timeout=API_TIMEOUT)
            except ApiException as exc:
                if exc.status != 404:  # the node left meanwhile
                    raise

    def _pool_nodes(self, pool: str | None) -> list:
        selector = label_selector({NODE_POOL: pool}) if pool else None
        found = self.kube.core.list_node(label_selector=selector, _request_timeout=API_TIMEOUT).items
        ready = []
        for node in found:
            conditions = {c.type: c.status for c in (node.status.conditions or [])}
            gpus = int((node.status.allocatable or {}).get(GPU_RESOURCE, "0"))
            if conditions.get("Ready") == "True" and not node.spec.unschedulable and (pool or gpus):
                ready.append(node)
        return sorted(ready, key=lambda n: n.metadata.name)

    def _pinned(self, model: str) -> list[str]:
        """Every version of the model with a Deployment in the cluster: serving, canary, or the previous
        stable kept at 0 replicas for the rollback window. None of them is evicted to make room."""
        deployments = self.kube.apps.list_deployment_for_all_namespaces(
            label_selector=label_selector({LABEL_MODEL: model}), _request_timeout=API_TIMEOUT
        ).items
        versions = {(d.metadata.labels or {}).get(LABEL_VERSION) for d in deployments}
        return sorted(version_key(model, v) for v in versions if v)

    def _job(self, req: StartNodeCacheInput, node: str, request: NodeCacheRequest) -> dict:
        labels = {LABEL_COMPONENT: NODE_CACHE_JOB_COMPONENT, LABEL_RUN: _run_label(req), LABEL_NODE: node}
        digest = hashlib.sha256(f"{req.run_id}/{node}".encode()).hexdigest()[:20]
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"stage-{digest}", "namespace": req.namespace, "labels": labels},
            "spec": {
                "backoffLimit": 3,
                "ttlSecondsAfterFinished": 24 * 3600,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{
                            "name": "stage",
                            "image": self.image,
                            "args": ["node-cache", "stage", "--request", request.model_dump_json()],
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                            **({"env": node_cache_token_env(self.secret, req.model, req.version)} if self.secret else {}),
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "volumeMounts": [{"name": "node-cache", "mountPath": str(self.cache_dir)}],
                        }],
                        "volumes": [{"name": "node-cache", "hostPath": {"path": str(self.cache_dir), "type": "DirectoryOrCreate"}}],
                        **({"initContainers": [pull_image_container(req.image)]} if req.image else {}),
                    },
                },
            },
        }


def pull_image_container(image: str) -> dict:
    """An init container that only makes the kubelet pull ``image`` onto the node (it exits at once)."""
    return {"name": "pull-serving-image", "image": image, "imagePullPolicy": "IfNotPresent", "command": ["true"],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}


def peer_url(node, template: str) -> str:
    """A Node's chunk server: its annotation, else ``template`` on its InternalIP."""
    annotated = (node.metadata.annotations or {}).get(NODE_CACHE_URL_ANNOTATION)
    if annotated:
        return annotated.rstrip("/")
    ip = next((a.address for a in node.status.addresses or [] if a.type == "InternalIP"), node.metadata.name)
    return template.format(node_ip=ip, node=node.metadata.name).rstrip("/")


def _run_label(req: StartNodeCacheInput) -> str:
    return hashlib.sha256(req.run_id.encode()).hexdigest()[:16]


def _terminated(pods: list) -> list:
    states = []
    for pod in sorted(pods, key=lambda p: p.metadata.creation_timestamp or 0):
        for cs in pod.status.container_statuses or []:
            if cs.state and cs.state.terminated:
                states.append(cs.state.terminated)
    return states


def _report(pods: list) -> NodeCacheReport | None:
    for terminated in reversed(_terminated(pods)):
        if terminated.exit_code == 0 and terminated.message:
            try:
                return NodeCacheReport.model_validate_json(terminated.message)
            except ValueError:
                return None
    return None


def _last_message(pods: list) -> str | None:
    states = _terminated(pods)
    return (states[-1].message or states[-1].reason) if states else None


