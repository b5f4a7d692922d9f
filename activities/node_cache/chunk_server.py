"""A node's chunk server (the cache DaemonSet's container, or the sandbox's node agent): its
verified chunks to peers, its index and the node cache's metrics (``/metrics``)."""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from activities.node_cache.access import Grant, admits, grant, visible_index
from activities.node_cache.cache import NodeCache
from activities.node_cache.stager import PEER_TIMEOUT
from workflows.core.telemetry import NODE_CACHE_BYTES, NODE_CACHE_LAST_USED, NODE_CACHE_SERVED
from workflows.node_cache.chunks import CacheIndex

log = logging.getLogger(__name__)


class ChunkServer(ThreadingHTTPServer):
    """Serves a node's verified chunks to its peers, its index to the CLI and its content to Prometheus;
    it only reads the cache (the DaemonSet mounts it read-only)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], cache: NodeCache, node: str, secret: str | None = None) -> None:
        """``secret``: the node cache's secret; with one, /index and /chunks answer only a bearer
        token it admits (access.py): a version's token sees that version's chunks only, the secret
        itself every version (the CLI); /metrics and /healthz stay open for Prometheus and probes."""
        super().__init__(address, _ChunkHandler)
        self.cache = cache
        self.node = node
        self.secret = secret
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
        if self.path == "/index" or self.path.startswith("/chunks/"):
            admitted = grant(self.server.secret, self.headers.get("Authorization"))
            if admitted is None:
                self._send(401, b'{"error": "Authorization: Bearer <this version\'s TIDEPLANE_NODE_CACHE_TOKEN> required"}')
            elif self.path == "/index":
                self._send(200, visible_index(cache.read_index(), admitted).model_dump_json().encode())
            else:
                self._chunk(self.path.removeprefix("/chunks/"), admitted)
        elif self.path == "/metrics":
            text = cache_metrics(self.server.node, cache.read_index(), self.server.served_bytes)
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        elif self.path == "/healthz":
            self._send(200, b'{"status": "ok"}')
        else:
            self._send(404, b'{"error": "no such path"}')

    def _chunk(self, digest: str, admitted: Grant) -> None:
        cache = self.server.cache
        if not admits(cache.read_index(), admitted, digest):
            self._send(403, b'{"error": "the token does not admit this chunk: it belongs to no version the token names"}')
            return
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


def node_cache_index(url: str, http: httpx.Client | None = None, token: str | None = None) -> CacheIndex:
    """A node's cache index from its chunk server (the CLI's view of the node)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = (http or httpx.Client(timeout=PEER_TIMEOUT)).get(f"{url.rstrip('/')}/index", headers=headers)
    response.raise_for_status()
    return CacheIndex.model_validate_json(response.content)
