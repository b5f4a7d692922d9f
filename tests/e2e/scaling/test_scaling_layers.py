"""End to end against the sandbox: priority pools and the three scaling layers working together.

Deployments are laid out by the real ensure_version activity, so their class sets their node
selector; the emulator's scheduler decides where pods land. Then a batch deployment's loop
scales up, the new pods go Unschedulable for want of spot GPUs, the spot pool's NodePoolScaling
grows the Auto Scaling group (moto), the sandbox's cloud turns the instances into nodes and the
pods become Ready; meanwhile the CPU fallback covers the gap and goes back to zero.
"""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client, config
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.clients.aws import AwsClient
from activities.clients.kube import KubeClient
from activities.scaling.node_pool_activities import NodePoolActivities
from infra.sandbox.config import DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, NodePool
from infra.sandbox.launcher import AWS_ENV
from infra.sandbox.nodes import Instance, node_manifest
from infra.sandbox.ports import free_port
from infra.sandbox.worker_identity import enable_serving_namespace
from tests.e2e.scaling.test_scaling import MODEL_CACHE, rollout_activities, scaling_activities
from tests.sandbox_fixtures import wait_for
from tests.workflows.core.test_telemetry import ours, samples
from workers.telemetry import metrics_runtime
from workflows.core import naming
from workflows.core.naming import LABEL_APP, NODE_CAPACITY_TYPE, NODE_POOL, DeploymentRef, node_pool_workflow_id
from workflows.rollout.contract import EnsureVersionInput
from workflows.scaling.contract import PoolRef
from workflows.scaling.cpu_fallback import CpuFallback
from workflows.scaling.decide import ScalingPolicy
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput, ScalingStatus
from workflows.scaling.node_pools import NodePoolInput, NodePoolScaling, NodePoolStatus
from workflows.scaling.placement import PoolSizing
from workflows.core.telemetry import (
    COLD_START_SECONDS,
    REPLICAS_DESIRED,
    REPLICAS_READY,
    SCALE_UP_ATTEMPTS,
    SCALE_UP_SUCCESSES,
    SCALING_DECISIONS,
)

SPOT_POOL = "gpu-spot"


