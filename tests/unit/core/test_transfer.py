"""Transfer progress as values and words (workflows/core/transfer.py): the rate, the time left,
how a download reads, and how seldom it reports to its workflow."""

from __future__ import annotations

import pytest

from workflows.core.transfer import (
    REPORT_MAX_SECONDS,
    REPORT_MIN_SECONDS,
    DownloadProgress,
    describe,
    eta,
    rate,
    report_due,
)

GiB = 1024**3


def test_rate_is_bytes_over_seconds_and_zero_before_time_passes():
    assert rate(100 * 1024**2, 4.0) == 25 * 1024**2
    assert rate(5, 0.0) == 0.0


@pytest.mark.parametrize(
    ("done", "total", "bps", "left"),
    [(4 * GiB, 16 * GiB, 40 * 1024**2, 307.2), (16, 16, 1.0, None), (1, None, 1.0, None), (1, 16, 0.0, None)],
)
def test_eta_is_what_is_left_at_the_rate_and_unknown_without_rate_or_total(done, total, bps, left):
    assert eta(done, total, bps) == left


def test_a_download_reads_bytes_of_total_percent_rate_and_eta():
    assert describe(4 * GiB, 16 * GiB, 40 * 1024**2) == "4.0 GiB of 16.0 GiB (25 %)  40.0 MiB/s  ETA 5m07s"
    assert describe(600 * 1024**2, None, 5 * 1024**2) == "600.0 MiB  5.0 MiB/s"
    assert describe(16 * GiB, 16 * GiB, 40 * 1024**2) == "16.0 GiB of 16.0 GiB (100 %)  40.0 MiB/s"


def test_download_progress_carries_its_eta_in_its_json():
    progress = DownloadProgress(bytes_done=4 * GiB, bytes_total=16 * GiB, bytes_per_second=40 * 1024**2)
    assert progress.model_dump(mode="json")["eta_seconds"] == pytest.approx(307.2)
    assert DownloadProgress.model_validate(progress.model_dump(mode="json")) == progress
    assert progress.describe() == "download 4.0 GiB of 16.0 GiB (25 %)  40.0 MiB/s  ETA 5m07s"


def test_reports_wait_for_a_step_of_the_total_and_never_come_faster_than_the_minimum():
    total = 100 * GiB
    assert not report_due(4 * GiB, 60.0, total), "under 5 % and under the maximum interval"
    assert report_due(5 * GiB, REPORT_MIN_SECONDS, total)
    assert not report_due(50 * GiB, REPORT_MIN_SECONDS - 0.1, total), "a fast download still waits"
    assert report_due(1, REPORT_MAX_SECONDS, total), "a slow download still reports"
    assert not report_due(0, 10 * REPORT_MAX_SECONDS, total), "a stalled one has nothing new"


def test_a_two_hour_download_reports_a_bounded_number_of_times():
    """Chunk by chunk (8 MiB) over two hours at a steady rate: reports stay within 20 + 24."""
    total, chunk, seconds = 100 * GiB, 8 * 1024**2, 7200.0
    chunks = total // chunk
    reports, last_bytes, last_at = 0, 0, 0.0
    for n in range(1, chunks + 1):
        now = seconds * n / chunks
        if report_due(n * chunk - last_bytes, now - last_at, total):
            reports, last_bytes, last_at = reports + 1, n * chunk, now
    assert 1 <= reports <= 20 + seconds / REPORT_MAX_SECONDS
