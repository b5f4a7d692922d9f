"""A release whose pods fail in the cluster never receives traffic: the emulator's kubelet makes a
version crash on start (CrashLoopBackOff) or never pass its readiness probe (fleet profile
``crash_on_start`` / ``never_ready``), and the rollout, started with the temporal CLI as a user
would, ends rolled back by its warm-up deadline with the route on stable all along."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
from kubernetes import client

from tests.e2e.rollout.test_rollout import (
    GOOD_PROFILE,
    MODEL,
    NAME,
    STABLE,
    Followed,
    clean_up,
    follow,
    prepare,
    rollout_input,
    stable_ready,
    temporal_start,
    watching,
)
from tests.sandbox_fixtures import wait_until
from workflows.core.naming import versioned_name
from workflows.rollout.types import Outcome

WARM_UP_DEADLINE = 20.0
# case -> (namespace, version, how its pods fail (profile fields), the waiting reason its pods show)
CASES = {
    "crash-on-start": ("fail-crash", "3.0.0", {"crash_on_start": True}, "CrashLoopBackOff"),
    "never-ready": ("fail-never-ready", "3.1.0", {"never_ready": True}, None),
}


@dataclass
class FailedRollout:
    seen: Followed
    route_events: list[tuple[float, dict[str, int]]]
    pods_seen: list[client.V1Pod]


async def roll_out_failing(sandbox, kube, temporal, namespace: str, version: str) -> FailedRollout:
    """Start the rollout with the temporal CLI and follow it to its end, watching route and pods."""
    with ExitStack() as stack:
        stack.callback(clean_up, kube, namespace)
        await asyncio.to_thread(wait_until, lambda: stable_ready(kube, namespace), 30, "stable Ready")
        route = stack.enter_context(watching(sandbox.urls["kubeapi"], namespace, NAME))
        inp = rollout_input(f"{namespace}/{NAME}", MODEL, version)
        inp["warm_up"]["deadline_seconds"] = WARM_UP_DEADLINE
        started = await asyncio.to_thread(temporal_start, sandbox.urls["temporal"], inp)
        assert started.returncode == 0, started.stderr
        pods_seen: list[client.V1Pod] = []

        def new_pods(_status) -> bool:
            pods = client.CoreV1Api(kube).list_namespaced_pod(
                namespace, label_selector=f"app.kubernetes.io/version={version}"
            ).items
            pods_seen[:] = pods or pods_seen
            return False

        seen = await asyncio.wait_for(follow(temporal, inp["deployment"], client.AppsV1Api(kube), STABLE, until=new_pods), 180)
    return FailedRollout(seen, route.events, pods_seen)


@pytest.fixture(scope="module")
async def failed(sandbox, kube, registry, worker, temporal, tmp_path_factory) -> dict[str, FailedRollout]:
    """Both failing releases at once: each waits out its own warm-up deadline."""
    weights = tmp_path_factory.mktemp("weights")
    for namespace, version, failure, _ in CASES.values():
        prepare(kube, registry, weights, namespace, MODEL, {version: GOOD_PROFILE.model_copy(update=failure)})
    runs = await asyncio.gather(*(roll_out_failing(sandbox, kube, temporal, ns, version) for ns, version, _, _ in CASES.values()))
    return dict(zip(CASES, runs))


@pytest.mark.parametrize("case", list(CASES))
def test_failing_version_is_rolled_back_before_any_traffic(failed, case):
    _, version, _, pod_state = CASES[case]
    seen, pods_seen = failed[case].seen, failed[case].pods_seen
    result = seen.result
    assert result.outcome is Outcome.ROLLED_BACK, result.reason
    assert "warm-up" in result.reason, result.reason
    # No request ever went to the failing version: its weight was never above 0 on the route.
    new_svc = versioned_name(NAME, version)
    events = failed[case].route_events
    assert events, "the route watch saw nothing"
    assert all(weights.get(new_svc, 0) == 0 for _, weights in events), events
    assert seen.weights_seen <= {0}
    # The pods did fail as the profile said (the kubelet, not the workflow, decided it).
    assert pods_seen, "no pod of the failing version was ever created"
    ready = [c.ready for p in pods_seen for c in (p.status.container_statuses or [])]
    assert ready and not any(ready)
    if pod_state is not None:
        waiting = {
            (c.state.waiting.reason if c.state and c.state.waiting else None)
            for p in pods_seen
            for c in p.status.container_statuses or []
        }
        restarts = max(c.restart_count for p in pods_seen for c in p.status.container_statuses or [])
        assert pod_state in waiting or restarts >= 1, (waiting, restarts)
