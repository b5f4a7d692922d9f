"""Who may read what from a node's chunk server. The node cache has one secret
(TIDEPLANE_NODE_CACHE_TOKEN on the DaemonSet and the worker); a staging pod gets only its
version's token, ``model@version:<HMAC-SHA256 of model@version with the secret>``, which a chunk
server checks with the secret alone (no list of grants to keep in step). The secret itself admits
every version (the worker's ``node-cache list``)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from workflows.node_cache.chunks import CacheIndex, version_key

TOKEN_ENV = "TIDEPLANE_NODE_CACHE_TOKEN"


@dataclass(frozen=True)
class Grant:
    """What a valid token admits: one version (``model@version``), or every version (None)."""

    version: str | None


def _mac(secret: str, key: str) -> str:
    return hmac.new(secret.encode(), key.encode(), hashlib.sha256).hexdigest()


def version_token(secret: str, model: str, version: str) -> str:
    """The token that admits a holder to ``model@version``'s chunks and nothing else."""
    key = version_key(model, version)
    return f"{key}:{_mac(secret, key)}"


def grant(secret: str | None, authorization: str | None) -> Grant | None:
    """What an ``Authorization`` header admits on a server holding ``secret``; None: nothing (401).
    A server without a secret is open (every version to anyone)."""
    if secret is None:
        return Grant(None)
    presented = (authorization or "").removeprefix("Bearer ")
    if not authorization or presented == authorization:
        return None
    if hmac.compare_digest(presented.encode(), secret.encode()):
        return Grant(None)
    key, _, mac = presented.rpartition(":")
    if key and hmac.compare_digest(mac.encode(), _mac(secret, key).encode()):
        return Grant(key)
    return None


def _version_digests(index: CacheIndex, key: str) -> set[str]:
    """A version's chunks as this node knows them: complete, or still being staged here (so that
    peers staging it at the same time share its chunks)."""
    digests = set(index.staging.get(key, []))
    if key in index.versions:
        digests |= {c.sha256 for c in index.versions[key].chunks}
    return digests


def admits(index: CacheIndex, admitted: Grant, digest: str) -> bool:
    """Whether the grant may fetch the chunk: it belongs to the grant's version (chunks are shared
    between versions, so a chunk of two versions is admitted to the tokens of both)."""
    return admitted.version is None or digest in _version_digests(index, admitted.version)


def visible_index(index: CacheIndex, admitted: Grant) -> CacheIndex:
    """The part of a node's index a grant may see: its version and that version's chunks only."""
    if admitted.version is None:
        return index
    key = admitted.version
    digests = _version_digests(index, key)
    return CacheIndex(
        versions={key: index.versions[key]} if key in index.versions else {},
        chunks={d: size for d, size in index.chunks.items() if d in digests},
        staging={key: index.staging[key]} if key in index.staging else {},
    )


def node_cache_token_env(secret: str | None, model: str, version: str) -> list[dict]:
    """The env of a pod staging ``model@version`` from peers: that version's token only."""
    if secret is None:
        return []
    return [{"name": TOKEN_ENV, "value": version_token(secret, model, version)}]
