"""How `make test` spreads the suite over two pytest-xdist workers (``-n 2 --dist loadgroup``).

Every module that uses the session's sandbox runs on one worker, in collection order: one sandbox
per run (modules share it, ``_reset_sandbox_after_module``), and no module's cluster reset can
delete another module's namespaces mid-test. Every other module (pure functions, time-skipping
workflows, activities against moto or a fresh emulator) is a group of its own, so its module
fixtures start once, and runs on the other worker meanwhile. Without -n the marks do nothing.
"""

from __future__ import annotations

import pytest

SANDBOX_GROUP = "sandbox"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return  # a venv without the test extra's pytest-xdist: the marks would be unknown
    uses_sandbox = {item.module.__name__ for item in items if "sandbox" in getattr(item, "fixturenames", ())}
    for item in items:
        module = item.module.__name__
        item.add_marker(pytest.mark.xdist_group(SANDBOX_GROUP if module in uses_sandbox else module))
