"""A ``tideplane worker`` process SIGKILLed at each stage of the durable work, in the sandbox; a new
worker process finishes it.

- rollout: killed while staging (64 MiB of weights, mid-download: the retry resumes from the
  verified prefix), while warming up, in the scale-down delay after promotion and in the
  canary's scale-down delay after a failing verdict (mid-canary is tests/e2e/rollout/test_rollout.py).
  Each ends with its right outcome, one Deployment and Service per version, one HTTPRoute, and
  every state of that route a watch saw sums to 100;
- scaling loop: killed right after a scale-up decision, while the new replicas load; the same run
  carries on, the decision is not repeated and the cooldown still counts from it;
- spot failover: killed while the replacements come up, with 20 % of Kubernetes API requests
  failing (500 / 409 / late): the node is still drained, the fallback replicas are Ready and there
  is one fallback Deployment.

Every scenario has its own task queue, worker process and namespace; the four rollouts run at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import boto3
import httpx
import pytest
from kubernetes import client
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError

from activities.spot.fallback_deployments import FALLBACK_FOR, fallback_name
from activities.clients.s3 import CHUNK_BYTES
from infra.sandbox.config import Demand, Profile
from infra.sandbox.knobs import set_demand, set_profile
from infra.sandbox.launcher import AWS_ENV, WEIGHTS_BUCKET
from infra.sandbox.ports import free_port
from infra.sandbox.spot import spot_interrupt
from tests.sandbox_fixtures import TEST_TIME_SCALE, create_logical_deployment, wait_until
from tests.e2e.rollout.test_faults import KUBE_FAULTS
from tests.e2e.worker_process import WorkerProcess
from tests.e2e.rollout.test_rollout import (
    Cluster,
    retired,
    route_weights,
    status,
    watching,
)
from workflows.core.naming import (
    LABEL_VERSION,
    NODE_CAPACITY_TYPE,
    scaling_workflow_id,
    spot_reclaim_workflow_id,
    versioned_name,
)
from workflows.rollout.client import rollout_result, start_rollout
from workflows.rollout.contract import retire_workflow_id
from workflows.rollout.types import Outcome, RolloutInput, RolloutResult, Stage
from workflows.scaling.decide import ScalingPolicy
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput, ScalingStatus
from workflows.spot.contract import FailoverPolicy
from workflows.spot.reclaim import ReclaimStatus, SpotReclaimResult
from workflows.spot.watcher import SpotInterruptionWatcher, WatcherInput

NAME, MODEL, STABLE = "chat", "wk-llm", "1.0.0"
PROFILE = Profile(load_seconds=20, error_rate=0.0, ttft_seconds=0.15, tpot_seconds=0.025, capacity_rps=4)
SLOW_LOAD = PROFILE.model_copy(update={"load_seconds": 100})  # Ready 5 s (real) after scheduling
BAD = PROFILE.model_copy(update={"error_rate": 0.3})  # warm-up passes (8 requests), the error gate fails
SMALL, LARGE = 256 * 1024, 64 * 1024 * 1024  # LARGE: eight 8 MiB chunks, so a kill lands mid-download
SCALE_DOWN_DELAY = 4.0
# Where each rollout is killed -> (version, profile, weights bytes, stage at which to kill)
KILL_AT = {
    "staging": ("2.0.0", PROFILE, LARGE, Stage.STAGING),
    "warming_up": ("2.1.0", SLOW_LOAD, SMALL, Stage.WARMING_UP),
    "promoting": ("2.2.0", PROFILE, SMALL, Stage.PROMOTED),
    "rolling_back": ("2.3.0", BAD, SMALL, Stage.ROLLED_BACK),
}


def worker_process(sandbox, log: Path) -> tuple[WorkerProcess, str]:
    """A worker process with the sandbox env on a task queue (and metrics port) of its own."""
    queue = f"kill-{uuid.uuid4().hex[:8]}"
    env = {**sandbox.env, "TIDEPLANE_TASK_QUEUE": queue, "TIDEPLANE_METRICS_PORT": str(free_port())}
    return WorkerProcess(env, log), queue


async def restart(worker: WorkerProcess) -> tuple[int, float]:
    """SIGKILL the worker and start a new process; returns the dead pid and when it died."""
    pid = worker.proc.pid
    assert await asyncio.to_thread(worker.kill) == -signal.SIGKILL
    killed = time.time()
    await asyncio.to_thread(worker.start)
    return pid, killed


async def worker_pids(handle: WorkflowHandle) -> set[str]:
    """Pids of the worker processes that ran this workflow's tasks (from their identities)."""
    pids = set()
    async for e in handle.fetch_history_events():
        if e.HasField("workflow_task_started_event_attributes"):
            pids.add(e.workflow_task_started_event_attributes.identity.split("@")[0])
    return pids


