"""How far a transfer is, as plain values and as words: bytes per second, time left, sizes and
durations as people read them. Pure, so the weights download (activities/rollout/model_cache.py),
the rollout's status query and current details, and the CLI's progress lines all compute and say
it the same way."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, computed_field

# A download reports to its workflow (a signal, one history event each) only this often: after
# REPORT_STEP of the total and REPORT_MIN_SECONDS at least, and at least every REPORT_MAX_SECONDS
# while bytes flow, so a 2-hour download writes at most 20 + 24 signals, not one per chunk.
REPORT_STEP = 0.05
REPORT_MIN_SECONDS = 5.0
REPORT_MAX_SECONDS = 300.0


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


def rate(nbytes: float, seconds: float) -> float:
    """Bytes per second over ``seconds``; 0 before any time has passed."""
    return nbytes / seconds if seconds > 0 else 0.0


def eta(done: float, total: float | None, bytes_per_second: float) -> float | None:
    """Seconds left at ``bytes_per_second``; None when the total or the rate is unknown, or done."""
    if not total or bytes_per_second <= 0 or done >= total:
        return None
    return (total - done) / bytes_per_second


def describe(done: float, total: float | None, bytes_per_second: float) -> str:
    """``1.2 GiB of 16.0 GiB (7 %)  40.0 MiB/s  ETA 6m10s`` (no total: bytes and rate only)."""
    text = size(done)
    if total:
        text += f" of {size(total)} ({100 * done / total:.0f} %)"
    text += f"  {size(bytes_per_second)}/s"
    left = eta(done, total, bytes_per_second)
    if left is not None:
        text += f"  ETA {duration(left)}"
    return text


def report_due(bytes_since: float, seconds_since: float, total: float) -> bool:
    """Whether a transfer that moved ``bytes_since`` in ``seconds_since`` since its last report
    reports again (bounded: see REPORT_STEP)."""
    if seconds_since < REPORT_MIN_SECONDS or bytes_since <= 0:
        return False
    return seconds_since >= REPORT_MAX_SECONDS or bytes_since >= REPORT_STEP * total


class DownloadProgress(BaseModel):
    """The weights download as stage_weights last reported it (its heartbeat, and the
    ``staging_progress`` signal to the rollout)."""

    bytes_done: int = Field(ge=0, description="bytes staged, verified files of earlier attempts included")
    bytes_total: int = Field(ge=0)
    bytes_per_second: float = Field(0.0, ge=0, description="over the bytes this attempt fetched")
    reported_at: datetime | None = Field(None, description="when the rollout received it (workflow time)")

    @computed_field(description="seconds left at bytes_per_second; null when unknown or done")
    @property
    def eta_seconds(self) -> float | None:
        return eta(self.bytes_done, self.bytes_total, self.bytes_per_second)

    def describe(self) -> str:
        return "download " + describe(self.bytes_done, self.bytes_total, self.bytes_per_second)
