"""Lost capacity is evidence (issue 32, item 3), end to end in the sandbox: the rollout is started
with the temporal CLI, a real ``tideplane worker`` runs it, and the faults are the sandbox's own.

- A canary whose pod the kernel OOM-kills during analysis (fleet profile ``oom_after_requests``: the
  kubelet kills the container, OOMKilled, and restarts it): rolled back, the OOM kill named as the cause.
- A canary whose only pod is deleted during analysis, its replacement slow to load: the gateway answers
  503 for the canary's share (``envoy_cluster_upstream_cx_none_healthy``), the verdict is no pass, the
  analysis clock holds, the route is re-planned onto the live pods (none: 0 %) and the web UI's
  current details say so; once the pod is back the step's weight returns and the release is promoted.
"""

from __future__ import annotations

import asyncio

import httpx
from kubernetes import client
from temporalio.api.sdk.v1 import WorkflowMetadata

from infra.sandbox.knobs import set_profile
from tests.e2e.rollout.test_rollout import (
    GOOD_PROFILE,
    NAME,
    STABLE,
    Cluster,
    clean_up,
    follow,
    prepare,
    report,
    rollout_input,
    route_weights,
    stable_ready,
    status,
    temporal_start,
    watching,
)
from tests.sandbox_fixtures import wait_until
from workflows.core.naming import LABEL_VERSION, rollout_workflow_id, versioned_name
from workflows.rollout.diagnosis import Cause
from workflows.rollout.gates import Verdict
from workflows.rollout.types import Outcome, RolloutStatus, Stage

NS_OOM, NS_LOST = "e2e-lost-oom", "e2e-lost-pod"
MODEL = "e2e-lost-llm"
OOM, LOST = "3.0.0", "3.1.0"
# Warm-up sends 8 requests; the canary then serves ~4 a second at 5 % and ~40 at 50 %: killed in analysis.
OOM_PROFILE = GOOD_PROFILE.model_copy(update={"oom_after_requests": 40})
SLOW_START = GOOD_PROFILE.model_copy(update={"load_seconds": 400})  # 20 real seconds at the tests' time scale
LOST_WEIGHT = 5


def gateway_503s(prometheus: str) -> float:
    """The gateway's no-healthy-upstream answers for the lost canary, as Prometheus scraped them."""
    query = f'sum(envoy_cluster_upstream_cx_none_healthy{{namespace="{NS_LOST}",deployment="{NAME}",version="{LOST}"}})'
    found = httpx.get(f"{prometheus}/api/v1/query", params={"query": query}, timeout=10).json()["data"]["result"]
    return float(found[0]["value"][1]) if found else 0.0


async def held_for_capacity(handle) -> tuple[RolloutStatus, str]:
    """The status and the web UI's current details once the rollout holds with the canary's share re-planned to 0 %."""
    while True:
        now = await status(handle)
        if now is not None and now.holding and "lost capacity" in now.holding and now.weight == 0:
            meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
            return now, meta.current_details
        await asyncio.sleep(0.2)


def lost_input(deployment: str, version: str) -> dict:
    inp = rollout_input(deployment, MODEL, version)
    inp["steps"] = [{"weight": LOST_WEIGHT, "window_seconds": 16}, {"weight": 50, "window_seconds": 8}]
    return inp


async def test_a_canary_pod_oom_killed_during_analysis_rolls_back_naming_the_oom_kill(sandbox, kube, registry, worker, temporal, tmp_path, request):
    prepare(kube, registry, tmp_path, NS_OOM, MODEL, {OOM: OOM_PROFILE})
    deployment = f"{NS_OOM}/{NAME}"
    try:
        await asyncio.to_thread(wait_until, lambda: stable_ready(kube, NS_OOM), 30, "the stable version to be Ready")
        started = await asyncio.to_thread(temporal_start, sandbox.urls["temporal"], lost_input(deployment, OOM))
        assert started.returncode == 0, started.stderr
        seen = await asyncio.wait_for(follow(temporal, deployment, client.AppsV1Api(kube), STABLE), 150)

        result = seen.result
        report(request, f"OOM-killed canary: {result.outcome.value}: {result.reason}")
        assert result.outcome is Outcome.ROLLED_BACK, result.reason
        assert result.cause is Cause.REGRESSION
        assert "OOMKilled" in result.reason and "canary pod(s) crashed" in result.reason
        assert result.failing_verdict.diagnosis.cause is Cause.REGRESSION
        assert "OOMKilled" in result.failing_verdict.diagnosis.reason
        assert result.failing_verdict.weight in (LOST_WEIGHT, 50)  # during analysis, not at warm-up
        (route,) = Cluster.read(kube, NS_OOM).routes
        assert route_weights(route) == {versioned_name(NAME, STABLE): 100, versioned_name(NAME, OOM): 0}
    finally:
        clean_up(kube, NS_OOM)


