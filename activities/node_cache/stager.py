"""``NodeCacheStager`` brings one version into a node's cache (the staging Job's pod runs it):
chunks already present (from another version, or an earlier attempt) are linked, not fetched;
each missing chunk comes from a peer's chunk server when one holds it, else from S3 — only by the
node the rendezvous hash names (``origin_fetcher``), so N nodes read each chunk from S3 about
once — and every chunk is verified against its SHA-256 on the way in (``fetch_verified``,
resumable). Least recently used unpinned versions are evicted first when a capacity is set.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

import httpx
from temporalio.exceptions import ApplicationError

from activities.clients.s3 import CHUNK_BYTES, S3Client, parse_s3_uri
from activities.core.verified_file import ChecksumMismatch, discard_partial, fetch_verified
from activities.node_cache.cache import NodeCache, NoRoom
from workflows.node_cache.chunks import (
    CacheIndex,
    Chunk,
    chunks_to_fetch,
    eviction_plan,
    fetch_order,
    next_fetch,
    version_key,
)
from workflows.node_cache.contract import NodeCacheReport, NodeCacheRequest, Peer

log = logging.getLogger(__name__)


PEER_TIMEOUT = httpx.Timeout(10.0, connect=2.0, read=60.0)
PEER_POLL_SECONDS = 0.2


class NodeCacheStager:
    """``stage_node`` with its sources: S3 (the origin) and the peers' chunk servers."""

    def __init__(self, cache: NodeCache, s3: S3Client, http: httpx.Client | None = None, token: str | None = None) -> None:
        """``token``: this version's chunk-server token (TIDEPLANE_NODE_CACHE_TOKEN, access.py), sent as a bearer token."""
        self.cache = cache
        self.s3 = s3
        self.http = http or httpx.Client(timeout=PEER_TIMEOUT)
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

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
        self.cache.begin_version(req.model, req.version, wanted)

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
