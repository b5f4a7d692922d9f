"""The ``tideplane`` command (main.py), one module per capability that has commands (registry,
quality, node_cache, scaling, cost, quotas), the sandbox and demo commands (sandbox.py, demo.py,
loaded only when asked for) and what the commands share (reports.py, temporal_schedules.py,
model_files.py, progress.py, wording.py)."""

from workers.cli.main import main  # the `tideplane` entry point (pyproject.toml) is workers.cli:main

__all__ = ["main"]
