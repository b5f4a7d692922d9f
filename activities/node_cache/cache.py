"""One node's weight cache on disk: chunks by digest, versions as hard links to them, an index::

    <root>/chunks/<sha256>                      one verified weights file, stored once
    <root>/versions/<model>/<version>/<name>    hard links to the chunks: what vLLM loads
    <root>/index.json                           versions -> chunks, bytes, last use (CacheIndex)

Safe for several stagers at once (the index is updated under a lock). What to fetch and what to
evict is decided by workflows/node_cache/chunks.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

from activities.core.verified_file import already_verified
from workflows.node_cache.chunks import CachedVersion, CacheIndex, Chunk, EvictionPlan, version_key




class NoRoom(Exception):
    """The version does not fit in the cache even after evicting every unpinned version."""


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

    def begin_version(self, model: str, version: str, chunks: list[Chunk]) -> None:
        """Record that the version is being staged here: its token admits peers to the chunks it
        has so far, before the version is complete (activities/node_cache/access.py)."""
        with self.updating() as index:
            index.staging[version_key(model, version)] = sorted({c.sha256 for c in chunks})

    def add_version(self, model: str, version: str, chunks: list[Chunk]) -> Path:
        """Link the version's files to their chunks and record it as used now."""
        directory = self.version_dir(model, version)
        directory.mkdir(parents=True, exist_ok=True)
        for chunk in chunks:
            link = directory / chunk.name
            link.unlink(missing_ok=True)
            os.link(self.chunk_path(chunk.sha256), link)
        with self.updating() as index:
            index.staging.pop(version_key(model, version), None)
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
