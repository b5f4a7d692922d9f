"""A skip on CI fails the run (tests/ci_skips.py); elsewhere it stays a skip."""

import pytest

pytest_plugins = ["pytester"]

SKIPPING = """
import pytest

def test_needs_a_trace():
    pytest.skip("trace m-large is absent")
"""


@pytest.mark.parametrize(("ci", "failed", "skipped"), [("true", 1, 0), ("", 0, 1)])
def test_a_skip_fails_only_on_ci(pytester, monkeypatch, ci, failed, skipped):
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(SKIPPING)
    result = pytester.runpytest_inprocess("-p", "tests.ci_skips", "-p", "no:cacheprovider", "-p", "no:asyncio")
    result.assert_outcomes(failed=failed, skipped=skipped)
    if ci:
        result.stdout.fnmatch_lines(["*skipped on CI*trace m-large is absent*"])
