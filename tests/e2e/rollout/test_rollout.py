"""ModelRollout end to end in the sandbox, started with the ``temporal`` CLI, run by a real
``tideplane worker`` process.

Nothing is stubbed: the Temporal dev server, the worker subprocess, the Kubernetes API emulator,
moto (weights and registry), the fleet simulator and Prometheus. Two releases roll out at once in
two namespaces: a good one is promoted, a bad one (30 % errors) is rolled back by its error-rate
gate, and the time from the failing verdict to the HTTPRoute pointing back at stable is measured
by watching the route. Then a worker is SIGKILLed mid-canary and its replacement finishes the
rollout without duplicating Deployments, Services or routes.

Windows are compressed (gate every 4 s, 8 s per step); the good profile has no errors at all, so
one unlucky request cannot fail the 1 % error gate, and the query window equals the gate interval
so warm-up requests never land in a gate's window.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError

from activities.registry.store import Registry
from infra.sandbox.config import Demand, Profile
from infra.sandbox.knobs import set_demand, set_profile
from infra.sandbox.kubeclient import api_client
from infra.sandbox.launcher import BIN
from tests.sandbox_fixtures import create_logical_deployment, wait_until
from workflows.rollout.gates import ERROR_RATE, GATEWAY_ERROR_RATE, Verdict
from workflows.core.naming import (
    LABEL_APP,
    LABEL_MANAGED_BY,
    LABEL_MODEL,
    LABEL_VERSION,
    MANAGED_BY,
    TASK_QUEUE,
    rollout_workflow_id,
    versioned_name,
)
from workflows.registry.schema import Manifest
from workflows.rollout.contract import retire_workflow_id
from workflows.rollout.types import Outcome, RolloutResult, RolloutStatus, Stage
from workflows.rollout.client import rollout_result

NAME = "chat"
NS_GOOD, NS_BAD, NS_CRASH = "e2e-rollout-good", "e2e-rollout-bad", "e2e-rollout-crash"
MODEL, CRASH_MODEL = "e2e-llm", "e2e-crash-llm"
STABLE, GOOD, BAD, CRASH = "1.0.0", "1.1.0", "1.2.0", "2.0.0"
IMAGE = "vllm/vllm-openai:v0.6.3"
STABLE_REPLICAS = 2
GATE_INTERVAL = 4.0
WINDOW = 8.0
SCALE_DOWN_DELAY = 5.0
# Sandbox requests/s per deployment: x20 time scale = 80 real/s, so 5 % gives the canary ~16
# requests per 4 s gate window (min_requests 5), and every replica stays under its capacity.
RPS = 4.0
# Latency like for like: at every load a replica sees here (<= 50 % of capacity) the e2e latency,
# tail included, stays inside one histogram bucket (2.5, 5] s, so canary and stable p99 both
# interpolate to ~4.97 s; with a tail crossing 5 s one sample in a short window flips the latency
# gate. No errors at all: one error in a small window would fail the 1 % error gate.
GOOD_PROFILE = Profile(load_seconds=20, error_rate=0.0, ttft_seconds=0.15, tpot_seconds=0.015, output_tokens=180, capacity_rps=4)
BAD_PROFILE = GOOD_PROFILE.model_copy(update={"error_rate": 0.3})
ROUTE_API = ("gateway.networking.k8s.io", "v1")
POLL = 0.1


def rollout_input(deployment: str, model: str, version: str) -> dict:
    """The CLI's JSON: no weights_uri, so weights are resolved from the registry."""
    return {
        "deployment": deployment,
        "model": model,
        "version": version,
        "image": IMAGE,
        "gpus_per_replica": 1,
        "steps": [{"weight": 5, "window_seconds": WINDOW}, {"weight": 50, "window_seconds": WINDOW}],
        "gate_interval_seconds": GATE_INTERVAL,
        "query_window_seconds": GATE_INTERVAL,
        "gates": {"min_requests": 5},
        "warm_up": {"requests": 8, "deadline_seconds": 60},
        "deadlines": {"step_ready_seconds": 60},
        "scale_down_delay_seconds": SCALE_DOWN_DELAY,
    }


