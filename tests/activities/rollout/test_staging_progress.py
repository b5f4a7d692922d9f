"""What a staging attempt reports (activities/rollout/model_cache.py): every piece in the heartbeat,
with the rate of what this attempt fetched; to the rollout only at the bounded cadence."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from activities.rollout.model_cache import StagingProgress
from workflows.core.transfer import REPORT_MIN_SECONDS, DownloadProgress

MiB = 1024**2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _staged(pieces: list[tuple[float, str, int, int]]) -> tuple[list[dict], list[DownloadProgress]]:
    """Run (seconds later, uri, offset, fetched) advances in an activity; (heartbeats, reports)."""
    beats: list[dict] = []
    reports: list[DownloadProgress] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details[0])
    clock = Clock()

    def attempt() -> None:
        progress = StagingProgress(100 * MiB, reports.append, clock)
        for later, uri, offset, fetched in pieces:
            clock.now += later
            progress.advance(uri, offset, fetched)

    env.run(attempt)
    return beats, reports


def test_what_an_earlier_attempt_verified_counts_as_done_but_not_in_the_rate():
    beats, _ = _staged([(0, "s3://b/a", 40 * MiB, 0), (10, "s3://b/b", 20 * MiB, 20 * MiB)])
    assert [b["bytes_done"] for b in beats] == [40 * MiB, 60 * MiB]
    assert beats[-1]["bytes_per_second"] == 2 * MiB and beats[-1]["bytes_total"] == 100 * MiB
    assert beats[-1]["verified"] == {"s3://b/a": 40 * MiB, "s3://b/b": 20 * MiB}


def test_reports_reach_the_rollout_every_step_of_the_total_at_most_every_few_seconds():
    pieces = [(0.125, "s3://b/w", n * MiB, MiB) for n in range(1, 101)]  # 1 MiB each 1/8 s
    beats, reports = _staged(pieces)
    assert len(beats) == 100
    every = int(REPORT_MIN_SECONDS * 8)  # the 5 % step (5 MiB) comes sooner: the minimum interval rules
    assert [r.bytes_done for r in reports] == [every * MiB, 2 * every * MiB]
    assert reports[0].bytes_per_second == 8 * MiB and reports[0].eta_seconds == (100 - every) / 8
