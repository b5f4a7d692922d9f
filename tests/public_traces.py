"""Tests that read a public trace (benchmarks/traces.py) skip when it is absent, saying how to get it.

A clone without ``../shared/traces`` beside it (as a user clones it) has none of them: the traces
are kept outside the project (docs/benchmarks.md), so these tests run where they are laid out
(CI, the project's own checkouts) or with ``TIDEPLANE_TRACES_DIR`` set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import traces


def need(*paths: Path) -> None:
    """Skips the calling test or fixture unless every one of ``paths`` is there."""
    reasons = [reason for path in paths if (reason := traces.missing(path))]
    if reasons:
        pytest.skip("; ".join(reasons))
