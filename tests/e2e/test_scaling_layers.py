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

from activities import cloud, kube, scaling
from infra.sandbox.config import DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, NodePool
from infra.sandbox.nodes import Instance, node_manifest
from workers import telemetry
from workers.config import settings
from workflows import naming
from workflows.scaling.cpu_fallback import CpuFallback
from workflows.naming import LABEL_APP, NODE_CAPACITY_TYPE, NODE_POOL
from workflows.scaling.node_pools import NodePoolInput, NodePoolScaling, NodePoolStatus, node_pool_workflow_id
from workflows.scaling.placement import PoolSizing
from workflows.rollout.activities import DeploymentRef, EnsureVersionInput
from workflows.scaling.decide import ScalingPolicy
from workflows.scaling.activities import PoolRef
from workflows.scaling.loop import ReactiveScaling, ScalingInput, ScalingStatus
from tests.sandbox_fixtures import wait_for

SPOT_POOL = "gpu-spot"


def ensure(namespace: str, name: str, priority_class: str, replicas: int, gpus: int, model: str = "llama-3-8b") -> None:
    req = EnsureVersionInput(
        deployment=DeploymentRef(namespace=namespace, name=name),
        model=model,
        version="1.0.0",
        image="vllm/vllm-openai:v0.8.5",
        gpus_per_replica=gpus,
        replicas=replicas,
        weights_path=f"{settings().model_cache_dir}/{model}/1.0.0",
        priority_class=priority_class,
    )
    ActivityEnvironment().run(kube.ensure_version, req)


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


async def test_batch_pods_land_on_spot_and_realtime_pods_on_on_demand(sandbox_env):
    api = config.new_client_from_config(config_file=str(sandbox_env.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    namespace = "e2e-priority"
    extra = {"e2e-priority-spot": "spot", "e2e-priority-od": "on-demand"}
    for name, capacity_type in extra.items():
        register_node(core, name, capacity_type)
    core.create_namespace({"metadata": {"name": namespace}})
    ensure(namespace, "nightly", "batch", replicas=2, gpus=1)
    ensure(namespace, "chat", "realtime", replicas=2, gpus=1)

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


async def test_loop_scale_up_grows_the_spot_pool_and_the_cpu_fallback_covers_the_gap(sandbox_env):
    api = config.new_client_from_config(config_file=str(sandbox_env.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    namespace = "e2e-layers"

    def spot_nodes() -> list[str]:
        return [n.metadata.name for n in core.list_node(label_selector=f"{NODE_POOL}={SPOT_POOL}").items]

    def set_demand(rps: float) -> None:
        core.patch_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, {"data": {f"{namespace}/digest": json.dumps({"rps": rps})}})

    # Whatever earlier tests left on the spot nodes, three whole-node replicas need new spot nodes.
    start = len(spot_nodes())
    core.create_namespace({"metadata": {"name": namespace}})
    ensure(namespace, "digest", "batch", replicas=1, gpus=4, model="llama-3-70b")
    ensure(namespace, "digest-cpu", "realtime", replicas=0, gpus=0, model="llama-3-70b-cpu")
    gpu_dep, cpu_dep = naming.versioned_name("digest", "1.0.0"), naming.versioned_name("digest-cpu", "1.0.0")
    want = 3

    policy = ScalingPolicy(
        priority_class="batch", min_replicas=0, max_replicas=want, gpus_per_replica=4,
        queue_per_replica=2, queue_capacity_per_replica=4, ttft_p99_slo_seconds=30, gpu_util_sustain_seconds=0,
        stabilisation_seconds=600, cooldown_seconds=600,
        cpu_fallback=CpuFallback(deployment=f"{namespace}/digest-cpu", version="1.0.0", replicas=2, after_seconds=1, stabilisation_seconds=2),
    )
    sizing = PoolSizing(min_nodes=start, max_nodes=start + want, warm_standby=0, gpus_per_node=4, pending_grace_seconds=1)
    temporal = await Client.connect(sandbox_env.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    queue = f"layers-e2e-{uuid.uuid4().hex[:6]}"
    worker = Worker(
        temporal,
        task_queue=queue,
        workflows=[ReactiveScaling, NodePoolScaling],
        activities=[scaling.read_scaling_signals, scaling.get_scale, kube.scale_version, telemetry.record_scaling_decision, *cloud.ACTIVITIES],
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
        up = next(d for d in status.decisions if d.desired > d.current)
        assert up.applied and up.desired == want and "queue" in up.reason  # in one decision
        assert any(d.unschedulable > 0 for d in status.decisions)  # the loop saw its replicas wait for capacity
        assert any(d.fallback_replicas == 2 and "Unschedulable" in d.fallback_reason for d in status.decisions)
        pool_status: NodePoolStatus = await pool.query(NodePoolScaling.status)
        grows = [r for r in pool_status.records if r.reason.startswith("grow")]
        assert grows and all(r.pending_gpus % 4 == 0 and "new node(s) needed" in r.reason for r in grows)
        grown = len(spot_nodes()) - start
        assert 1 <= grown <= want and max(r.desired for r in pool_status.records) == start + grown  # never over-asked
        assert {capacity_of(core, p.spec.node_name) for p in pods(core, namespace, "digest")} == {"spot"}

        dep_labels = (namespace, "digest")
        assert telemetry.SCALING_DECISIONS.labels(*dep_labels, "up", "queue_depth")._value.get() >= 1
        assert telemetry.REPLICAS_DESIRED.labels(*dep_labels, "batch", "spot")._value.get() == want
        assert telemetry.REPLICAS_READY.labels(*dep_labels, "batch", "spot")._value.get() == want

        # leave the cluster as found: the loop goes, and the pool drains its idle nodes back to its minimum
        await loop.terminate()
        set_demand(0)
        apps.delete_namespaced_deployment(gpu_dep, namespace)
        await wait_for(lambda: len(spot_nodes()) == start, 30, "the spot pool back at its minimum")
        await pool.terminate()
    apps.delete_namespaced_deployment(cpu_dep, namespace)
