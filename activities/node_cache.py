"""The node-local weight cache: chunks by digest, an index, peer-to-peer staging, and the Jobs that
stage a version onto every node of a pool.

On a node (the staging Job's pod, the cache DaemonSet's chunk server, or the sandbox's node agent
playing both), the cache is a directory::

    <root>/chunks/<sha256>                      one verified weights file, stored once
    <root>/versions/<model>/<version>/<name>    hard links to the chunks: what vLLM loads
    <root>/index.json                           versions -> chunks, bytes, last use (CacheIndex)

``stage_node`` brings one version in: chunks already present (from another version, or an earlier
attempt) are linked, not fetched; each missing chunk comes from a peer's chunk server when one
holds it, else from S3 — only by the node the rendezvous hash names (``origin_fetcher``), so N
nodes read each chunk from S3 about once — and every chunk is verified against its SHA-256 on the
way in (``fetch_verified``, resumable). Least recently used unpinned versions are evicted first
when a capacity is set. What to fetch, evict and from whom is decided by workflows/node_cache/chunks.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

import httpx
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, already_exists, label_selector
from activities.clients.s3 import CHUNK_BYTES, S3Client, parse_s3_uri
from activities.core.verified_file import ChecksumMismatch, already_verified, discard_partial, fetch_verified
from workflows.core.telemetry import NODE_CACHE_BYTES, NODE_CACHE_LAST_USED, NODE_CACHE_SERVED
from workflows.core.naming import GPU_RESOURCE, LABEL_MODEL, LABEL_VERSION, NODE_POOL
from workflows.node_cache import contract
from workflows.node_cache.contract import (
    LABEL_COMPONENT,
    NODE_CACHE_URL_ANNOTATION,
    NODE_STAGING_STATUS,
    START_NODE_STAGING,
    NODE_CACHE_JOB_COMPONENT,
    NodeCacheReport,
    NodeCacheRequest,
    NodeCacheProgress,
    NodeCacheStatus,
    Peer,
    StartNodeCacheInput,
)
from workflows.node_cache.chunks import (
    CachedVersion,
    CacheIndex,
    Chunk,
    EvictionPlan,
    cached_version_label,
    chunks_to_fetch,
    eviction_plan,
    fetch_order,
    next_fetch,
    version_key,
)

log = logging.getLogger(__name__)

PEER_TIMEOUT = httpx.Timeout(10.0, connect=2.0, read=60.0)
PEER_POLL_SECONDS = 0.2
LABEL_RUN = "tideplane.io/stage-run"
LABEL_NODE = "tideplane.io/node"


class NoRoom(Exception):
    """The version does not fit in the cache even after evicting every unpinned version."""


# ---- the cache on one node ---------------------------------------------------------------------


class NodeCache:
    """One node's cache directory; safe for several stagers at once (the index is updated under a lock)."""

    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.clock = clock

    def chunk_path(self, digest: str) -> Path:
        return self.root / "chunks" / digest

    def version_dir(self, model: str, version: str) -> Path:
        return self.root / "versions" / model / version

    def read_index(self) -> CacheIndex:
        try:
            return CacheIndex.model_validate_json((self.root / "index.json").read_text())
        except (OSError, ValueError):
            return CacheIndex()

    @contextlib.contextmanager
    def updating(self) -> Iterator[CacheIndex]:
        """The index, written back atomically when the block ends; one writer at a time."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / ".index.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            index = self.read_index()
            yield index
            tmp = self.root / "index.json.tmp"
            tmp.write_text(index.model_dump_json())
            os.replace(tmp, self.root / "index.json")

    def holds(self, digest: str) -> bool:
        return already_verified(self.chunk_path(digest), digest) is not None

    def add_chunk(self, digest: str, size: int) -> None:
        with self.updating() as index:
            index.chunks[digest] = size

    def add_version(self, model: str, version: str, chunks: list[Chunk]) -> Path:
        """Link the version's files to their chunks and record it as used now."""
        directory = self.version_dir(model, version)
        directory.mkdir(parents=True, exist_ok=True)
        for chunk in chunks:
            link = directory / chunk.name
            link.unlink(missing_ok=True)
            os.link(self.chunk_path(chunk.sha256), link)
        with self.updating() as index:
            index.versions[version_key(model, version)] = CachedVersion(
                model=model, version=version, chunks=chunks, last_used=self.clock()
            )
        return directory

    def evict(self, plan: EvictionPlan) -> None:
        with self.updating() as index:
            for key in plan.versions:
                cached = index.versions.pop(key, None)
                if cached is not None:
                    shutil.rmtree(self.version_dir(cached.model, cached.version), ignore_errors=True)
            for digest in plan.chunks:
                index.chunks.pop(digest, None)
                self.chunk_path(digest).unlink(missing_ok=True)
                self.chunk_path(digest).with_name(digest + ".sha256").unlink(missing_ok=True)