def temporal_start(temporal_address: str, inp: dict) -> subprocess.CompletedProcess:
    """``temporal workflow start --fail-existing``, exactly as a user types it."""
    argv = [
        str(BIN / "temporal"), "workflow", "start", "--address", temporal_address,
        "--type", "ModelRollout", "--task-queue", TASK_QUEUE,
        "--workflow-id", rollout_workflow_id(inp["deployment"]), "--fail-existing",
        "--input", json.dumps(inp),
    ]
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)


def route_weights(route: dict) -> dict[str, int]:
    refs = (route.get("spec", {}).get("rules") or [{}])[0].get("backendRefs") or []
    return {r["name"]: int(r.get("weight", 1)) for r in refs}


def report(request: pytest.FixtureRequest, line: str) -> None:
    """A line shown on the terminal even under output capture (no -s needed)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n{line}", flush=True)


class RouteWatch:
    """Every state of one HTTPRoute as the API server announces it (a kubernetes watch), stamped
    with the wall clock so it can be compared with the workflow's verdict times. Its own client:
    the server closes a watch's connection, which must not be handed to other requests."""

    def __init__(self, kube_url: str, namespace: str, name: str):
        self.api, self.namespace, self.name = api_client(kube_url), namespace, name
        self.events: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{namespace}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        rv = None
        while not self._stop.is_set():
            kwargs = {"timeout_seconds": 3, **({"resource_version": rv} if rv else {})}
            try:
                for event in watch.Watch().stream(custom.list_namespaced_custom_object, *ROUTE_API, self.namespace, "httproutes", **kwargs):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = None
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if obj["metadata"]["name"] == self.name and event["type"] != "DELETED":
                        self.events.append((time.time(), route_weights(obj)))
            except ApiException:
                rv = None
            self.api.rest_client.pool_manager.clear()  # the server closed the stream's connection

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.api.close()


@contextmanager
def watching(kube_url: str, namespace: str, name: str):
    route = RouteWatch(kube_url, namespace, name)
    try:
        yield route
    finally:
        route.stop()


@dataclass
class Followed:
    """What a rollout did, as seen from outside while it ran."""

    result: RolloutResult | None = None  # None when following stopped early
    status: RolloutStatus | None = None  # final, by query on the closed workflow
    ended: float | None = None  # monotonic time the result came
    fail_seen_wall: float | None = None  # wall time the status query first showed a failing verdict
    promoted_seen: float | None = None  # monotonic time the status query first showed stage promoted
    old_replicas_at_promotion: int | None = None
    retired: float | None = None  # monotonic time the delayed scale-down (RetireVersion) ended
    weights_seen: set[int] = field(default_factory=set)


async def status(handle) -> RolloutStatus | None:
    try:
        return await handle.query("status", result_type=RolloutStatus, rpc_timeout=timedelta(seconds=3))
    except (RPCError, WorkflowQueryFailedError):
        return None  # no workflow task yet, or no worker to answer right now


async def follow(temporal: Client, deployment: str, apps: client.AppsV1Api, old_version: str, until=None) -> Followed:
    """Poll ``status`` until the rollout ends (or ``until(status)`` holds: then return early)."""
    namespace, name = deployment.split("/")
    handle = temporal.get_workflow_handle(rollout_workflow_id(deployment), result_type=RolloutResult)
    result = asyncio.ensure_future(rollout_result(handle))
    seen = Followed()
    while not result.done():
        now = await status(handle)
        if now is not None:
            seen.weights_seen.add(now.weight)
            if seen.fail_seen_wall is None and any(v.evaluation.verdict is Verdict.FAIL for v in now.verdicts):
                seen.fail_seen_wall = time.time()
            if seen.promoted_seen is None and now.stage is Stage.PROMOTED:
                seen.promoted_seen = time.monotonic()
                old = apps.read_namespaced_deployment(versioned_name(name, old_version), namespace)
                seen.old_replicas_at_promotion = old.spec.replicas
            if until is not None and until(now):
                result.cancel()
                return seen
        await asyncio.wait({result}, timeout=POLL)
    seen.result, seen.ended = result.result(), time.monotonic()
    seen.status = await handle.query("status", result_type=RolloutStatus)
    seen.retired = await retired(temporal, deployment, seen.result)
    return seen


