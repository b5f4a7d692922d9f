"""A progress line for long CLI operations: bytes done, rate and time left, rewritten in place on
a terminal, silent when the output is not one (CI logs keep only the final summary)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO


def size(n: float) -> str:
    """Bytes as people read them: ``512 B``, ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


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
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        text = f"{self.what}: {size(self.done)}"
        if self.total:
            text += f" of {size(self.total)} ({100 * self.done / self.total:.0f} %)"
        text += f"  {size(rate)}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f"  ETA {duration((self.total - self.done) / rate)}"
        return text

    def _draw(self, now: float) -> None:
        text = self.render(now)
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)
