"""One weights file fetched resumably and verified, from any source that streams it in order.

The rollout's model cache (activities/rollout/rollout_activities.py: S3) and a node's chunk cache
(activities/node_cache/stager.py: a peer's chunk server, else S3) both stage through ``fetch_verified``.
It hashes while writing (no second pass over the data) and survives a crash or retry without
fetching again what it already verified: the file is written as ``<file>.partial`` in
``CHUNK_BYTES`` pieces and a sidecar ``<file>.partial.json`` records the source's tag (an S3
ETag, or the content digest for a peer) and the SHA-256 of every piece written. A retry re-reads
the local prefix (checking each piece against its recorded digest, which also rebuilds the running
file hash) and fetches only from the first unverified byte. hashlib state cannot be serialised,
which is why the prefix is re-hashed from local disk rather than carried in the checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Iterator

from activities.clients.s3 import CHUNK_BYTES


class ChecksumMismatch(Exception):
    """The fetched bytes do not have the expected SHA-256 (the partial download is discarded)."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"expected sha256 {expected}, actual {actual}")
        self.expected, self.actual = expected, actual


def fetch_verified(
    dest: Path,
    sha256: str,
    size: int,
    tag: str,
    stream: Callable[[int], Iterator[bytes]],
    advance: Callable[[int, int], object] = lambda offset, n: None,
) -> int:
    """Fetch ``dest`` from ``stream(offset)`` (the source's bytes from ``offset`` on, in order),
    resuming a verified prefix left by an earlier attempt against the same ``tag``; returns the
    bytes resumed. ``advance(offset, n)`` is told of every piece read (and of the resumed prefix, n 0).
    The finished file is renamed into place only once its SHA-256 matches."""
    partial = dest.with_name(dest.name + ".partial")
    sidecar = dest.with_name(dest.name + ".partial.json")
    hasher = hashlib.sha256()
    pieces = _resume_prefix(partial, sidecar, tag, hasher)
    offset = resumed = min(len(pieces) * CHUNK_BYTES, size)
    advance(offset, 0)
    with partial.open("ab") as out:
        for data in stream(offset):
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            hasher.update(data)
            pieces.append(hashlib.sha256(data).hexdigest())
            _write_sidecar(sidecar, tag, pieces)
            offset += len(data)
            advance(offset, len(data))
    actual = hasher.hexdigest()
    if actual != sha256:
        discard_partial(dest)
        raise ChecksumMismatch(sha256, actual)
    os.replace(partial, dest)
    verified_marker(dest).write_text(f"{actual} {size}\n")
    sidecar.unlink(missing_ok=True)
    return resumed


def _resume_prefix(partial: Path, sidecar: Path, tag: str, hasher) -> list[str]:
    """Re-hash the verified local prefix; return its piece digests (empty: start from zero).

    The prefix is trusted only if the source is unchanged (same tag) and every piece on disk
    still has the digest recorded when it was fetched; the file is truncated after the last good
    piece, so a torn write at crash time costs one piece, not the file.
    """
    try:
        state = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        state = None
    if not partial.exists() or not state or state.get("etag") != tag or state.get("chunk_bytes") != CHUNK_BYTES:
        partial.unlink(missing_ok=True)
        return []
    good: list[str] = []
    with partial.open("rb") as f:
        for expected in state.get("chunks", []):
            data = f.read(CHUNK_BYTES)
            if hashlib.sha256(data).hexdigest() != expected:
                break
            hasher.update(data)
            good.append(expected)
    with partial.open("r+b") as f:
        f.truncate(min(len(good) * CHUNK_BYTES, partial.stat().st_size))
    return good


def _write_sidecar(sidecar: Path, tag: str, pieces: list[str]) -> None:
    tmp = sidecar.with_suffix(".tmp")
    tmp.write_text(json.dumps({"etag": tag, "chunk_bytes": CHUNK_BYTES, "chunks": pieces}))
    os.replace(tmp, sidecar)


def discard_partial(dest: Path) -> None:
    """Remove a download of ``dest`` that will never complete, and its resume record."""
    dest.with_name(dest.name + ".partial").unlink(missing_ok=True)
    dest.with_name(dest.name + ".partial.json").unlink(missing_ok=True)


def verified_marker(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


def already_verified(dest: Path, sha256: str) -> int | None:
    """Size of a file fetched and verified by an earlier run against this digest, else None."""
    try:
        digest, size = verified_marker(dest).read_text().split()
        if digest == sha256 and dest.stat().st_size == int(size):
            return int(size)
    except (OSError, ValueError):
        pass
    return None
