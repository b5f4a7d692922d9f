"""End to end against the sandbox: a replica on a warm-pool node with its engine cache is Ready
sooner than one on a freshly launched node, and its cold start is read part by part from events.

The node layer's and the rollout's production activities, pointed at the sandbox, lay the
Deployment out (ensure_version: VLLM_CACHE_ROOT on the node), size the on-demand pool's Auto
Scaling group (moto) and its warm pool, and remove the node. The sandbox's cloud plays the warm
pool; the emulator's kubelet pulls images, compiles unless the node holds the version's engine
cache, and reports each part of the start as a ColdStart event, which the scaling loop's get_scale
reads back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kubernetes import client, config
from temporalio.testing import ActivityEnvironment

from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.clients.s3 import S3Client
from activities.clients.vllm import VllmClient
from activities.rollout.rollout_activities import RolloutActivities
from activities.rollout.serving_pods import ServingPods
from infra.sandbox.config import PROFILES_CONFIGMAP, SANDBOX_NAMESPACE
from infra.sandbox.launcher import AWS_ENV
from infra.sandbox.nodes import RETURNED_TAG, aws_clients
from infra.sandbox.worker_identity import enable_serving_namespace
from tests.e2e.scaling.test_scaling import MODEL_CACHE, scaling_activities
from tests.e2e.scaling.test_scaling_layers import node_pool_activities
from tests.sandbox_fixtures import wait_until
from workflows.core.naming import LABEL_APP, NODE_POOL, DeploymentRef
from workflows.rollout.contract import EnsureVersionInput, ScaleVersionInput
from workflows.scaling.contract import RemoveNodeInput, ScaleTarget, SetCapacityInput, SetWarmPoolInput

NAMESPACE = "e2e-cold-start"
POOL = "gpu-on-demand"
MODEL = "cold-start-model"
ENGINE_CACHE = Path("/var/cache/tideplane/engine")
# Sandbox seconds; a fresh node also takes the cloud's 90 s boot, a warm-pool one 60 s.
PROFILE = {"image_pull_seconds": 40, "load_seconds": 20, "compile_seconds": 40, "warmup_seconds": 10}


def returned_to_warm_pool(sandbox, instance_id: str) -> bool:
    """Whether the sandbox's cloud stopped ``instance_id`` back into a warm pool (moto lists no warm
    instances in DescribeWarmPool: the cloud plays them as stopped instances, tagged)."""
    ec2 = aws_clients(sandbox.urls["moto"])[0]
    return bool(ec2.describe_instances(Filters=[{"Name": f"tag:{RETURNED_TAG}", "Values": [instance_id]},
                                                {"Name": "instance-state-name", "Values": ["stopping", "stopped"]}])["Reservations"])


def cold_start(core: client.CoreV1Api, pod: str) -> dict[str, float]:
    """The pod's ColdStart events: part -> sandbox seconds."""
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={pod}").items
    return {e.message.split(" ")[0]: float(e.message.split(" ")[1].rstrip("s:")) for e in events if e.reason == "ColdStart"}