async def activity_attempts(handle: WorkflowHandle, activity: str) -> int:
    """Highest attempt of ``activity`` that started, from the history."""
    scheduled, attempt = set(), 0
    async for e in handle.fetch_history_events():
        if e.HasField("activity_task_scheduled_event_attributes"):
            if e.activity_task_scheduled_event_attributes.activity_type.name == activity:
                scheduled.add(e.event_id)
        elif e.HasField("activity_task_started_event_attributes"):
            started = e.activity_task_started_event_attributes
            if started.scheduled_event_id in scheduled:
                attempt = max(attempt, started.attempt)
    return attempt


# ---- rollouts -----------------------------------------------------------------------------------


@dataclass
class Killed:
    result: RolloutResult
    killed_in: str
    pids: set[str]  # of the processes that ran the rollout's and its RetireVersion's tasks
    killed_pid: int
    new_pid: int
    route_states: list[dict[str, int]]
    cluster: Cluster
    staging_attempts: int
    seconds: float


def upload_weights(sandbox, key: str, size: int, seed: str) -> str:
    data = random.Random(seed).randbytes(size)
    boto3.client(
        "s3", endpoint_url=sandbox.urls["moto"], region_name=AWS_ENV["AWS_DEFAULT_REGION"],
        aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"], aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
    ).put_object(Bucket=WEIGHTS_BUCKET, Key=key, Body=data)
    return hashlib.sha256(data).hexdigest()


