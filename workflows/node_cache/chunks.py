"""A node's weight cache, content-addressed by chunk, and the pure decisions about it.

A chunk is one weights file as the registry manifest records it (``ManifestFile``: path, SHA-256,
size): the cache keeps each chunk once, under its digest, whatever versions use it, so a new
version that changes 2 of 30 files fetches 2 files. The index says which versions the node holds
(their files by name and digest), how many bytes, and when each was last used.

What to fetch, what to evict and whom to fetch from are plain functions of plain values here, so
the staging pod (activities/node_cache/stager.py), the unit tests and the staging benchmark share them.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

SHA256 = r"^[0-9a-f]{64}$"
PATH_SEGMENT = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"  # a model or version is a directory of the cache


def version_key(model: str, version: str) -> str:
    """How the index and the pin list name a version: ``model@version``."""
    return f"{model}@{version}"


CACHED_VERSION_LABEL_PREFIX = "cache.tideplane.io/"


def cached_version_label(model: str, version: str) -> str:
    """The Node label (value ``"true"``) saying the node's cache holds this version, which serving
    pods prefer in their node affinity. A label name allows no ``@`` and at most 63 characters, so
    it carries a digest of ``model@version``."""
    return CACHED_VERSION_LABEL_PREFIX + hashlib.sha256(version_key(model, version).encode()).hexdigest()[:40]


class Chunk(BaseModel):
    """One weights file of a version: its name in the version's directory and its content digest."""

    name: str = Field(min_length=1, pattern=r"^[^/\\]+$")
    sha256: str = Field(pattern=SHA256)
    size_bytes: int = Field(ge=0)


class CachedVersion(BaseModel):
    model: str = Field(pattern=PATH_SEGMENT)
    version: str = Field(pattern=PATH_SEGMENT)
    chunks: list[Chunk]
    last_used: float = Field(description="epoch seconds of the last staging or load of this version")

    @property
    def size_bytes(self) -> int:
        return sum(c.size_bytes for c in self.chunks)


class CacheIndex(BaseModel):
    """``<cache>/index.json``: versions by ``model@version`` and the chunks on disk by digest."""

    versions: dict[str, CachedVersion] = Field(default_factory=dict)
    chunks: dict[str, int] = Field(default_factory=dict, description="sha256 -> bytes of each verified chunk")
    staging: dict[str, list[str]] = Field(
        default_factory=dict, description="versions being staged here -> their chunks' digests (what their token admits meanwhile)"
    )

    @property
    def size_bytes(self) -> int:
        return sum(self.chunks.values())


def chunks_to_fetch(index: CacheIndex, wanted: list[Chunk]) -> list[Chunk]:
    """The wanted chunks whose content the node does not hold, each digest once, in order."""
    seen: set[str] = set()
    missing = []
    for chunk in wanted:
        if chunk.sha256 not in index.chunks and chunk.sha256 not in seen:
            seen.add(chunk.sha256)
            missing.append(chunk)
    return missing


class EvictionPlan(BaseModel):
    versions: list[str] = Field(default_factory=list, description="version keys to drop, least recently used first")
    chunks: list[str] = Field(default_factory=list, description="digests no kept version uses any more")
    fits: bool = Field(True, description="False: even after evicting every unpinned version the new one does not fit")


def eviction_plan(
    index: CacheIndex, wanted: list[Chunk], capacity_bytes: int | None, pinned: set[str]
) -> EvictionPlan:
    """Least recently used versions to evict so that ``wanted`` fits in ``capacity_bytes``.

    Pinned versions (stable, canary, previous stable, the one being staged) are never evicted; an
    evicted version's chunk is removed only when no kept version (nor ``wanted``) uses it — a chunk
    no version records yet (another stager's, in flight) is left alone. ``capacity_bytes`` None:
    unbounded, nothing to evict.
    """
    if capacity_bytes is None:
        return EvictionPlan()
    incoming = {c.sha256: c.size_bytes for c in wanted}
    kept = dict(index.versions)

    def usage() -> int:
        used = {c.sha256 for v in kept.values() for c in v.chunks} | set(incoming)
        return sum(index.chunks.get(d, incoming.get(d, 0)) for d in used)

    evicted = []
    for key in sorted(kept, key=lambda k: (kept[k].last_used, k)):
        if usage() <= capacity_bytes:
            break
        if key not in pinned:
            del kept[key]
            evicted.append(key)
    used = {c.sha256 for v in kept.values() for c in v.chunks} | set(incoming)
    freed = {c.sha256 for key in evicted for c in index.versions[key].chunks} - used
    return EvictionPlan(versions=evicted, chunks=sorted(freed), fits=usage() <= capacity_bytes)


def _score(node: str, digest: str) -> bytes:
    return hashlib.sha256(f"{node}/{digest}".encode()).digest()


def origin_fetcher(digest: str, nodes: list[str]) -> str:
    """The one node of ``nodes`` that fetches this chunk from object storage (rendezvous hashing:
    every node computes the same answer alone, the chunks spread evenly, and a node joining or
    leaving moves only its own share)."""
    return max(nodes, key=lambda node: _score(node, digest))


def pick_peer(digest: str, node: str, holders: list[str]) -> str | None:
    """The peer ``node`` fetches a chunk from among those holding it (None: no peer has it); spread
    by the same hashing so N nodes do not all read one peer."""
    others = [h for h in holders if h != node]
    return max(others, key=lambda peer: _score(f"{node}>{peer}", digest)) if others else None


def fetch_order(missing: list[Chunk], node: str, stagers: list[str]) -> list[Chunk]:
    """This node's own share (the chunks it fetches from the origin) first, then the rest, which
    its peers are fetching meanwhile and will serve, in an order of this node's own (hashed), so
    N nodes do not all ask for the same chunk from its first holder at once."""
    mine = [c for c in missing if origin_fetcher(c.sha256, stagers) == node]
    rest = sorted((c for c in missing if c not in mine), key=lambda c: _score(f"order/{node}", c.sha256))
    return mine + rest


def next_fetch(
    pending: list[Chunk], node: str, stagers: list[str], holders: dict[str, list[str]], stalled: bool
) -> tuple[Chunk, str | None] | None:
    """The next chunk ``node`` fetches and from where: a peer's name, or None for the origin.

    In ``pending``'s order (``fetch_order``: its own share first), the first chunk a peer holds
    (``holders``: sha256 -> nodes holding it verified) comes from that peer, or the first that is
    this node's to read from the origin. None: every other chunk is being read by its peers, wait
    for them to serve it — unless ``stalled`` (no peer served anything for a while: one may be
    gone), then the first pending chunk comes from the origin.
    """
    for chunk in pending:
        peer = pick_peer(chunk.sha256, node, holders.get(chunk.sha256, []))
        if peer is not None:
            return chunk, peer
        if origin_fetcher(chunk.sha256, stagers) == node:
            return chunk, None
    return (pending[0], None) if stalled and pending else None
