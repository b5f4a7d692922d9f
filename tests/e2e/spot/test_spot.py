"""End to end against the sandbox: a spot node serving replicas under load is reclaimed.

Real parts: the sandbox's Temporal dev server, moto (SQS queue, Auto Scaling groups, EC2), the
Kubernetes API emulator (scheduler, kubelet, Eviction API), the cloud loop (instances <-> Nodes)
and the fleet simulator, whose OpenAI-compatible proxy takes requests for the tier throughout
(none may fail). ``spot_interrupt`` publishes the real-format EventBridge event and
terminates the instance after the time-scaled notice; the watcher, SpotReclaim and ReturnToSpot
run with the production activity classes, built here with clients pointed at the sandbox. A
monitor thread samples Ready counts throughout. The fallback claims are also checked directly
against the emulator (idempotent, invisible to rollouts).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from kubernetes import client, config
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.clients.aws import AwsClient
from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.clients.s3 import S3Client
from activities.clients.vllm import VllmClient
from activities.core.notifier import Notifier
from activities.rollout.rollout_activities import RolloutActivities
from activities.rollout.serving_pods import ServingPods
from activities.spot.fallback_deployments import FALLBACK_FOR, fallback_name
from activities.spot.failover_notices import SpotNotifyActivities
from activities.spot.spot_activities import SpotActivities
from activities.spot.spot_workflow_starts import SpotWorkflowStarts
from infra.sandbox.config import DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, Profile
from infra.sandbox.knobs import set_profile
from infra.sandbox.launcher import AWS_ENV
from infra.sandbox.spot import spot_interrupt_running
from tests.sandbox_fixtures import create_logical_deployment, wait_for
from workers.worker import activity_methods
from workflows.core.naming import (
    LABEL_APP,
    NODE_CAPACITY_TYPE,
    NODE_POOL,
    DeploymentRef,
    return_to_spot_workflow_id,
    spot_reclaim_workflow_id,
)
from workflows.spot.contract import (
    ClaimFallbackInput,
    CountsInput,
    FailoverPolicy,
    FallbackClaims,
    ReleaseFallbackInput,
)
from workflows.spot import contract as spot_contract
from workflows.spot.reclaim import SpotReclaim, SpotReclaimResult
from workflows.spot.return_to_spot import ReturnToSpot, ReturnToSpotResult
from workflows.spot.watcher import SpotInterruptionWatcher, WatcherInput

NAMESPACE = "e2e-spot"
REPLICAS = 3
ON_DEMAND_POOL = "gpu-on-demand"
# Sandbox seconds scaled down like the cluster: the 2-minute notice lasts 6 s here.
POLICY = FailoverPolicy(
    on_demand_pool_asg=ON_DEMAND_POOL,
    poll_seconds=0.5,
    drain_margin_seconds=2,
    restore_timeout_seconds=60,
    stabilisation_seconds=3,
    max_stabilisation_seconds=12,
)



@pytest.fixture(scope="module")
def aws(sandbox) -> AwsClient:
    return AwsClient(
        AWS_ENV["AWS_DEFAULT_REGION"], sandbox.urls["moto"],
        access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"], secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
    )


@pytest.fixture(scope="module")
def spot(sandbox, aws) -> SpotActivities:
    """The production spot activities over the sandbox's cluster, SQS queue and Auto Scaling groups."""
    return SpotActivities(KubeClient.connect(sandbox.kubeconfig), aws, queue_url=sandbox.env["TIDEPLANE_SPOT_QUEUE_URL"])


class Monitor(threading.Thread):
    """Samples the spot Deployment's own and fallback Ready pods and the node's cordon."""

    def __init__(self, core: client.CoreV1Api, selector: str, node: str, pool_desired):
        super().__init__(daemon=True)
        self.core, self.selector, self.node, self.pool_desired = core, selector, node, pool_desired
        self.samples: list[tuple[float, int, int]] = []  # (t, own ready, fallback ready)
        self.cordoned = False
        self.max_pool = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=self.selector).items
            ready = [p for p in pods if p.metadata.deletion_timestamp is None
                     and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]
            fallback = sum(1 for p in ready if FALLBACK_FOR in (p.metadata.labels or {}))
            self.samples.append((time.monotonic(), len(ready) - fallback, fallback))
            try:
                node = self.core.read_node(self.node)
                self.cordoned = self.cordoned or bool(node.spec.unschedulable)
            except client.ApiException:
                pass
            if len(self.samples) % 5 == 0:
                self.max_pool = max(self.max_pool, self.pool_desired())
            time.sleep(0.1)