def node_pool_activities(sandbox) -> NodePoolActivities:
    """The node layer's production activities over the sandbox's cluster and Auto Scaling groups (moto)."""
    aws = AwsClient(
        AWS_ENV["AWS_DEFAULT_REGION"], sandbox.urls["moto"],
        access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"], secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    return NodePoolActivities(KubeClient.connect(sandbox.kubeconfig), aws)


def ensure(sandbox, namespace: str, name: str, priority_class: str, replicas: int, gpus: int, model: str = "llama-3-8b") -> None:
    req = EnsureVersionInput(
        deployment=DeploymentRef(namespace=namespace, name=name),
        model=model,
        version="1.0.0",
        image="vllm/vllm-openai:v0.8.5",
        gpus_per_replica=gpus,
        replicas=replicas,
        weights_path=f"{MODEL_CACHE}/{model}/1.0.0",
        priority_class=priority_class,
    )
    ActivityEnvironment().run(rollout_activities(sandbox).ensure_version, req)


def pods(core: client.CoreV1Api, namespace: str, name: str) -> list[client.V1Pod]:
    return [p for p in core.list_namespaced_pod(namespace, label_selector=f"{LABEL_APP}={name}").items if p.metadata.deletion_timestamp is None]


def capacity_of(core: client.CoreV1Api, node: str) -> str:
    return core.read_node(node).metadata.labels[NODE_CAPACITY_TYPE]


def ready_count(apps: client.AppsV1Api, namespace: str, deployment: str) -> int:
    return apps.read_namespaced_deployment(deployment, namespace).status.ready_replicas or 0


def register_node(core: client.CoreV1Api, name: str, capacity_type: str) -> None:
    """A 4-GPU node registered by the test itself (not an instance of the sandbox's cloud, which leaves it alone),
    so there is room of both capacity types whatever earlier tests left running."""
    pool = NodePool(name="e2e-priority", count=1, capacity_type=capacity_type, gpus=4)
    body = node_manifest(Instance(f"i-{uuid.uuid4().hex[:17]}", pool.name, "us-east-1a", "p5.48xlarge", name, "10.9.9.9", "running"), pool)
    body["spec"]["providerID"] = f"e2e://{name}"
    core.create_node(body)


async def test_batch_pods_land_on_spot_and_realtime_pods_on_on_demand(sandbox):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    namespace = "e2e-priority"
    extra = {"e2e-priority-spot": "spot", "e2e-priority-od": "on-demand"}
    for name, capacity_type in extra.items():
        register_node(core, name, capacity_type)
    enable_serving_namespace(core.api_client, namespace)
    ensure(sandbox, namespace, "nightly", "batch", replicas=2, gpus=1)
    ensure(sandbox, namespace, "chat", "realtime", replicas=2, gpus=1)

    def placed() -> dict[str, list[str]] | None:
        out = {name: [p.spec.node_name for p in pods(core, namespace, name)] for name in ("nightly", "chat")}
        return out if all(len(nodes) == 2 and all(nodes) for nodes in out.values()) else None

    nodes = await wait_for(placed, 20, "all four pods scheduled")
    assert {capacity_of(core, n) for n in nodes["nightly"]} == {"spot"}
    assert {capacity_of(core, n) for n in nodes["chat"]} == {"on-demand"}
    for name in ("nightly", "chat"):
        apps.delete_namespaced_deployment(naming.versioned_name(name, "1.0.0"), namespace)
    await wait_for(lambda: not pods(core, namespace, "nightly") and not pods(core, namespace, "chat"), 20, "the pods to go")
    for name in extra:
        core.delete_node(name)


async def test_loop_scale_up_grows_the_spot_pool_and_the_cpu_fallback_covers_the_gap(sandbox):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    namespace = "e2e-layers"

    def spot_nodes() -> list[str]:
        return [n.metadata.name for n in core.list_node(label_selector=f"{NODE_POOL}={SPOT_POOL}").items]

    def set_demand(rps: float) -> None:
        core.patch_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, {"data": {f"{namespace}/digest": json.dumps({"rps": rps})}})

    # Whatever earlier tests left on the spot nodes, three whole-node replicas need new spot nodes.
    start = len(spot_nodes())
    enable_serving_namespace(core.api_client, namespace)
    ensure(sandbox, namespace, "digest", "batch", replicas=1, gpus=4, model="llama-3-70b")
    ensure(sandbox, namespace, "digest-cpu", "realtime", replicas=0, gpus=0, model="llama-3-70b-cpu")
    gpu_dep, cpu_dep = naming.versioned_name("digest", "1.0.0"), naming.versioned_name("digest-cpu", "1.0.0")
    want = 3

    policy = ScalingPolicy(
        priority_class="batch", min_replicas=0, max_replicas=want, gpus_per_replica=4,
        queue_per_replica=2, queue_capacity_per_replica=4, ttft_p99_slo_seconds=30, gpu_util_sustain_seconds=0,
        stabilisation_seconds=600, cooldown_seconds=600,
        cpu_fallback=CpuFallback(deployment=f"{namespace}/digest-cpu", version="1.0.0", replicas=2, after_seconds=1, stabilisation_seconds=2),
    )
    sizing = PoolSizing(min_nodes=start, max_nodes=start + want, warm_standby=0, gpus_per_node=4, pending_grace_seconds=1)
    metrics_port = free_port()  # the worker's metrics, as Prometheus would scrape them
    temporal = await Client.connect(
        sandbox.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter,
        runtime=metrics_runtime(metrics_port, host="127.0.0.1"),
    )
    queue = f"layers-e2e-{uuid.uuid4().hex[:6]}"
    scaling, pools = scaling_activities(sandbox), node_pool_activities(sandbox)
    worker = Worker(
        temporal,
        task_queue=queue,
        workflows=[ReactiveScaling, NodePoolScaling],
        activities=[
            scaling.read_scaling_signals, scaling.get_scale, rollout_activities(sandbox).scale_version,
            pools.observe_node_pool, pools.set_pool_capacity, pools.remove_pool_node,
        ],
        activity_executor=ThreadPoolExecutor(6),
    )
    cpu_replicas_seen: set[int] = set()

    def gpu_ready_and_fallback_gone() -> bool:
        cpu_replicas = apps.read_namespaced_deployment(cpu_dep, namespace).spec.replicas
        cpu_replicas_seen.add(cpu_replicas)
        return ready_count(apps, namespace, gpu_dep) == want and 2 in cpu_replicas_seen and cpu_replicas == 0

    async with worker:
        pool = await temporal.start_workflow(
            NodePoolScaling.run,
            NodePoolInput(pool=PoolRef(pool=SPOT_POOL, capacity_type="spot"), sizing=sizing, interval_seconds=1),
            id=node_pool_workflow_id(SPOT_POOL), task_queue=queue,
        )
        loop = await temporal.start_workflow(
            ReactiveScaling.run,
            ScalingInput(deployment=f"{namespace}/digest", policy=policy, interval_seconds=1, window="5s"),
            id=naming.scaling_workflow_id(f"{namespace}/digest"), task_queue=queue,
        )
        set_demand(4 * want * 1.5)  # well past what one replica serves
        await wait_for(gpu_ready_and_fallback_gone, 50, "GPU replicas Ready on new spot nodes and the CPU fallback back at 0")

        status: ScalingStatus = await loop.query(ReactiveScaling.status)
        up_decision = next(d for d in status.decisions if d.desired > d.current)
        assert up_decision.applied and up_decision.desired == want and "queue" in up_decision.reason  # in one decision
        assert any(d.unschedulable > 0 for d in status.decisions)  # the loop saw its replicas wait for capacity
        assert any(d.fallback_replicas == 2 and "Unschedulable" in d.fallback_reason for d in status.decisions)
        pool_status: NodePoolStatus = await pool.query(NodePoolScaling.status)
        grows = [r for r in pool_status.records if r.reason.startswith("grow")]
        assert grows and all(r.pending_gpus % 4 == 0 and "new node(s) needed" in r.reason for r in grows)
        grown = len(spot_nodes()) - start
        assert 1 <= grown <= want and max(r.desired for r in pool_status.records) == start + grown  # never over-asked
        assert {capacity_of(core, p.spec.node_name) for p in pods(core, namespace, "digest")} == {"spot"}

        # the loop's metrics, read from the worker's endpoint after the real scale-up
        got = samples(metrics_port)
        dep = {("kube_namespace", namespace), ("deployment", "digest")}
        up = frozenset(dep | {("direction", "up"), ("reason", "queue_depth")})
        assert ours(got, SCALING_DECISIONS.name, "digest")[up] >= 1
        on_spot = frozenset(dep | {("pool", "batch"), ("capacity_type", "spot")})
        assert ours(got, REPLICAS_DESIRED.name, "digest")[on_spot] == want
        assert ours(got, REPLICAS_READY.name, "digest")[on_spot] == want
        batch = frozenset(dep | {("pool", "batch")})
        assert ours(got, SCALE_UP_ATTEMPTS.name, "digest")[batch] == ours(got, SCALE_UP_SUCCESSES.name, "digest")[batch] == 1
        # the cold start: decision -> all replicas Ready on new spot nodes (node boot, image, weights)
        assert ours(got, COLD_START_SECONDS.name + "_count", "digest")[batch] == 1
        cold_start = ours(got, COLD_START_SECONDS.name + "_sum", "digest")[batch]
        assert 0 < cold_start <= (status.decisions[-1].at - up_decision.at).total_seconds() + 1

        # leave the cluster as found: the loop goes, and the pool drains its idle nodes back to its minimum
        await loop.terminate()
        set_demand(0)
        apps.delete_namespaced_deployment(gpu_dep, namespace)
        await wait_for(lambda: len(spot_nodes()) == start, 30, "the spot pool back at its minimum")
        await pool.terminate()
    apps.delete_namespaced_deployment(cpu_dep, namespace)