async def retired(temporal: Client, deployment: str, result: RolloutResult) -> float | None:
    """Wait for the scale-down the rollout left to RetireVersion; the monotonic time it ended."""
    left = result.previous_version if result.outcome is Outcome.PROMOTED else result.version
    if left is None:
        return None
    try:
        await temporal.get_workflow_handle(retire_workflow_id(deployment, left)).result()
    except RPCError:
        return None  # none started: nothing had changed in the cluster
    return time.monotonic()


@dataclass
class Cluster:
    """One namespace's objects after a rollout."""

    routes: list[dict]
    deployments: list[client.V1Deployment]
    services: list[client.V1Service]
    pods: list[client.V1Pod]

    @classmethod
    def read(cls, api: client.ApiClient, namespace: str) -> Cluster:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        routes = client.CustomObjectsApi(api).list_namespaced_custom_object(*ROUTE_API, namespace, "httproutes")["items"]
        return cls(
            routes, apps.list_namespaced_deployment(namespace).items,
            core.list_namespaced_service(namespace).items, core.list_namespaced_pod(namespace).items,
        )

    def replicas(self, version: str) -> int:
        (dep,) = [d for d in self.deployments if d.metadata.name == versioned_name(NAME, version)]
        return dep.spec.replicas


def prepare(
    api: client.ApiClient, registry: Registry, weights_dir: Path, namespace: str, model: str, versions: dict[str, Profile],
    stable: str = STABLE,
) -> None:
    """A running stable version with demand on it, and the new versions registered with their profiles."""
    set_profile(api, model, stable, GOOD_PROFILE)
    for version, profile in versions.items():
        path = weights_dir / model / version / "model.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(random.Random(f"{model}@{version}").randbytes(256 * 1024))
        registry.register(model, version, str(path), image=IMAGE)
        set_profile(api, model, version, profile)
    create_logical_deployment(api, namespace, NAME, stable, model, STABLE_REPLICAS)
    set_demand(api, f"{namespace}/{NAME}", Demand(rps=RPS))


def stable_ready(api: client.ApiClient, namespace: str, stable: str = STABLE) -> bool:
    dep = client.AppsV1Api(api).read_namespaced_deployment(versioned_name(NAME, stable), namespace)
    return (dep.status.ready_replicas or 0) >= STABLE_REPLICAS