def test_a_warm_pool_node_with_the_engine_cache_starts_a_replica_sooner_than_a_fresh_node(sandbox):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    core = client.CoreV1Api(api)
    profiles = core.read_namespaced_config_map(PROFILES_CONFIGMAP, SANDBOX_NAMESPACE)
    core.patch_namespaced_config_map(PROFILES_CONFIGMAP, SANDBOX_NAMESPACE, {"data": {**(profiles.data or {}), MODEL: json.dumps(PROFILE)}})
    enable_serving_namespace(api, NAMESPACE, enforce="privileged")  # the engine cache on the nodes' disks is a hostPath
    rollout = RolloutActivities(
        KubeClient.connect(sandbox.kubeconfig), S3Client(sandbox.urls["moto"], AWS_ENV["AWS_DEFAULT_REGION"]),
        PrometheusClient(sandbox.urls["prometheus"]), VllmClient(),
        ServingPods(model_cache_dir=MODEL_CACHE, engine_cache_dir=ENGINE_CACHE, engine_cache_pvc=None),  # on each node's disk
        gateway="inference-gateway", service_url_template="http://{service}.{namespace}.svc.cluster.local:8000",
    )
    pools, run = node_pool_activities(sandbox), ActivityEnvironment().run
    ref = DeploymentRef(namespace=NAMESPACE, name="chat")
    nodes = [n.metadata.name for n in core.list_node(label_selector=f"{NODE_POOL}={POOL}").items]

    def live_pods() -> list[client.V1Pod]:
        return [p for p in core.list_namespaced_pod(NAMESPACE, label_selector=f"{LABEL_APP}=chat").items if not p.metadata.deletion_timestamp]

    def scale_out(replicas: int) -> tuple[client.V1Pod, float]:
        """One whole-node replica more than the pool's nodes hold, and a node for it: (its pod, real seconds to Ready)."""
        begun = time.monotonic()
        run(rollout.scale_version, ScaleVersionInput(deployment=ref, version="1.0.0", replicas=replicas))
        run(pools.set_pool_capacity, SetCapacityInput(pool=POOL, desired=replicas))
        wait_until(lambda: sum(1 for p in live_pods() if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])) == replicas,
                   25, f"{replicas} replicas Ready")
        pod = next(p for p in live_pods() if p.spec.node_name not in nodes)
        return pod, time.monotonic() - begun

    # One replica per existing node, then a third on a freshly launched node: boot, pull, compile.
    run(rollout.ensure_version, EnsureVersionInput(
        deployment=ref, model=MODEL, version="1.0.0", image="vllm/vllm-openai:v0.8.5", gpus_per_replica=4,
        replicas=len(nodes), weights_path=f"{MODEL_CACHE}/{MODEL}/1.0.0"))
    fresh_pod, fresh_seconds = scale_out(len(nodes) + 1)
    fresh = cold_start(core, fresh_pod.metadata.name)
    assert fresh == {"node": 90, "image": 40, "weights": 20, "compile": 40, "warmup": 10}

    # Scale in with a warm pool that reuses: the replica goes, its node's instance is stopped into the pool.
    run(pools.set_warm_pool, SetWarmPoolInput(pool=POOL, size=1, reuse_on_scale_in=True))
    run(rollout.scale_version, ScaleVersionInput(deployment=ref, version="1.0.0", replicas=len(nodes)))
    wait_until(lambda: all(p.spec.node_name in nodes for p in live_pods()), 10, "the new node's replica gone")
    instance = core.read_node(fresh_pod.spec.node_name).spec.provider_id.rsplit("/", 1)[-1]
    assert run(pools.remove_pool_node, RemoveNodeInput(pool=POOL, node=fresh_pod.spec.node_name)).removed
    wait_until(lambda: returned_to_warm_pool(sandbox, instance), 10, f"{instance} stopped back into the warm pool")

    # Scale out again: the stopped instance starts with the image and the engine cache on its disk.
    warm_pod, warm_seconds = scale_out(len(nodes) + 1)
    warm = cold_start(core, warm_pod.metadata.name)
    assert warm == {"node": 60, "image": 0, "weights": 20, "compile": 0, "warmup": 10}
    scale = run(scaling_activities(sandbox).get_scale, ScaleTarget(namespace=NAMESPACE, deployment="chat", version="1.0.0"))
    assert scale.cold_start.pod == warm_pod.metadata.name and scale.cold_start.parts == warm, "what the scaling loop shows"
    print(f"fresh node: {fresh_seconds:.1f} s real ({sum(fresh.values()):g} sandbox s); "
          f"warm pool + engine cache: {warm_seconds:.1f} s real ({sum(warm.values()):g} sandbox s)")
    assert warm_seconds < fresh_seconds * 0.8  # 90 of 200 sandbox seconds; the cloud and kubelet passes add the same to both
