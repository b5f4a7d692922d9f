"""The shared model cache that serving pods mount: where a version's weights are staged
(``<model_cache_dir>/<model>/<version>/``), one stager at a time per directory, and the progress a
staging attempt heartbeats."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows.core.transfer import DownloadProgress, rate, report_due


def safe_component(value: str, field: str) -> str:
    if not value or value in {".", ".."} or "/" in value or "\\" in value:
        raise ApplicationError(f"{field} {value!r} cannot be a directory name in the model cache", non_retryable=True)
    return value


class StagingProgress:
    """Bytes staged across all files, heartbeated (the details survive into the next attempt; the
    CLI reads them) and, at a bounded rate (transfer.report_due), handed to ``report``: the
    worker signals them to the rollout, whose status and current details show them."""

    def __init__(
        self,
        total: int,
        report: Callable[[DownloadProgress], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.resumed = 0
        self.files: dict[str, int] = {}
        self.report, self.clock = report, clock
        self.started = self.reported_at = clock()
        self.fetched = self.fetched_at_report = 0

    @property
    def done(self) -> int:
        return sum(self.files.values())

    def advance(self, uri: str, offset: int, fetched: int) -> None:
        """``uri`` is verified up to ``offset``, ``fetched`` of those bytes read now (0 for what an
        earlier attempt left)."""
        self.files[uri] = offset
        self.fetched += fetched
        now = self.clock()
        progress = DownloadProgress(
            bytes_done=self.done, bytes_total=self.total, bytes_per_second=rate(self.fetched, now - self.started)
        )
        activity.heartbeat({**progress.model_dump(include={"bytes_done", "bytes_total", "bytes_per_second"}), "verified": self.files})
        if self.report is not None and report_due(self.fetched - self.fetched_at_report, now - self.reported_at, self.total):
            self.reported_at, self.fetched_at_report = now, self.fetched
            self.report(progress)


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
