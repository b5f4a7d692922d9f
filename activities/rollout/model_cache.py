"""The shared model cache that serving pods mount: where a version's weights are staged
(``<model_cache_dir>/<model>/<version>/``), one stager at a time per directory, and the progress a
staging attempt heartbeats."""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError


def safe_component(value: str, field: str) -> str:
    if not value or value in {".", ".."} or "/" in value or "\\" in value:
        raise ApplicationError(f"{field} {value!r} cannot be a directory name in the model cache", non_retryable=True)
    return value


class StagingProgress:
    """Bytes staged across all files, reported as heartbeat details (survive into the next attempt)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.resumed = 0
        self.files: dict[str, int] = {}

    def advance(self, uri: str, offset: int, nbytes: int) -> None:
        self.done += nbytes
        self.files[uri] = offset
        activity.heartbeat({"bytes_done": self.done, "bytes_total": self.total, "verified": self.files})


@contextlib.contextmanager
def staging_lock(directory: Path):
    """One attempt at a time per version: an attempt Temporal timed out may still be writing."""
    with (directory.parent / f".{directory.name}.staging.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ApplicationError(f"{directory} is being staged by another attempt; retrying later") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
