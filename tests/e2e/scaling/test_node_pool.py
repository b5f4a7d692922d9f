"""End to end against the sandbox: pending GPU pods grow the node pool (an ASG in moto), idle nodes go.

The NodePoolScaling loop runs its production activities, built here with clients pointed at the
sandbox: Kubernetes API emulator for nodes and pods, moto's Auto Scaling for the group; the sandbox's cloud turns new instances into nodes after a
boot delay and deletes the nodes of terminated instances.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client, config
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from infra.sandbox.worker_identity import enable_serving_namespace
from tests.e2e.scaling.test_scaling_layers import node_pool_activities
from tests.sandbox_fixtures import wait_for
from workflows.core.naming import (
    GPU_RESOURCE,
    LABEL_APP,
    LABEL_MODEL,
    LABEL_VERSION,
    NODE_CAPACITY_TYPE,
    NODE_POOL,
    node_pool_workflow_id,
)
from workflows.scaling.contract import PoolRef
from workflows.scaling.node_pools import NodePoolInput, NodePoolScaling, NodePoolStatus
from workflows.scaling.placement import PoolSizing

NAMESPACE = "e2e-nodepool"
POOL = "gpu-spot"


async def test_pending_pods_grow_the_pool_and_idle_nodes_are_removed(sandbox):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)

    def pool_nodes() -> list[str]:
        return [n.metadata.name for n in core.list_node(label_selector=f"{NODE_POOL}={POOL}").items]

    start_nodes = len(pool_nodes())
    labels = {LABEL_APP: "batch", LABEL_VERSION: "1.0.0", LABEL_MODEL: "llama-3-70b"}
    enable_serving_namespace(core.api_client, NAMESPACE)
    apps.create_namespaced_deployment(NAMESPACE, {
        "metadata": {"name": "batch-v1-0-0", "labels": labels},
        "spec": {
            "replicas": start_nodes + 1,  # one whole-node replica more than the pool holds
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "nodeSelector": {NODE_CAPACITY_TYPE: "spot"},
                "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6.3", "resources": {"limits": {GPU_RESOURCE: "4"}}}],
            }},
        },
    })
    temporal = await Client.connect(sandbox.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    queue = f"nodepool-e2e-{uuid.uuid4().hex[:6]}"
    sizing = PoolSizing(min_nodes=start_nodes, max_nodes=start_nodes + 3, warm_standby=0, gpus_per_node=4, pending_grace_seconds=1)
    pools = node_pool_activities(sandbox)
    activities = [pools.observe_node_pool, pools.set_pool_capacity, pools.remove_pool_node]
    worker = Worker(temporal, task_queue=queue, workflows=[NodePoolScaling], activities=activities, activity_executor=ThreadPoolExecutor(4))
    async with worker:
        handle = await temporal.start_workflow(
            NodePoolScaling.run,
            NodePoolInput(pool=PoolRef(pool=POOL, capacity_type="spot"), sizing=sizing, interval_seconds=1),
            id=node_pool_workflow_id(POOL),
            task_queue=queue,
        )
        await wait_for(
            lambda: (apps.read_namespaced_deployment("batch-v1-0-0", NAMESPACE).status.ready_replicas or 0) == start_nodes + 1,
            40, "every replica Ready on a new node",
        )
        assert len(pool_nodes()) == start_nodes + 1
        status: NodePoolStatus = await handle.query(NodePoolScaling.status)
        grows = [r for r in status.records if r.reason.startswith("grow")]
        assert grows and grows[0].pending_gpus == 4 and grows[0].desired == start_nodes + 1
        assert max(r.desired for r in status.records) == start_nodes + 1  # never asked twice while booting

        apps.delete_namespaced_deployment("batch-v1-0-0", NAMESPACE)
        await wait_for(lambda: len(pool_nodes()) == start_nodes, 40, "the idle node to be removed")
        status = await handle.query(NodePoolScaling.status)
        drained = [r for r in status.records if r.drain]
        assert len(drained) == 1 and "terminated" in drained[0].reason
        await handle.terminate()
    core.delete_namespace(NAMESPACE)