def kill_mid_download(worker: WorkerProcess, sidecar: Path, timeout: float) -> int:
    """SIGKILL the worker once the download's checkpoint records a verified chunk and the file
    is not finished; returns the chunks verified at that moment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunks = len(json.loads(sidecar.read_text())["chunks"])
        except (OSError, ValueError, KeyError):
            chunks = 0
        if 0 < chunks < LARGE // CHUNK_BYTES:
            os.kill(worker.proc.pid, signal.SIGKILL)
            worker.proc.wait(10)
            return chunks
        time.sleep(0.002)
    raise AssertionError("the download never reached a first verified chunk in time")


async def roll_out_and_kill(sandbox, api: client.ApiClient, temporal: Client, where: str, log_dir: Path) -> Killed:
    version, profile, size, kill_stage = KILL_AT[where]
    namespace, deployment = f"wk-{where.replace('_', '-')}", f"wk-{where.replace('_', '-')}/{NAME}"
    set_profile(api, MODEL, version, profile)
    key = f"kill/{uuid.uuid4().hex}/model.safetensors"
    sha = await asyncio.to_thread(upload_weights, sandbox, key, size, version)
    create_logical_deployment(api, namespace, NAME, STABLE, MODEL, replicas=1)
    set_demand(api, deployment, Demand(rps=2))
    worker, queue = worker_process(sandbox, log_dir / f"{where}.log")
    await asyncio.to_thread(worker.start)
    try:
        await asyncio.to_thread(wait_until, lambda: Cluster.read(api, namespace).deployments[0].status.ready_replicas, 30, "stable Ready")
        inp = RolloutInput.model_validate({
            "deployment": deployment, "model": MODEL, "version": version, "image": "vllm/vllm-openai:v0.6.3",
            "weights_uri": f"s3://{WEIGHTS_BUCKET}/{key}", "sha256": sha,
            "steps": [{"weight": 50, "window_seconds": 2}],
            "gate_interval_seconds": 1,
            "query_window_seconds": 10,
            "gates": {"min_requests": 1, "max_latency_degradation": 2.0},
            "warm_up": {"requests": 8, "deadline_seconds": 90},
            "deadlines": {"step_ready_seconds": 60},
            "scale_down_delay_seconds": SCALE_DOWN_DELAY,
        })
        with watching(sandbox.urls["kubeapi"], namespace, NAME) as route:
            started = time.monotonic()
            handle = await start_rollout(temporal, inp, task_queue=queue)
            killed_pid = worker.proc.pid
            if kill_stage is Stage.STAGING:
                sidecar = Path(sandbox.env["TIDEPLANE_MODEL_CACHE_DIR"]) / MODEL / version / "model.safetensors.partial.json"
                chunks = await asyncio.to_thread(kill_mid_download, worker, sidecar, 60)
                killed_in = f"staging ({chunks} of {LARGE // CHUNK_BYTES} chunks verified)"
                await asyncio.to_thread(worker.start)
            else:
                deadline = time.monotonic() + 90
                while (now := await status(handle)) is None or now.stage is not kill_stage:
                    assert time.monotonic() < deadline, f"never saw stage {kill_stage.value}; last status {now}"
                    await asyncio.sleep(0.05)
                await restart(worker)
                killed_in = now.stage.value
            result = await asyncio.wait_for(rollout_result(handle), 150)
            seconds = time.monotonic() - started
            await asyncio.sleep(0.5)  # let the watch deliver the last state
            states = [w for _, w in route.events]
        # The result comes when traffic has moved; the version left without it is scaled down
        # scale_down_delay_seconds later by RetireVersion: the cluster is read once that is done,
        # and a kill at promoted / rolled_back leaves that scale-down to the new process.
        await asyncio.wait_for(retired(temporal, deployment, result), SCALE_DOWN_DELAY + 60)
        left = result.previous_version if result.outcome is Outcome.PROMOTED else result.version
        retire = temporal.get_workflow_handle(retire_workflow_id(deployment, left))
        return Killed(
            result=result, killed_in=killed_in, pids=await worker_pids(handle) | await worker_pids(retire), killed_pid=killed_pid,
            new_pid=worker.proc.pid, route_states=states, cluster=Cluster.read(api, namespace),
            staging_attempts=await activity_attempts(handle, "stage_weights"), seconds=seconds,
        )
    finally:
        await asyncio.to_thread(worker.stop)
        set_demand(api, deployment, Demand(rps=0))
        client.CoreV1Api(api).delete_namespace(namespace)


@pytest.fixture(scope="module")
async def rollouts(sandbox, kube, temporal, tmp_path_factory) -> dict[str, Killed]:
    """The four rollouts at once, each with its own worker process killed at its own stage."""
    logs = tmp_path_factory.mktemp("kill-workers")
    done = await asyncio.gather(*(roll_out_and_kill(sandbox, kube, temporal, w, logs) for w in KILL_AT))
    return dict(zip(KILL_AT, done))


@pytest.mark.parametrize("where", list(KILL_AT))
def test_rollout_killed_at_stage_is_finished_by_a_new_worker(rollouts, where):
    run = rollouts[where]
    version = KILL_AT[where][0]
    print(f"\n{where}: killed in {run.killed_in}; {run.result.outcome.value} after {run.seconds:.1f}s,"
          f" staging attempts {run.staging_attempts}, resumed {run.result.staged.resumed_bytes} bytes")
    expected = Outcome.ROLLED_BACK if where == "rolling_back" else Outcome.PROMOTED
    assert run.result.outcome is expected, run.result.reason
    assert {str(run.killed_pid), str(run.new_pid)} <= run.pids, "the new process took the workflow over"
    if where == "staging":
        assert run.killed_in.startswith("staging")
        assert run.staging_attempts == 2 and run.result.staged.resumed_bytes > 0  # resumed, not refetched
        assert run.result.staged.size_bytes == LARGE
    else:
        assert run.killed_in == KILL_AT[where][3].value
        assert run.staging_attempts == 1
    if where == "rolling_back":
        assert run.result.failing_verdict is not None and run.result.failed_gates

    # Exactly one Deployment and Service per version, one route; weights always summed to 100.
    cluster = run.cluster
    old, new = versioned_name(NAME, STABLE), versioned_name(NAME, version)
    assert sorted(d.metadata.name for d in cluster.deployments) == sorted([old, new])
    assert sorted(sv.metadata.name for sv in cluster.services) == sorted([old, new])
    assert [d.metadata.labels[LABEL_VERSION] for d in cluster.deployments if d.metadata.name == new] == [version]
    (route,) = cluster.routes
    final = route_weights(route)
    if expected is Outcome.PROMOTED:
        assert final == {old: 0, new: 100} and cluster.replicas(STABLE) == 0 and cluster.replicas(version) == 1
    else:
        assert final == {old: 100, new: 0} and cluster.replicas(STABLE) == 1 and cluster.replicas(version) == 0
    assert run.route_states and all(sum(w.values()) == 100 for w in run.route_states), run.route_states
    assert {new: 50, old: 50} in run.route_states  # the watch saw the canary step


# ---- scaling loop -------------------------------------------------------------------------------

SCALE_NS = "wk-scaling"
SCALE_MODEL = "wk-scale-llm"
# One decision adds at most 4 replicas, below max_replicas: a repeated decision would show as more.
# The queue is the only trigger: TTFT lags it (the backlog's TTFT outlives the backlog), which
# would be a second, legitimate step up here.
SCALE_POLICY = ScalingPolicy(
    min_replicas=1, max_replicas=8, max_step_up=4, queue_per_replica=2, queue_capacity_per_replica=4,
    ttft_p99_slo_seconds=600, gpu_util_sustain_seconds=0, stabilisation_seconds=3, cooldown_seconds=20,
    replica_capacity_rps=4 * TEST_TIME_SCALE,  # 4 req/s of sandbox time; Prometheus' rate() counts real seconds
)
SCALE_INTERVAL = 2  # 20 decisions kept in the status span 40 s: the scale-up stays in view


class SpecReplicas(threading.Thread):
    """Samples a Deployment's spec.replicas in the background (the most seen is what counts)."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str):
        super().__init__(daemon=True)
        self.apps, self.namespace, self.name = client.AppsV1Api(api), namespace, name
        self.seen: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.seen.append(self.apps.read_namespaced_deployment(self.name, self.namespace).spec.replicas)


