"""End to end against the sandbox: request classes through the gateway, and the monthly GPU budget.

The production activities run in a worker here, with the worker's own kubeconfig (its ServiceAccount
and the serving namespace's Role), against the emulated cluster that serves the Gateway API
Inference Extension's CRDs; requests go through the fleet's gateway, which honours the HTTPRoute's
class matches and routes inside an InferencePool by least queue.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
from kubernetes import client, config
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.classes.request_class_activities import RequestClassActivities
from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.cost.cost_activities import CostActivities
from infra.sandbox.config import DEMAND_CONFIGMAP, SANDBOX_NAMESPACE
from tests.e2e.scaling.test_scaling import rollout_activities, scaling_activities
from tests.sandbox_fixtures import TEST_TIME_SCALE, create_logical_deployment, wait_for
from workflows.core import naming
from workflows.classes.manifests import RequestClassesInput
from workflows.classes.workflow import ApplyRequestClasses
from workflows.cost.budget import MonthlyBudget
from workflows.scaling.decide import ScalingPolicy
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput

NAMESPACE = "e2e-classes"


def ready_pods(api: client.ApiClient, namespace: str, prefix: str) -> int:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace).items
    return sum(p.metadata.name.startswith(prefix) and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
               for p in pods)


def ask(fleet: str, route: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{fleet}/gateway/{NAMESPACE}/{route}/v1/completions", headers=headers,
                      json={"prompt": "hello", "max_tokens": 4}, timeout=30)


async def test_realtime_and_batch_requests_land_in_their_pools(sandbox):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    realtime_pods = create_logical_deployment(api, NAMESPACE, "chat", "1.0.0", "llama-3-8b", replicas=1)
    batch_pods = create_logical_deployment(api, NAMESPACE, "chat-batch", "1.0.0", "llama-3-8b", replicas=1)
    temporal = await Client.connect(sandbox.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    queue = f"classes-e2e-{uuid.uuid4().hex[:6]}"
    classes = RequestClassesInput(namespace=NAMESPACE, route="chat-classes", classes=[
        {"name": "realtime", "deployment": "chat", "priority": 10}, {"name": "batch", "deployment": "chat-batch", "priority": 0}])
    activities = RequestClassActivities(KubeClient.connect(sandbox.sandbox.worker_kubeconfig), "inference-gateway")
    async with Worker(temporal, task_queue=queue, workflows=[ApplyRequestClasses],
                      activities=[activities.apply_request_classes], activity_executor=ThreadPoolExecutor(2)):
        first = await temporal.execute_workflow(ApplyRequestClasses.run, classes, id=f"request-classes/{uuid.uuid4().hex[:6]}",
                                                task_queue=queue)
        again = await temporal.execute_workflow(ApplyRequestClasses.run, classes, id=f"request-classes/{uuid.uuid4().hex[:6]}",
                                                task_queue=queue)
    assert first.mode == "inference-extension"
    assert set(first.changed) == {"InferencePool/chat-pool", "InferenceObjective/chat-classes-realtime",
                                  "InferencePool/chat-batch-pool", "InferenceObjective/chat-classes-batch", "HTTPRoute/chat-classes"}
    assert again.changed == [], "applying the same classes again changes nothing"
    pool = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "inference.networking.k8s.io", "v1", NAMESPACE, "inferencepools", "chat-batch-pool")
    assert pool["spec"]["selector"]["matchLabels"] == {naming.LABEL_APP: "chat-batch"}

    await wait_for(lambda: ready_pods(api, NAMESPACE, realtime_pods) and ready_pods(api, NAMESPACE, batch_pods),
                   30, "a Ready replica in each pool")
    fleet = sandbox.urls["fleet"]

    def answered(headers: dict[str, str]) -> str | None:
        response = ask(fleet, "chat-classes", headers)
        return response.headers.get("x-tideplane-pod") if response.status_code == 200 else None

    batch = await wait_for(lambda: answered({"x-request-class": "batch"}), 15, "a batch request answered")
    realtime = await wait_for(lambda: answered({"x-request-class": "realtime"}), 15, "a realtime request answered")
    unclassed = await wait_for(lambda: answered({}), 15, "a request without a class answered")
    assert batch.startswith(f"{NAMESPACE}/{batch_pods}-")
    assert realtime.startswith(f"{NAMESPACE}/{realtime_pods}-") and unclassed.startswith(f"{NAMESPACE}/{realtime_pods}-")


async def test_a_scale_up_over_the_monthly_budget_is_refused(sandbox):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    namespace = "e2e-budget"
    versioned = create_logical_deployment(api, namespace, "chat", "1.0.0", "llama-3-8b", replicas=1)
    core = client.CoreV1Api(api)
    demand = core.read_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE)
    demand.data = {**(demand.data or {}), f"{namespace}/chat": json.dumps({"rps": 15})}  # 4x what one replica serves
    core.replace_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, demand)
    temporal = await Client.connect(sandbox.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    queue = f"budget-e2e-{uuid.uuid4().hex[:6]}"
    policy = ScalingPolicy(max_replicas=4, queue_per_replica=2, queue_capacity_per_replica=4,
                           replica_capacity_rps=4 * TEST_TIME_SCALE, monthly_budget=MonthlyBudget(monthly_usd=1))
    scaling, cost = scaling_activities(sandbox), CostActivities(PrometheusClient(sandbox.urls["prometheus"]))
    async with Worker(temporal, task_queue=queue, workflows=[ReactiveScaling],
                      activities=[scaling.read_scaling_signals, scaling.get_scale, rollout_activities(sandbox).scale_version,
                                  cost.read_month_spend], activity_executor=ThreadPoolExecutor(4)):
        handle = await temporal.start_workflow(
            ReactiveScaling.run, ScalingInput(deployment=f"{namespace}/chat", policy=policy, interval_seconds=1, window="5s"),
            id=naming.scaling_workflow_id(f"{namespace}/chat"), task_queue=queue, execution_timeout=timedelta(minutes=2))

        decision = None
        for _ in range(100):  # up to 30 s: the replica's load, the queue, then a decision
            status = await handle.query(ReactiveScaling.status)
            decision = next((d for d in status.decisions if d.capped_by == "monthly_budget"), None)
            if decision:
                break
            await asyncio.sleep(0.3)
        await handle.terminate()
    assert decision is not None, f"no scale-up refused by the budget; decisions: {[d.reason for d in status.decisions]}"
    assert (decision.current, decision.desired, decision.applied) == (1, 1, False)
    assert re.search(r"monthly budget refuses (\d+) of \1 more replica\(s\) \(1 -> 1\): forecast \$", decision.reason)
    assert client.AppsV1Api(api).read_namespaced_deployment(versioned, namespace).spec.replicas == 1