class Requests(threading.Thread):
    """Completions sent through the fleet simulator's OpenAI-compatible proxy, as a client of the tier would."""

    def __init__(self, url: str, per_second: float = 10):
        super().__init__(daemon=True)
        self.url, self.interval = url, 1 / per_second
        self.results: list[tuple[float, int, str]] = []  # (t, HTTP status, error text)
        self.stop = threading.Event()

    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=8) as pool:
            while not self.stop.is_set():
                pool.submit(self._one)
                time.sleep(self.interval)

    def _one(self) -> None:
        t = time.monotonic()
        try:
            r = httpx.post(self.url, json={"prompt": "tide", "max_tokens": 8}, timeout=10)
            self.results.append((t, r.status_code, "" if r.status_code == 200 else r.text[:200]))
        except httpx.HTTPError as exc:
            self.results.append((t, 0, f"{type(exc).__name__}: {exc}"))


async def test_spot_node_reclaimed_under_load_fails_over_and_returns(sandbox, aws, spot):
    env = sandbox.env
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)

    def desired(pool: str) -> int:
        return aws.auto_scaling_group(pool)["DesiredCapacity"]

    spot_nodes = lambda: [n for n in core.list_node(label_selector=f"{NODE_CAPACITY_TYPE}=spot").items
                          if not n.spec.unschedulable]
    node = (await wait_for(spot_nodes, 60, "a spot node"))[0].metadata.name
    od_base = desired(ON_DEMAND_POOL)

    # The spot tier: pinned to spot nodes, all its replicas on the one spot node, under load.
    # vLLM drains its in-flight requests on SIGTERM within the pod's grace period (30 s by default): an
    # evicted replica answers what it already accepted. The default sandbox drain (5 s) is shorter than
    # one of these 5 s answers, so a request accepted just before the eviction would be cut off.
    set_profile(api, "llama-3-8b", "1.0.0", Profile(load_seconds=20, error_rate=0.0, ttft_seconds=0.15,
                                                     tpot_seconds=0.025, capacity_rps=4, shutdown_seconds=30))
    name = create_logical_deployment(api, NAMESPACE, "chat", "1.0.0", "llama-3-8b", replicas=0)
    apps.patch_namespaced_deployment(name, NAMESPACE, {"spec": {"replicas": REPLICAS, "template": {"spec": {"nodeSelector": {NODE_CAPACITY_TYPE: "spot"}}}}})
    demand = core.read_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE)
    core.patch_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, {"data": {**(demand.data or {}), f"{NAMESPACE}/chat": json.dumps({"rps": 6})}})
    selector = "app.kubernetes.io/name=chat,app.kubernetes.io/version=1.0.0"

    def own_ready_on_spot() -> bool:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return sum(1 for p in pods if p.spec.node_name == node and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))) == REPLICAS

    await wait_for(own_ready_on_spot, 30, f"{REPLICAS} Ready replicas on {node}")
    # The proxy routes to the pods the fleet simulator has taken in, from a snapshot up to a tick
    # behind the API (as endpoints lag a pod's Ready in a cluster): the load starts once it answers,
    # so every failure counted below is the reclaim's, not the tier's setup.
    completions = f"{sandbox.urls['fleet']}/proxy/{NAMESPACE}/{name}/v1/completions"
    serves = lambda: httpx.post(completions, json={"prompt": "tide", "max_tokens": 8}, timeout=10).status_code == 200
    await wait_for(serves, 30, f"the proxy to answer through service {NAMESPACE}/{name}")

    temporal = await Client.connect(env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    task_queue = f"spot-e2e-{uuid.uuid4()}"
    monitor = Monitor(core, selector, node, lambda: desired(ON_DEMAND_POOL))
    requests = Requests(completions)
    with ThreadPoolExecutor(max_workers=16) as executor:
        starts = SpotWorkflowStarts()
        # the worker's notifier as the sandbox configures it: Events in the emulator, the sandbox's webhook receiver
        notifier = Notifier(KubeClient.connect(sandbox.kubeconfig), env["TIDEPLANE_NOTIFY_WEBHOOK_URL"], "generic", env["TIDEPLANE_WEB_UI_URL"])
        activities = [
            *activity_methods(spot, SpotActivities), *activity_methods(SpotNotifyActivities(notifier), spot_contract.SpotNotifyActivities),
            starts.start_spot_reclaim, starts.start_return_to_spot,
        ]
        workflows = [SpotInterruptionWatcher, SpotReclaim, ReturnToSpot]
        async with Worker(temporal, task_queue=task_queue, workflows=workflows, activities=activities, activity_executor=executor):
            watcher = await temporal.start_workflow(
                SpotInterruptionWatcher.run,
                WatcherInput(policy=POLICY, wait_seconds=1, idle_seconds=0),
                id=f"spot-watcher-e2e-{uuid.uuid4()}",
                task_queue=task_queue,
            )
            monitor.start()
            requests.start()
            started = time.monotonic()
            interruption = await asyncio.to_thread(spot_interrupt_running, sandbox.state_dir, node)
            assert interruption.terminated

            reclaim = temporal.get_workflow_handle(spot_reclaim_workflow_id(interruption.instance_id), result_type=SpotReclaimResult)
            result = await asyncio.wait_for(reclaim.result(), 45)
            requests.stop.set()
            back = temporal.get_workflow_handle(return_to_spot_workflow_id(NAMESPACE, name), result_type=ReturnToSpotResult)
            returned = await asyncio.wait_for(back.result(), 45)
            elapsed = time.monotonic() - started
            monitor.stop.set()
            await watcher.signal(SpotInterruptionWatcher.stop)
            status = await asyncio.wait_for(watcher.result(), 30)
    monitor.join(5)
    requests.join(15)

    totals = [own + fb for _, own, fb in monitor.samples]
    print(f"\nspot reclaim of {node} ({interruption.instance_id}): capacity gap {result.capacity_gap_seconds:.1f} s"
          f" (workflow clock), replacements Ready after {result.replacement_ready_seconds} s,"
          f" lowest Ready {min(totals)}/{REPLICAS}, back on spot after {elapsed:.1f} s;"
          f" {len(requests.results)} requests through the proxy during the reclaim,"
          f" {sum(1 for _, status, _ in requests.results if status != 200)} failed")
    # The sandbox is shared by the session: other tests' serving pods may sit on the node too,
    # and the reclaim moves them as well; this test's deployment is the one it measures.
    ours = [a for a in result.affected if a.namespace == NAMESPACE]
    assert result.outcome == "drained" and result.node == node
    assert [a.replicas_on_node for a in ours] == [REPLICAS]
    assert result.evicted >= REPLICAS and result.evicted == result.replicas_moved, "drained through the Eviction API"
    assert monitor.cordoned, "the node was cordoned before it went away"
    assert max(fb for _, _, fb in monitor.samples) == REPLICAS, "on-demand replacements were Ready"
    assert min(totals) >= REPLICAS - ours[0].replicas_on_node
    assert status.started == 1 and status.malformed == 0
    failed = [(round(t - started, 1), status, text) for t, status, text in requests.results if status != 200]
    assert len(requests.results) >= 50 and not failed, f"requests failed during the reclaim: {failed[:5]}"
    assert result.capacity_gap_seconds == 0, "replacements were Ready before the drain: the workflow measured no gap"

    # the people who run the tier are told (issue 35): the webhook receiver's message, an Event on the Deployment
    told = [m for m in httpx.get(sandbox.urls["webhook"] + "/messages", timeout=10).json()
            if m.get("kind") == "spot_failover" and m.get("deployment") == f"{NAMESPACE}/{name}"]
    assert [(m["instance_id"], m["node"], m["replicas_moved"], m["capacity_gap_seconds"]) for m in told] == [
        (interruption.instance_id, node, REPLICAS, 0)
    ], told
    assert told[0]["link"].endswith(reclaim.id.replace("/", "%2F"))
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
    assert [(e.reason, e.type, e.metadata.name) for e in events if e.reason == "SpotFailover"] == [("SpotFailover", "Normal", told[0]["key"])]
    described = subprocess.run(["kubectl", "--kubeconfig", str(sandbox.kubeconfig), "describe", "deployment", name, "-n", NAMESPACE],
                               capture_output=True, text=True, timeout=30)
    assert "SpotFailover" in described.stdout and f"instance {interruption.instance_id}" in described.stdout, described.stdout + described.stderr

    # back on spot: the replacement spot node serves the tier, the on-demand fallback is gone
    assert returned.released_replicas == REPLICAS
    fallback = apps.read_namespaced_deployment(fallback_name(name), NAMESPACE)
    assert fallback.spec.replicas == 0
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    # a fallback pod may still be listed, terminating, after its on-demand node went back to the pool
    capacity = {n.metadata.name: (n.metadata.labels or {}).get(NODE_CAPACITY_TYPE) for n in core.list_node().items}
    on_spot = [p for p in pods if capacity.get(p.spec.node_name) == "spot" and FALLBACK_FOR not in (p.metadata.labels or {})]
    assert len(on_spot) == REPLICAS and all(p.spec.node_name != node for p in on_spot)
    assert monitor.max_pool == od_base + 1, "one on-demand node added for the reclaimed instance"
    assert desired(ON_DEMAND_POOL) == od_base, "the on-demand pool got its node back"
    assert core.list_node(label_selector=f"{NODE_POOL}=gpu-spot").items, "the spot pool has a node again"


def test_fallback_claims_converge_and_stay_out_of_the_logical_deployment(sandbox, spot, tmp_path):
    """Claims are set, not added: a retried or repeated claim leaves the same fallback."""
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    apps = client.AppsV1Api(api)
    ns = "e2e-spot-claims"
    name = create_logical_deployment(api, ns, "embed", "2.0.0", "bge-large", replicas=1)
    key = DeploymentRef(namespace=ns, name=name)
    rollout = RolloutActivities(
        KubeClient(api), S3Client(sandbox.urls["moto"], AWS_ENV["AWS_DEFAULT_REGION"]), PrometheusClient(sandbox.urls["prometheus"]),
        VllmClient(), ServingPods(model_cache_dir=tmp_path), gateway="inference-gateway",
        service_url_template="http://{service}.{namespace}.svc.cluster.local:8000",
    )

    def claim(instance: str, replicas: int) -> FallbackClaims:
        return spot.claim_spot_fallback(ClaimFallbackInput(deployment=key, claimant=instance, replicas=replicas))

    assert claim("i-0aaaaaaaaaaaaaaaa", 2).replicas == 2
    assert claim("i-0aaaaaaaaaaaaaaaa", 2).replicas == 2, "a retry does not add again"
    assert claim("i-0bbbbbbbbbbbbbbbb", 1).replicas == 3
    assert claim("i-0aaaaaaaaaaaaaaaa", 0).claims == {"i-0bbbbbbbbbbbbbbbb": 1}
    fallback = apps.read_namespaced_deployment(fallback_name(name), ns)
    assert fallback.spec.replicas == 1
    assert fallback.spec.template.spec.node_selector == {NODE_CAPACITY_TYPE: "on-demand"}
    assert LABEL_APP not in (fallback.metadata.labels or {}), "not listed as a version of the logical deployment"
    assert [v.version for v in rollout.describe_deployment(DeploymentRef(namespace=ns, name="embed")).versions] == ["2.0.0"]

    released = spot.release_spot_fallback(ReleaseFallbackInput(deployment=key))
    assert released.replicas == 1 and released.claims == {"i-0bbbbbbbbbbbbbbbb": 1}
    assert apps.read_namespaced_deployment(fallback_name(name), ns).spec.replicas == 0
    counts = spot.spot_replica_counts(CountsInput(deployments=[key])).counts[0]
    assert (counts.desired, counts.fallback_desired) == (1, 0)
    with pytest.raises(ApplicationError, match="not found"):
        spot.claim_spot_fallback(ClaimFallbackInput(deployment=DeploymentRef(namespace=ns, name="nope"), claimant="i-0aaaaaaaaaaaaaaaa", replicas=1))