async def scaling_status(handle: WorkflowHandle) -> ScalingStatus | None:
    try:
        return await handle.query(ReactiveScaling.status, rpc_timeout=timedelta(seconds=3))
    except RPCError:
        return None


async def decision(handle: WorkflowHandle, match, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = await scaling_status(handle)
        found = [d for d in (now.decisions if now else []) if match(d)]
        if found:
            return found, now
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_scaling_loop_killed_after_scale_up_carries_on_in_the_same_run(sandbox, kube, temporal, tmp_path):
    deployment = f"{SCALE_NS}/{NAME}"
    name = create_logical_deployment(kube, SCALE_NS, NAME, STABLE, SCALE_MODEL, replicas=1)
    apps = client.AppsV1Api(kube)
    ready = lambda: apps.read_namespaced_deployment(name, SCALE_NS).status.ready_replicas or 0
    worker, queue = worker_process(sandbox, tmp_path / "scaling-worker.log")
    spec = SpecReplicas(kube, SCALE_NS, name)
    await asyncio.to_thread(worker.start)
    try:
        await asyncio.to_thread(wait_until, ready, 30, "the first replica")
        set_profile(kube, SCALE_MODEL, None, SLOW_LOAD)  # replicas added from now on load for 5 s
        handle = await temporal.start_workflow(
            ReactiveScaling.run, ScalingInput(deployment=deployment, policy=SCALE_POLICY, interval_seconds=SCALE_INTERVAL, window="5s"),
            id=scaling_workflow_id(deployment), task_queue=queue,
        )
        run_id = (await handle.describe()).run_id
        spec.start()
        set_demand(kube, deployment, Demand(rps=15))  # one replica serves 4 rps, the rest queues
        (up,), _ = await decision(handle, lambda d: d.desired > d.current, 60, "a scale-up decision")
        set_demand(kube, deployment, Demand(rps=1))  # no reason left for a second step up
        assert up.applied and up.current == 1 and up.desired > 2, up
        killed_pid, killed = await restart(worker)
        ready_at_kill = await asyncio.to_thread(ready)
        assert ready_at_kill < up.desired, "killed while the new replicas were still loading"

        after, _ = await decision(handle, lambda d: d.at.timestamp() > killed, 60, "a decision by the new worker")
        await asyncio.to_thread(wait_until, lambda: ready() == up.desired, 30, f"{up.desired} Ready replicas")
        (down, *_), now = await decision(handle, lambda d: d.desired < d.current, 60, "a first step down")
        spec.stop.set()
        spec.join(5)
        print(f"\nscaling: up {up.current}->{up.desired} at kill ({ready_at_kill} Ready), new worker's first decision"
              f" {after[0].at.timestamp() - killed:.1f}s after the kill, first step down"
              f" {(down.at - up.at).total_seconds():.1f}s after the scale-up; spec replicas seen {sorted(set(spec.seen))}")
        assert (await handle.describe()).run_id == run_id, "the same run carried on"
        assert {str(killed_pid), str(worker.proc.pid)} <= await worker_pids(handle)
        assert [d.at for d in now.decisions].count(up.at) == 1, "the decision is recorded once"
        ups = [d for d in now.decisions if d.desired > d.current]
        assert ups == [up], "the scale-up was not repeated"
        assert max(spec.seen) == up.desired, "spec replicas never went past the one decision"
        assert (down.at - up.at).total_seconds() >= SCALE_POLICY.cooldown_seconds, "cooldown from the first worker's change"
        assert down.current - down.desired == 1
        await handle.terminate()
    finally:
        spec.stop.set()
        await asyncio.to_thread(worker.stop)
        set_demand(kube, deployment, Demand(rps=0))
        client.CoreV1Api(kube).delete_namespace(SCALE_NS)


# ---- spot failover ------------------------------------------------------------------------------

SPOT_NS = "wk-spot"
SPOT_MODEL = "wk-spot-llm"
SPOT_REPLICAS = 2
# The two-minute notice lasts 60 s here: room for a kill and for the activity the kill cut short to
# time out (30 s) before the deadline. The instance goes as soon as the reclaim is done.
NOTICE_SCALE = 2
SPOT_POLICY = FailoverPolicy(
    on_demand_pool_asg="gpu-on-demand", poll_seconds=0.5, drain_margin_seconds=2, restore_timeout_seconds=60,
    return_to_spot=False,
)


def retried(call, attempts: int = 20):
    """A test-side read while faults are on: retried until the API answers."""
    for attempt in range(attempts):
        try:
            return call()
        except client.ApiException:
            if attempt == attempts - 1:
                raise
            time.sleep(0.1)


async def test_spot_failover_killed_while_replacements_come_up_under_kube_faults(sandbox, kube, temporal, tmp_path):
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    spot = lambda: [n for n in core.list_node(label_selector=f"{NODE_CAPACITY_TYPE}=spot").items if not n.spec.unschedulable]
    node = (await asyncio.to_thread(wait_until, spot, 60, "a spot node"))[0].metadata.name
    name = create_logical_deployment(kube, SPOT_NS, NAME, STABLE, SPOT_MODEL, replicas=0)
    apps.patch_namespaced_deployment(name, SPOT_NS, {"spec": {"replicas": SPOT_REPLICAS, "template": {"spec": {"nodeSelector": {NODE_CAPACITY_TYPE: "spot"}}}}})
    set_demand(kube, f"{SPOT_NS}/{NAME}", Demand(rps=2))
    await asyncio.to_thread(
        wait_until, lambda: (apps.read_namespaced_deployment(name, SPOT_NS).status.ready_replicas or 0) == SPOT_REPLICAS,
        30, "the spot replicas",
    )
    set_profile(kube, SPOT_MODEL, None, SLOW_LOAD)  # replacements take 5 s to load
    worker, queue = worker_process(sandbox, tmp_path / "spot-worker.log")
    await asyncio.to_thread(worker.start)
    watcher = await temporal.start_workflow(
        SpotInterruptionWatcher.run, WatcherInput(policy=SPOT_POLICY, wait_seconds=1, idle_seconds=0),
        id=f"spot-watcher-kill-{uuid.uuid4().hex[:8]}", task_queue=queue,
    )
    terminate: asyncio.Task | None = None
    try:
        async with httpx.AsyncClient(base_url=sandbox.urls["kubeapi"]) as http:
            interruption = await asyncio.to_thread(spot_interrupt, sandbox.env, node, time_scale=NOTICE_SCALE, wait=False)
            (await http.put("/sandbox/faults", json=KUBE_FAULTS)).raise_for_status()
            try:
                terminate = asyncio.create_task(terminate_after_notice(sandbox, interruption.instance_id))
                reclaim = temporal.get_workflow_handle(spot_reclaim_workflow_id(interruption.instance_id), result_type=SpotReclaimResult)
                phase = await reclaim_phase(reclaim, 30)
                killed_pid, _ = await restart(worker)
                try:
                    result = await asyncio.wait_for(reclaim.result(), 120)
                except WorkflowFailureError as err:
                    raise AssertionError(f"the reclaim failed: {err.cause!r} caused by {err.cause.cause!r}") from err
                node_left = not terminate.done()  # read before the instance goes: drained, not just gone
                on_node = [p for p in retried(lambda: core.list_namespaced_pod(SPOT_NS)).items if p.spec.node_name == node and p.metadata.deletion_timestamp is None]
                fallback_ready = await asyncio.to_thread(
                    wait_until,
                    lambda: (retried(lambda: apps.read_namespaced_deployment(fallback_name(name), SPOT_NS)).status.ready_replicas or 0) >= SPOT_REPLICAS,
                    30, "the fallback replicas Ready",
                )
                deployments = retried(lambda: apps.list_namespaced_deployment(SPOT_NS)).items
                if not terminate.done():  # the instance goes as soon as it is drained
                    terminate.cancel()
                    await terminate_now(sandbox, interruption.instance_id)
            finally:
                (await http.delete("/sandbox/faults")).raise_for_status()
        print(f"\nspot: killed in phase {phase}; outcome {result.outcome}, evicted {result.evicted},"
              f" replacements Ready after {result.replacement_ready_seconds}s, capacity gap {result.capacity_gap_seconds:.1f}s")
        assert phase == "replacing"
        assert result.outcome == "drained" and result.node == node
        # Drained through the Eviction API while the node was still there. (An eviction attempt that
        # a fault cut short evicted some pods; its retry finds them gone, so ``evicted`` counts only
        # the pods of the last attempt.)
        assert node_left and result.evicted >= 1, "drained through the Eviction API before the node went"
        ours = [a for a in result.affected if a.namespace == SPOT_NS]
        assert [a.replicas_on_node for a in ours] == [SPOT_REPLICAS]
        assert {str(killed_pid), str(worker.proc.pid)} <= await worker_pids(reclaim)
        assert fallback_ready and not on_node, "the node was drained and the fallback serves"
        fallbacks = [d for d in deployments if FALLBACK_FOR in (d.metadata.labels or {})]
        assert [d.metadata.name for d in fallbacks] == [fallback_name(name)], "one fallback Deployment"
        assert fallbacks[0].spec.replicas == SPOT_REPLICAS, "the claim was set once, not added twice"
        assert sorted(d.metadata.name for d in deployments) == sorted([name, fallback_name(name)])
    finally:
        if terminate is not None and not terminate.done():
            terminate.cancel()
        await watcher.terminate()
        await asyncio.to_thread(worker.stop)
        set_demand(kube, f"{SPOT_NS}/{NAME}", Demand(rps=0))
        client.CoreV1Api(kube).delete_namespace(SPOT_NS)


async def reclaim_phase(handle: WorkflowHandle, timeout: float) -> str:
    """Wait for the reclaim to be bringing replacements up; returns the phase seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            st = await handle.query("status", result_type=ReclaimStatus, rpc_timeout=timedelta(seconds=3))
        except RPCError:
            st = None
        if st is not None and st.phase not in ("waiting", "cordoning"):
            return st.phase
        await asyncio.sleep(0.05)
    raise AssertionError("the reclaim never started replacing")


async def terminate_after_notice(sandbox, instance_id: str) -> None:
    """EC2 takes the instance back when the (time-scaled) notice runs out."""
    await asyncio.sleep(120 / NOTICE_SCALE)
    await terminate_now(sandbox, instance_id)


async def terminate_now(sandbox, instance_id: str) -> None:
    autoscaling = boto3.client(
        "autoscaling", endpoint_url=sandbox.urls["moto"], region_name=AWS_ENV["AWS_DEFAULT_REGION"],
        aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"], aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    await asyncio.to_thread(
        autoscaling.terminate_instance_in_auto_scaling_group, InstanceId=instance_id, ShouldDecrementDesiredCapacity=False
    )
