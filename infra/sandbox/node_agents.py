"""The sandbox's node agents: each Node's weight cache, its chunk server, and its staging pods.

The API emulator runs no containers. What a node's cache DaemonSet and its staging Jobs' pods do
in production, an agent per sandbox Node does here with the same code (activities/node_cache/):
it keeps the node's cache in a directory of its own (``<root>/<node>``), serves its verified chunks
on a port of its own (asking the node cache's secret or a version's token, as the DaemonSet
does), published on the Node as the ``tideplane.io/node-cache-url`` annotation (as a
DaemonSet pod would), and runs every staging pod bound to its node from the pod's own arguments
(``node-cache stage --request JSON``), then reports the container's exit and its report to the
emulator's kubelet (``POST /sandbox/exit``), which ends the pod Succeeded or Failed. Prometheus
finds the agents' ``/metrics`` in ``<root>/targets.json`` (file-based service discovery).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import urllib.request
from pathlib import Path

from kubernetes import client

from activities.clients.s3 import S3Client
from activities.node_cache.access import TOKEN_ENV
from activities.node_cache.chunk_server import ChunkServer
from activities.node_cache.cache import NodeCache
from activities.node_cache.stager import NodeCacheStager, stage_args
from infra.sandbox.kubeclient import raw
from workflows.node_cache.contract import LABEL_COMPONENT, NODE_CACHE_URL_ANNOTATION, NODE_CACHE_JOB_COMPONENT

log = logging.getLogger("tideplane.node-agents")
TARGETS_FILE = "targets.json"  # Prometheus file_sd: the agents' /metrics (prometheus.yml.tmpl's node-cache job)


class NodeAgents:
    """One agent per registered Node; ``reconcile`` follows the Nodes and their staging pods."""

    def __init__(self, kube: client.ApiClient, kube_url: str, root: Path, s3: S3Client, secret: str | None = None) -> None:
        """``secret``: the node cache's (TIDEPLANE_NODE_CACHE_TOKEN); None: open chunk servers."""
        root.mkdir(parents=True, exist_ok=True)
        self.core = client.CoreV1Api(kube)
        self.exit_url = kube_url.rstrip("/") + "/sandbox/exit"
        self.root = root
        self.s3 = s3
        self.secret = secret
        self.servers: dict[str, ChunkServer] = {}
        self.started: set[str] = set()  # staging pod uids already run

    def reconcile(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in raw(self.core.list_node(_preload_content=False))["items"]}
        for name in [n for n in self.servers if n not in nodes]:  # the instance is gone, and its disk
            server = self.servers.pop(name)
            server.shutdown()
            server.server_close()
            shutil.rmtree(self.root / name, ignore_errors=True)
        targets = sorted(server.url.removeprefix("http://") for server in self.servers.values())
        for name, node in nodes.items():
            server = self.servers.get(name) or self._start(name)
            if (node["metadata"].get("annotations") or {}).get(NODE_CACHE_URL_ANNOTATION) != server.url:
                self.core.patch_node(name, {"metadata": {"annotations": {NODE_CACHE_URL_ANNOTATION: server.url}}})
        self._write_targets(targets)
        pods = raw(self.core.list_pod_for_all_namespaces(
            label_selector=f"{LABEL_COMPONENT}={NODE_CACHE_JOB_COMPONENT}", _preload_content=False))["items"]
        for pod in pods:
            uid, node = pod["metadata"]["uid"], pod["spec"].get("nodeName")
            if node in self.servers and pod["status"].get("phase") == "Running" and uid not in self.started:
                self.started.add(uid)
                threading.Thread(target=self._run, args=(pod, self.servers[node].cache), daemon=True).start()

    def _write_targets(self, before: list[str]) -> None:
        targets = sorted(server.url.removeprefix("http://") for server in self.servers.values())
        path = self.root / TARGETS_FILE
        if targets != before or not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps([{"targets": targets}]))
            tmp.replace(path)

    def _start(self, node: str) -> ChunkServer:
        server = ChunkServer(("127.0.0.1", 0), NodeCache(self.root / node), node, secret=self.secret)
        threading.Thread(target=server.serve_forever, name=f"chunks-{node}", daemon=True).start()
        self.servers[node] = server
        log.info("node agent of %s: cache %s, chunks on %s", node, self.root / node, server.url)
        return server

    def _run(self, pod: dict, cache: NodeCache) -> None:
        """The staging container: the real staging code from the pod's arguments and its version's
        token (the container's env); exit 0 with the report as termination message, or 1 with the error."""
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]
        token = next((e.get("value") for e in container.get("env") or [] if e["name"] == TOKEN_ENV), None)
        try:
            request = stage_args(container.get("args") or [])
            report = NodeCacheStager(cache, self.s3, token=token).stage(request)
            code, message = 0, report.model_dump_json()
        except Exception as exc:  # noqa: BLE001 - a container that fails exits 1 with its error
            log.warning("staging pod %s/%s failed: %s", meta["namespace"], meta["name"], exc)
            code, message = 1, f"{type(exc).__name__}: {exc}"
        body = json.dumps({"namespace": meta["namespace"], "name": meta["name"], "exitCode": code, "message": message})
        request = urllib.request.Request(self.exit_url, body.encode(), {"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except OSError as exc:
            log.warning("reporting the exit of %s/%s failed: %s", meta["namespace"], meta["name"], exc)

    def close(self) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()
