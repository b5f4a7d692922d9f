"""On CI (``CI=true``, as .ci/run sets it) a skipped test is a failure.

CI installs everything the suite needs (Prometheus, the Temporal binaries, kubectl) and has the
public traces beside the clone (``../shared/traces``), so a skip there means a test that did not
run while the summary looked green. A user's clone may still skip, with the reason saying what is
missing (tests/public_traces.py).
"""

from __future__ import annotations

import os

import pytest


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and on_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped on CI, where nothing may be: {reason}"