def clean_up(api: client.ApiClient, namespace: str) -> None:
    """No demand left running and the namespace's Deployments gone (GPUs free for the next test)."""
    set_demand(api, f"{namespace}/{NAME}", Demand(rps=0))
    try:
        client.CoreV1Api(api).delete_namespace(namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise


# ---- fixtures -----------------------------------------------------------------------------------


@dataclass
class Told:
    """What one rollout told (issue 35): the webhook receiver's messages, the Events on its
    version's Deployment, and ``kubectl describe deployment`` of it."""

    messages: list[dict]
    events: list[client.CoreV1Event]
    described: str


def told(sandbox, api: client.ApiClient, namespace: str, version: str) -> Told:
    deployment, versioned = f"{namespace}/{NAME}", versioned_name(NAME, version)
    messages = [m for m in httpx.get(sandbox.urls["webhook"] + "/messages", timeout=10).json() if m.get("deployment") == deployment]
    events = client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={versioned}").items
    described = subprocess.run(
        ["kubectl", "--kubeconfig", str(sandbox.kubeconfig), "describe", "deployment", versioned, "-n", namespace],
        capture_output=True, text=True, timeout=30,
    )
    return Told(messages, [e for e in events if e.reporting_component == MANAGED_BY], described.stdout + described.stderr)


async def hold_and_resume(temporal: Client, deployment: str, weight: int) -> None:
    """An operator's pause once the rollout is at ``weight``, and the resume once the pause has
    taken effect (stage ``paused``, at the rollout's next checkpoint): a resume sent while the
    rollout is still in an activity lifts the pause before it holds, and no one is told of it."""
    handle = temporal.get_workflow_handle(rollout_workflow_id(deployment))
    while (now := await status(handle)) is None or now.weight < weight:
        await asyncio.sleep(POLL)
    await handle.signal("pause", {"reason": "looking at the dashboards"})
    while (now := await status(handle)) is None or now.stage is not Stage.PAUSED:
        await asyncio.sleep(POLL)
    await handle.signal("resume")


@dataclass
class GoodAndBad:
    good: Followed
    bad: Followed
    second_start: subprocess.CompletedProcess
    running_during_second_start: bool
    bad_route: list[tuple[float, dict[str, int]]]
    good_cluster: Cluster
    bad_cluster: Cluster
    good_manifest: Manifest
    bad_manifest: Manifest
    told: dict[str, Told]


@pytest.fixture(scope="module")
async def good_and_bad(sandbox, kube, registry, worker, temporal, tmp_path_factory) -> GoodAndBad:
    """Both rollouts at once, started with the temporal CLI; the cluster and registry read after."""
    weights = tmp_path_factory.mktemp("weights")
    prepare(kube, registry, weights, NS_GOOD, MODEL, {GOOD: GOOD_PROFILE})
    prepare(kube, registry, weights, NS_BAD, MODEL, {BAD: BAD_PROFILE})
    with ExitStack() as stack:
        stack.callback(clean_up, kube, NS_BAD)
        stack.callback(clean_up, kube, NS_GOOD)
        wait_until(lambda: stable_ready(kube, NS_GOOD) and stable_ready(kube, NS_BAD), 30, "the stable versions to be Ready")
        route = stack.enter_context(watching(sandbox.urls["kubeapi"], NS_BAD, NAME))
        address = sandbox.urls["temporal"]
        good_in, bad_in = rollout_input(f"{NS_GOOD}/{NAME}", MODEL, GOOD), rollout_input(f"{NS_BAD}/{NAME}", MODEL, BAD)
        for inp in (good_in, bad_in):
            started = await asyncio.to_thread(temporal_start, address, inp)
            assert started.returncode == 0, started.stderr
        second = await asyncio.to_thread(temporal_start, address, good_in)
        running = (await temporal.get_workflow_handle(rollout_workflow_id(good_in["deployment"])).describe()).status
        apps = client.AppsV1Api(kube)
        good, bad, _ = await asyncio.wait_for(
            asyncio.gather(
                follow(temporal, good_in["deployment"], apps, STABLE),
                follow(temporal, bad_in["deployment"], apps, STABLE),
                hold_and_resume(temporal, good_in["deployment"], 5),
            ),
            timeout=150,
        )
        return GoodAndBad(
            good, bad, second, running == WorkflowExecutionStatus.RUNNING, route.events,
            Cluster.read(kube, NS_GOOD), Cluster.read(kube, NS_BAD),
            registry.show(MODEL, GOOD), registry.show(MODEL, BAD),
            {"good": told(sandbox, kube, NS_GOOD, GOOD), "bad": told(sandbox, kube, NS_BAD, BAD)},
        )


# ---- tests ----------------------------------------------------------------------------------------


def test_good_release_reaches_100_percent(good_and_bad):
    seen, cluster = good_and_bad.good, good_and_bad.good_cluster
    assert seen.result.outcome is Outcome.PROMOTED, seen.result.reason
    assert seen.result.weight_reached == 100 and seen.result.previous_version == STABLE
    assert {5, 50, 100} <= seen.weights_seen
    passes = [v for v in seen.status.verdicts if v.evaluation.verdict is Verdict.PASS]
    assert {v.weight for v in passes} == {5, 50}, seen.status.verdicts
    assert not [v for v in seen.status.verdicts if v.evaluation.verdict is Verdict.FAIL]
    # Traffic: all of it on the new version (the old one stays listed at 0 for a fast rollback).
    (route,) = cluster.routes
    weights = route_weights(route)
    assert weights[versioned_name(NAME, GOOD)] == 100 and sum(weights.values()) == 100
    # The result came when traffic had moved; the old version kept its replicas, and went to 0
    # only after the delay (RetireVersion, issue 16 item 3).
    assert seen.old_replicas_at_promotion == STABLE_REPLICAS
    assert seen.ended - seen.promoted_seen < SCALE_DOWN_DELAY, "the result comes when traffic has moved"
    assert seen.retired - seen.promoted_seen >= SCALE_DOWN_DELAY - 0.5
    assert cluster.replicas(STABLE) == 0
    assert cluster.replicas(GOOD) == STABLE_REPLICAS
    assert seen.result.benchmark is not None and seen.result.benchmark.requests == 8
    assert seen.result.staged is not None and seen.result.staged.size_bytes == 256 * 1024


def test_bad_release_rolled_back_by_its_error_gate(good_and_bad, request, record_property):
    seen, cluster = good_and_bad.bad, good_and_bad.bad_cluster
    result = seen.result
    assert result.outcome is Outcome.ROLLED_BACK, result.reason
    # The result names the failing gates with their numbers: the pods' errors, and the same errors as
    # the gateway answered them (its upstream 5xx for the canary's backend).
    assert [g.gate for g in result.failed_gates] == [ERROR_RATE, GATEWAY_ERROR_RATE], result.failed_gates
    gate, gateway = result.failed_gates
    assert gateway.value == pytest.approx(gate.value, abs=0.1) and not gateway.passed
    # The fleet draws each request's error (p = 0.3): over a window's ~10-20 requests the measured share
    # spreads widely around it, but stays far above the 1 % threshold.
    assert gate.threshold == 0.01 and 0.05 < gate.value < 0.8 and not gate.passed
    assert result.failing_verdict is not None and result.failing_verdict.weight == 5
    assert "error_rate" in result.reason and f"{gate.value:.4g}" in result.reason
    # Traffic back on stable, which kept its full size; the canary scaled to 0 after the delay.
    stable_svc, bad_svc = versioned_name(NAME, STABLE), versioned_name(NAME, BAD)
    (route,) = cluster.routes
    assert route_weights(route) == {stable_svc: 100, bad_svc: 0}
    assert cluster.replicas(STABLE) == STABLE_REPLICAS and cluster.replicas(BAD) == 0

    # Failing verdict -> route back on stable, measured on the route itself (kubernetes watch).
    events = good_and_bad.bad_route
    canary_on = next(i for i, (_, w) in enumerate(events) if w.get(bad_svc, 0) > 0)
    assert events[canary_on][1] == {stable_svc: 95, bad_svc: 5}
    reverted_at = next(t for t, w in events[canary_on:] if w == {stable_svc: 100, bad_svc: 0})
    measured = reverted_at - result.failing_verdict.at.timestamp()
    after_query = reverted_at - seen.fail_seen_wall
    record_property("route_reverted_seconds", round(measured, 3))
    record_property("route_reverted_seconds_workflow", result.route_reverted_seconds)
    report(
        request,
        f"bad release: failing gate -> HTTPRoute 100 % on stable in {measured:.2f}s measured on the route "
        f"(workflow says {result.route_reverted_seconds:.2f}s; {after_query:+.2f}s after the status query "
        f"first showed the failing verdict); goal <= {GATE_INTERVAL + 10:.0f}s",
    )
    assert result.route_reverted_seconds is not None and result.route_reverted_seconds <= GATE_INTERVAL + 10
    assert 0 <= measured <= GATE_INTERVAL + 10
    assert after_query <= GATE_INTERVAL + 10


@pytest.mark.parametrize(
    "which, kinds, reasons",
    [
        ("good", ["paused", "resumed", "promoted"], ["RolloutPaused", "RolloutResumed", "RolloutPromoted"]),
        ("bad", ["rolled_back"], ["RolloutRolledBack"]),
    ],
)
def test_each_pause_rollback_and_promotion_is_told_by_webhook_and_event(good_and_bad, which, kinds, reasons):
    seen, got = getattr(good_and_bad, which), good_and_bad.told[which]
    assert [m["kind"] for m in got.messages] == kinds, got.messages
    assert all(m["link"].endswith(rollout_workflow_id(m["deployment"]).replace("/", "%2F")) for m in got.messages)
    assert got.messages[-1]["message"] == seen.result.reason
    assert sorted(e.reason for e in got.events) == sorted(reasons)
    assert {e.metadata.name for e in got.events} == {m["key"] for m in got.messages}, "one Event per message"
    assert "Events:" in got.described, got.described
    events_section = got.described.split("Events:", 1)[1]
    assert all(reason in events_section for reason in reasons), got.described


def test_second_start_is_refused(good_and_bad):
    second = good_and_bad.second_start
    assert good_and_bad.running_during_second_start
    assert second.returncode != 0
    assert "already" in (second.stderr + second.stdout).lower(), second


def test_registry_after_rollouts(good_and_bad):
    good, bad = good_and_bad.good_manifest, good_and_bad.bad_manifest
    assert good.status.state == "stable"
    (bench,) = good.benchmarks
    assert bench.dataset == "warm-up" and bench.requests == 8 and bench.tokens_per_second > 0
    assert bench.deployment == f"{NS_GOOD}/{NAME}" and bench.image == IMAGE
    assert [h.status.state for h in good.history][:2] == ["testing", "canary"]
    assert bad.status.state == "deprecated"
    assert "canary" in [h.status.state for h in bad.history]


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def _value(samples, name: str, **labels: str) -> float:
    values = [v for n, l, v in samples if n == name and all(l.get(k) == want for k, want in labels.items())]
    assert values, f"no sample {name}{labels}"
    return sum(values)


def test_worker_metrics_after_rollouts(good_and_bad, sandbox):
    """The worker's /metrics: tideplane's rollout metrics and the Temporal SDK's, one endpoint."""
    good, bad = good_and_bad.good, good_and_bad.bad
    resp = httpx.get(f"http://127.0.0.1:{sandbox.env['TIDEPLANE_METRICS_PORT']}/metrics", timeout=10)
    assert resp.status_code == 200
    samples = _samples(resp.text)
    chat = {"deployment": NAME}
    assert _value(samples, "tideplane_rollouts_total", kube_namespace=NS_GOOD, outcome="promoted", stage="promoted", **chat) == 1
    assert _value(samples, "tideplane_rollouts_total", kube_namespace=NS_BAD, outcome="rolled_back", stage="canary-5", **chat) == 1
    # Gate verdicts, one per observation, with the failing gate named.
    for seen, ns, version in ((good, NS_GOOD, GOOD), (bad, NS_BAD, BAD)):
        for verdict in (Verdict.PASS, Verdict.INCONCLUSIVE, Verdict.FAIL):
            expected = sum(1 for v in seen.status.verdicts if v.evaluation.verdict is verdict)
            got = sum(v for n, l, v in samples if n == "tideplane_gate_verdicts_total" and l.get("kube_namespace") == ns and l.get("version") == version and l["verdict"] == verdict.value)
            assert got == expected, (ns, verdict, got, expected)
    assert _value(samples, "tideplane_gate_verdicts_total", kube_namespace=NS_GOOD, version=GOOD, verdict="pass", gate="none") >= 4
    assert _value(samples, "tideplane_gate_verdicts_total", kube_namespace=NS_BAD, version=BAD, verdict="fail", gate=ERROR_RATE) == 1
    # Time to rollback: one observation, the workflow's own number.
    assert _value(samples, "tideplane_rollback_seconds_count", kube_namespace=NS_BAD, **chat) == 1
    assert _value(samples, "tideplane_rollback_seconds_sum", kube_namespace=NS_BAD, **chat) == pytest.approx(bad.result.route_reverted_seconds)
    # Route weights as last set by the activity.
    assert _value(samples, "tideplane_rollout_weight", kube_namespace=NS_GOOD, version=GOOD, **chat) == 100
    assert _value(samples, "tideplane_rollout_weight", kube_namespace=NS_BAD, version=STABLE, **chat) == 100
    assert _value(samples, "tideplane_rollout_weight", kube_namespace=NS_BAD, version=BAD, **chat) == 0
    # Temporal SDK metrics from the same endpoint.
    sdk = {"task_queue": TASK_QUEUE, "namespace": "default"}
    # The promoted run completed; the rolled-back one failed (RolledBack), as Temporal counts it too.
    assert _value(samples, "temporal_workflow_completed_total", workflow_type="ModelRollout", **sdk) >= 1
    assert _value(samples, "temporal_workflow_failed_total", workflow_type="ModelRollout", **sdk) >= 1
    assert _value(samples, "temporal_activity_execution_latency_count", activity_type="query_gates", **sdk) >= 5
    assert _value(samples, "temporal_worker_task_slots_available", worker_type="ActivityWorker", **sdk) > 0


async def test_worker_killed_mid_canary_rollout_still_ends_promoted(sandbox, kube, registry, worker, temporal, tmp_path):
    """SIGKILL the worker at 5 %; a new worker process replays the history and finishes, with
    exactly one Deployment and Service per version and one HTTPRoute."""
    prepare(kube, registry, tmp_path, NS_CRASH, CRASH_MODEL, {CRASH: GOOD_PROFILE})
    deployment = f"{NS_CRASH}/{NAME}"
    apps = client.AppsV1Api(kube)
    try:
        wait_until(lambda: stable_ready(kube, NS_CRASH), 30, "the stable version to be Ready")
        started = await asyncio.to_thread(temporal_start, sandbox.urls["temporal"], rollout_input(deployment, CRASH_MODEL, CRASH))
        assert started.returncode == 0, started.stderr
        at_5 = await asyncio.wait_for(
            follow(temporal, deployment, apps, STABLE, until=lambda s: s.stage is Stage.CANARY and s.weight == 5), 60
        )
        assert at_5.result is None  # stopped following at 5 %, the rollout still runs
        await asyncio.sleep(1.0)  # inside the gate-interval timer, after the step's registry write
        killed = worker.proc.pid
        assert worker.kill() == -signal.SIGKILL
        worker.start()
        seen = await asyncio.wait_for(follow(temporal, deployment, apps, STABLE), 120)
        assert seen.result.outcome is Outcome.PROMOTED, seen.result.reason
        # Both processes ran this workflow's tasks: the new one took over from the history.
        history = await temporal.get_workflow_handle(rollout_workflow_id(deployment)).fetch_history()
        pids = {
            e.workflow_task_started_event_attributes.identity.split("@")[0]
            for e in history.events
            if e.HasField("workflow_task_started_event_attributes")
        }
        assert {str(killed), str(worker.proc.pid)} <= pids, pids
        assert {v.weight for v in seen.status.verdicts if v.evaluation.verdict is Verdict.PASS} == {5, 50}

        cluster = Cluster.read(kube, NS_CRASH)
        by_version: dict[str, list[client.V1Deployment]] = {}
        for dep in cluster.deployments:
            by_version.setdefault(dep.metadata.labels[LABEL_VERSION], []).append(dep)
        assert {v: [d.metadata.name for d in deps] for v, deps in by_version.items()} == {
            STABLE: [versioned_name(NAME, STABLE)],
            CRASH: [versioned_name(NAME, CRASH)],
        }
        (new,) = by_version[CRASH]
        assert {LABEL_APP: NAME, LABEL_VERSION: CRASH, LABEL_MODEL: CRASH_MODEL, LABEL_MANAGED_BY: MANAGED_BY}.items() <= new.metadata.labels.items()
        assert new.spec.replicas == STABLE_REPLICAS and cluster.replicas(STABLE) == 0
        new_pods = [p for p in cluster.pods if p.metadata.labels.get(LABEL_VERSION) == CRASH]
        assert len(new_pods) == STABLE_REPLICAS
        # One route, weights summing to 100, all on the new version; no Service without its Deployment.
        (route,) = cluster.routes
        weights = route_weights(route)
        assert route["metadata"]["name"] == NAME and sum(weights.values()) == 100
        assert weights[versioned_name(NAME, CRASH)] == 100
        assert sorted(s.metadata.name for s in cluster.services) == sorted(d.metadata.name for d in cluster.deployments)
        assert set(weights) <= {s.metadata.name for s in cluster.services}
    finally:
        clean_up(kube, NS_CRASH)