async def test_a_lost_canary_pod_holds_the_clock_replans_the_route_and_says_so(sandbox, kube, registry, worker, temporal, tmp_path, request):
    prepare(kube, registry, tmp_path, NS_LOST, MODEL, {LOST: GOOD_PROFILE})
    deployment = f"{NS_LOST}/{NAME}"
    canary, stable = versioned_name(NAME, LOST), versioned_name(NAME, STABLE)
    core = client.CoreV1Api(kube)
    handle = temporal.get_workflow_handle(rollout_workflow_id(deployment))
    try:
        await asyncio.to_thread(wait_until, lambda: stable_ready(kube, NS_LOST), 30, "the stable version to be Ready")
        with watching(sandbox.urls["kubeapi"], NS_LOST, NAME) as route:
            started = await asyncio.to_thread(temporal_start, sandbox.urls["temporal"], lost_input(deployment, LOST))
            assert started.returncode == 0, started.stderr

            def analysing(s: RolloutStatus) -> bool:
                return s.stage is Stage.CANARY and s.weight == LOST_WEIGHT and any(v.weight == LOST_WEIGHT for v in s.verdicts)

            await asyncio.wait_for(follow(temporal, deployment, client.AppsV1Api(kube), STABLE, until=analysing), 90)
            # the reclaim: its replacement loads slowly, so the canary has no Ready pod for a while
            set_profile(kube, MODEL, LOST, SLOW_START)
            pods = core.list_namespaced_pod(NS_LOST, label_selector=f"{LABEL_VERSION}={LOST}").items
            assert len(pods) == 1
            core.delete_namespaced_pod(pods[0].metadata.name, NS_LOST)

            held, details = await asyncio.wait_for(held_for_capacity(handle), 60)
            answered_503 = await asyncio.to_thread(gateway_503s, sandbox.urls["prometheus"])
            seen = await asyncio.wait_for(follow(temporal, deployment, client.AppsV1Api(kube), STABLE), 150)
            events = [weights for _, weights in route.events]

        report(request, f"lost canary pod: held verdict {held.last_verdict.evaluation.describe()}; gateway 503s {answered_503:g}; {held.holding}")
        assert held.diagnosis.cause is Cause.LOST_CAPACITY and "analysis clock held" in held.holding
        assert not held.paused
        lost = [v for v in held.verdicts if v.diagnosis is not None and v.diagnosis.cause is Cause.LOST_CAPACITY]
        assert lost and lost[0].evaluation.verdict is not Verdict.PASS, lost[0].evaluation.describe()
        assert answered_503 > 0  # what the gateway gate reads: its 503s for the canary, which no pod counted
        assert f"⚠ lost capacity at {LOST_WEIGHT} %" in details and "analysis clock held, 0 % on the live canary pods" in details
        # re-planned: the canary's share left it while it had no pod, and came back with the pod
        replanned = events.index({stable: 100, canary: 0}, events.index({stable: 100 - LOST_WEIGHT, canary: LOST_WEIGHT}))
        assert {stable: 100 - LOST_WEIGHT, canary: LOST_WEIGHT} in events[replanned:]
        # capacity lost is no verdict on the version
        assert seen.result.outcome is Outcome.PROMOTED, seen.result.reason
    finally:
        set_profile(kube, MODEL, LOST, GOOD_PROFILE)
        clean_up(kube, NS_LOST)
