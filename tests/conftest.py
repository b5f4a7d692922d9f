"""How `make test` spreads the suite over two pytest-xdist workers (``-n 2 --dist loadscope``).

Every module that uses the session's sandbox runs on one worker, one after another: one sandbox
per run (modules share it, ``_reset_sandbox_after_module``), and no module's cluster reset can
delete another module's namespaces mid-test. Every other module (pure functions, time-skipping
workflows, activities against moto or a fresh emulator) is a unit of its own, so its module
fixtures start once, and runs on the other worker meanwhile.

The scheduler runs in the controller, which sees node ids only, so the sandbox's modules are known
by path: all of tests/e2e, and the sandbox tier's modules listed below; collection fails, naming
the module, when a test elsewhere asks for the sandbox. (xdist's own ``--dist loadgroup`` would
read marks instead, but with pytest 9.2 it silently ignores them: pytest-xdist issue #1386.)
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.ci_skips"]

# A tideplane process refuses to talk to Temporal without TIDEPLANE_PAYLOAD_ENCRYPTION_KEY; the
# suite's own dev servers, time-skipping environments and clients run in clear by the explicit
# opt-out instead of a shared test key: a key here would reach every worker a test starts (the
# sandbox's included) while the clients beside them use the plain pydantic converter. The codec's
# tests set their own keys, and the refusal's tests remove this (tests/unit/worker/test_config.py,
# tests/activities/worker/test_client.py).
os.environ["TIDEPLANE_PAYLOAD_ENCRYPTION"] = "off"

SANDBOX_SCOPE = "sandbox"
# The sandbox tier's modules that use the session sandbox; the others start emulators of their own.
SANDBOX_TIER_USERS = {
    "tests/sandbox/kubeapi/test_kubeapi_rbac.py",
    "tests/sandbox/test_sandbox.py",
    "tests/sandbox/test_spot_replay.py",
}


def scope_of(nodeid: str) -> str:
    """The unit of work a test is scheduled in: the sandbox's, or its own module's."""
    path = nodeid.split("::", 1)[0]
    return SANDBOX_SCOPE if path.startswith("tests/e2e/") or path in SANDBOX_TIER_USERS else path


# Tests that drive real processes (Temporal's servers, Prometheus, moto, the emulator, a worker)
# against the wall clock on a loaded 2-core machine; the time-skipping server too: virtual time
# runs on while a client waits for a result, so what else has happened by then depends on load.
# One failure gets one rerun: it must pass the second time, and the rerun is listed by name in
# the summary (`make test` passes -r R). Every rerun seen so far was a real race, each fixed at its
# cause (a create's 409 Conflict taken for AlreadyExists, a probe before the gateway routed, a
# teardown crash of the Temporal runtime, a retirement timer firing while result() waited); the
# rerun keeps one such race from hiding every other result. Pure unit tests get none.
RERUN_TIERS = ("tests/e2e/", "tests/sandbox/", "tests/workflows/", "tests/activities/", "tests/engine/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("rerunfailures"):
        for item in items:
            if item.nodeid.startswith(RERUN_TIERS) and not item.get_closest_marker("flaky"):
                item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=2))
    strays = sorted({
        item.nodeid.split("::", 1)[0] for item in items
        if "sandbox" in getattr(item, "fixturenames", ()) and scope_of(item.nodeid) != SANDBOX_SCOPE
    })
    if strays:
        raise pytest.UsageError(
            f"{', '.join(strays)}: uses the session sandbox; add it to SANDBOX_TIER_USERS in tests/conftest.py"
            " so that the one xdist worker running the sandbox runs it"
        )


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # a venv without the test extra: no -n, nothing to schedule
    pass
else:

    class SandboxOnOneWorker(LoadScopeScheduling):
        """``--dist loadscope`` with the sandbox's modules as one scope (the largest: it starts first)."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadScopeScheduling:
        return SandboxOnOneWorker(config, log)
