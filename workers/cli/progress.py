"""A progress line for long CLI operations: a bar, bytes done, rate and time left, rewritten in place on
a terminal, silent when the output is not one (CI logs keep only the final summary)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO

from workflows.core.transfer import describe, rate


def bar(done: float, total: float, width: int = 20) -> str:
    """``[#####...............]``: the done share of ``width`` cells."""
    filled = min(width, int(width * done / total)) if total > 0 else 0
    return "[" + "#" * filled + "." * (width - filled) + "]"


def progress_text(done: float, total: float | None, bytes_per_second: float) -> str:
    """``[#####...] 4.0 GiB of 16.0 GiB (25 %)  40.0 MiB/s  ETA 5m07s`` (no total: no bar)."""
    text = describe(done, total, bytes_per_second)
    return f"{bar(done, total)} {text}" if total else text


class ProgressLine:
    """Call with a byte count as bytes are processed (from any thread); ``close`` ends the line.

    ``total`` None: bytes and rate only. Redrawn at most every ``interval`` seconds.
    """

    def __init__(
        self,
        what: str,
        total: int | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 0.1,
    ) -> None:
        self.what, self.total = what, total
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.clock, self.interval = clock, interval
        self.started = self.drawn = clock()
        self.done = 0
        self._lock = threading.Lock()
        self._width = 0

    def __call__(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = self.clock()
            if self.enabled and now - self.drawn >= self.interval:
                self.drawn = now
                self._draw(now)

    def close(self) -> None:
        if self.enabled:
            with self._lock:
                self._draw(self.clock())
                self.stream.write("\n")
                self.stream.flush()

    def render(self, now: float) -> str:
        return f"{self.what}: {progress_text(self.done, self.total, rate(self.done, now - self.started))}"

    def _draw(self, now: float) -> None:
        text = self.render(now)
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)
