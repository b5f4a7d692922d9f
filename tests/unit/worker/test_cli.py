"""The tideplane command's own behaviour that needs no server: what its log shows, how it counts."""

from __future__ import annotations

import subprocess
import sys

from workers.cli.wording import counted

LOG_SOME_LINES = """
import logging
from workers.cli.main import configure_logging
configure_logging()
logging.getLogger("httpx").info("HTTP Request: POST http://fleet/v1/completions 200 OK")
logging.getLogger("urllib3.connectionpool").info("Starting new HTTP connection (1): prometheus")
logging.getLogger("kubernetes.client.rest").info("response body")
logging.getLogger("botocore.credentials").info("Found credentials in environment variables.")
logging.getLogger("httpx").warning("HTTP client warning stays")
logging.getLogger("tideplane.worker").info("worker polling task queue 'tideplane'")
"""


def test_worker_log_keeps_tideplane_lines_and_drops_http_client_info():
    """The worker log used to be mostly HTTP client INFO lines (issue 16 item 14)."""
    run = subprocess.run([sys.executable, "-c", LOG_SOME_LINES], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "WARNING httpx: HTTP client warning stays",
        "INFO tideplane.worker: worker polling task queue 'tideplane'",
    ]


def test_counts_are_worded_in_the_singular_for_one():
    assert [counted(n, "file") for n in (0, 1, 2, 1024)] == ["0 files", "1 file", "2 files", "1,024 files"]