# ---- staging one version onto one node -----------------------------------------------------------


class NodeCacheStager:
    """``stage_node`` with its sources: S3 (the origin) and the peers' chunk servers."""

    def __init__(self, cache: NodeCache, s3: S3Client, http: httpx.Client | None = None) -> None:
        self.cache = cache
        self.s3 = s3
        self.http = http or httpx.Client(timeout=PEER_TIMEOUT)

    def stage(self, req: NodeCacheRequest) -> NodeCacheReport:
        started = time.monotonic()
        index = self.cache.read_index()
        origin: dict[str, tuple[str, str]] = {}  # sha256 -> (bucket, key)
        wanted = []
        for wf in req.files:
            bucket, key = parse_s3_uri(wf.uri)
            origin[wf.sha256] = (bucket, key)
            size = index.chunks.get(wf.sha256)
            if size is None:
                size = self.s3.boto.head_object(Bucket=bucket, Key=key)["ContentLength"]
            wanted.append(Chunk(name=PurePosixPath(key).name, sha256=wf.sha256, size_bytes=size))
        missing = chunks_to_fetch(index, wanted)
        plan = eviction_plan(index, wanted, req.capacity_bytes, {*req.pinned, version_key(req.model, req.version)})
        if not plan.fits:
            raise NoRoom(f"{version_key(req.model, req.version)} does not fit in {req.capacity_bytes} bytes beside the pinned versions")
        self.cache.evict(plan)

        stagers = req.stagers if req.node in req.stagers else [req.node]
        peers = {p.node: p for p in req.peers}
        pending = fetch_order(missing, req.node, stagers)
        refused: dict[str, set[str]] = {}  # sha256 -> peers that failed to serve it
        counts = {"origin": 0, "peer": 0}
        stalled_since: float | None = None
        while pending := [c for c in pending if not self.cache.holds(c.sha256)]:  # another stager here may have it
            holders = {d: [n for n in held if n not in refused.get(d, ())] for d, held in self._holders(req.peers).items()}
            stalled = stalled_since is not None and time.monotonic() - stalled_since >= req.peer_wait_seconds
            choice = next_fetch(pending, req.node, stagers, holders, stalled)
            if choice is None:  # its peers are reading the rest from the origin: wait for them to serve it
                stalled_since = stalled_since or time.monotonic()
                time.sleep(PEER_POLL_SECONDS)
                continue
            chunk, peer = choice
            if peer is None:
                self._from_origin(chunk, *origin[chunk.sha256])
                counts["origin"] += chunk.size_bytes
            elif self._from_peer(chunk, peers[peer]):
                counts["peer"] += chunk.size_bytes
            else:
                refused.setdefault(chunk.sha256, set()).add(peer)
                continue
            pending.remove(chunk)
            stalled_since = None
        self.cache.add_version(req.model, req.version, wanted)
        distinct = {c.sha256: c.size_bytes for c in wanted}
        return NodeCacheReport(
            node=req.node, model=req.model, version=req.version, size_bytes=sum(c.size_bytes for c in wanted),
            origin_bytes=counts["origin"], peer_bytes=counts["peer"],
            reused_bytes=sum(distinct.values()) - counts["origin"] - counts["peer"],
            evicted=plan.versions, seconds=time.monotonic() - started,
        )

    def _holders(self, peers: list[Peer]) -> dict[str, list[str]]:
        """sha256 -> the peers holding it verified (a peer that does not answer holds nothing)."""
        holders: dict[str, list[str]] = {}
        if not peers:
            return holders
        for peer in peers:
            try:
                response = self.http.get(f"{peer.url}/index")
                response.raise_for_status()
                chunks = CacheIndex.model_validate_json(response.content).chunks
            except (httpx.HTTPError, ValueError):
                continue
            for digest in chunks:
                holders.setdefault(digest, []).append(peer.node)
        return holders

    def _fetch(self, chunk: Chunk, stream: Callable[[int], Iterator[bytes]]) -> None:
        dest = self.cache.chunk_path(chunk.sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _chunk_lock(dest):
            if not self.cache.holds(chunk.sha256):
                fetch_verified(dest, chunk.sha256, chunk.size_bytes, chunk.sha256, stream)
        self.cache.add_chunk(chunk.sha256, chunk.size_bytes)

    def _from_origin(self, chunk: Chunk, bucket: str, key: str) -> None:
        etag = self.s3.boto.head_object(Bucket=bucket, Key=key)["ETag"]
        try:
            self._fetch(chunk, lambda start: self.s3.stream(bucket, key, etag, chunk.size_bytes, start=start))
        except ChecksumMismatch as exc:
            raise ApplicationError(f"checksum mismatch for s3://{bucket}/{key}: {exc}", type="ChecksumMismatch", non_retryable=True) from None

    def _from_peer(self, chunk: Chunk, peer: Peer) -> bool:
        """Fetch from one peer; False (and nothing kept) when it fails or sends other bytes."""

        def stream(start: int) -> Iterator[bytes]:
            with self.http.stream("GET", f"{peer.url}/chunks/{chunk.sha256}", headers={"Range": f"bytes={start}-"}) as response:
                response.raise_for_status()
                yield from response.iter_bytes(CHUNK_BYTES)

        try:
            self._fetch(chunk, stream)
        except (httpx.HTTPError, ChecksumMismatch) as exc:
            log.warning("chunk %s from peer %s failed (%s): reading it elsewhere", chunk.sha256[:12], peer.node, exc)
            discard_partial(self.cache.chunk_path(chunk.sha256))
            return False
        return True


@contextlib.contextmanager
def _chunk_lock(dest: Path):
    with dest.with_name(dest.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stage_args(argv: list[str]) -> NodeCacheRequest:
    """The staging container's arguments (``node-cache stage --request JSON``) as a request."""
    if argv[:3] != ["node-cache", "stage", "--request"] or len(argv) != 4:
        raise ValueError(f"expected: node-cache stage --request JSON, got {argv!r}")
    return NodeCacheRequest.model_validate_json(argv[3])


# ---- the chunk server (the DaemonSet's, and each sandbox node agent's) -----------------------------


class ChunkServer(ThreadingHTTPServer):
    """Serves a node's verified chunks to its peers, its index to the CLI and its content to Prometheus;
    it only reads the cache (the DaemonSet mounts it read-only)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], cache: NodeCache, node: str) -> None:
        super().__init__(address, _ChunkHandler)
        self.cache = cache
        self.node = node
        self.served_bytes = 0

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def cache_metrics(node: str, index: CacheIndex, served_bytes: int) -> str:
    """Prometheus text: what the node holds, per version, and what it served to peers."""
    versions = sorted(index.versions.values(), key=lambda v: (v.model, v.version))
    samples = {
        NODE_CACHE_BYTES: [((node, v.model, v.version), v.size_bytes) for v in versions],
        NODE_CACHE_LAST_USED: [((node, v.model, v.version), v.last_used) for v in versions],
        NODE_CACHE_SERVED: [((node,), served_bytes)],
    }
    lines = []
    for metric, rows in samples.items():
        lines += [f"# HELP {metric.name} {metric.description}", f"# TYPE {metric.name} {metric.kind}"]
        for values, value in rows:
            labels = ",".join(f'{k}="{v}"' for k, v in zip(metric.labels, values))
            lines.append(f"{metric.name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


class _ChunkHandler(BaseHTTPRequestHandler):
    server: ChunkServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args) -> None:
        log.debug(fmt, *args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        cache = self.server.cache
        if self.path == "/index":
            self._send(200, cache.read_index().model_dump_json().encode())
        elif self.path == "/metrics":
            text = cache_metrics(self.server.node, cache.read_index(), self.server.served_bytes)
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        elif self.path.startswith("/chunks/"):
            self._chunk(self.path.removeprefix("/chunks/"))
        elif self.path == "/healthz":
            self._send(200, b'{"status": "ok"}')
        else:
            self._send(404, b'{"error": "no such path"}')

    def _chunk(self, digest: str) -> None:
        cache = self.server.cache
        if len(digest) != 64 or not cache.holds(digest):  # only verified chunks, never a partial one
            self._send(404, b'{"error": "chunk not held"}')
            return
        path = cache.chunk_path(digest)
        size = path.stat().st_size
        start = 0
        if (ranged := self.headers.get("Range", "")).startswith("bytes="):
            start = int(ranged.removeprefix("bytes=").split("-")[0] or 0)
        self.send_response(206 if start else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        with path.open("rb") as f:
            f.seek(start)
            while data := f.read(1 << 20):
                self.wfile.write(data)
                self.server.served_bytes += len(data)


# ---- pre-staging: one Job per node ---------------------------------------------------------------


class NodeCacheActivities(contract.NodeCacheActivities):
    """Creates and reads the staging Jobs (in the rollout's serving namespace) with the worker's Kubernetes client."""

    def __init__(
        self, kube: KubeClient, image: str, cache_dir: Path,
        peer_url_template: str = "http://{node_ip}:8470", capacity_bytes: int | None = None,
    ) -> None:
        """``image``: the tideplane image the staging pods run; ``cache_dir``: the cache's hostPath on
        every node; ``peer_url_template``: a node's chunk server when its Node has no annotation."""
        self.kube = kube
        self.image = image
        self.cache_dir = cache_dir
        self.peer_url_template = peer_url_template
        self.capacity_bytes = capacity_bytes

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


def node_cache_index(url: str, http: httpx.Client | None = None) -> CacheIndex:
    """A node's cache index from its chunk server (the CLI's view of the node)."""
    response = (http or httpx.Client(timeout=PEER_TIMEOUT)).get(f"{url.rstrip('/')}/index")
    response.raise_for_status()
    return CacheIndex.model_validate_json(response.content)

