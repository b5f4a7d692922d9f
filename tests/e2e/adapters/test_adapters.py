"""End to end against the sandbox: a LoRA adapter version canaried by model name, rolled back by its gate.

The base model runs with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; the
production activities register nothing by hand in the cluster: they load the adapter versions into
every replica through the fleet's per-pod vLLM LoRA API, write the HTTPRoute rule that matches the
adapter's model name, read the gates from Prometheus (the fleet's per-model counts) and unload the
rolled-back version. Requests go through the fleet's gateway with the adapter's name in ``model``;
the bad version fails half of its requests (its ``fleet-profiles`` entry).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
from kubernetes import client, config
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.adapters.adapter_activities import AdapterActivities
from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.clients.s3 import S3Client
from activities.clients.vllm import VllmClient
from activities.registry.store import Registry
from activities.registry.registry_activities import RegistryActivities
from activities.rollout.rollout_activities import RolloutActivities
from activities.rollout.serving_pods import ServingPods
from infra.sandbox.config import Profile
from infra.sandbox.knobs import set_profile
from infra.sandbox.launcher import AWS_ENV, WEIGHTS_BUCKET
from tests.sandbox_fixtures import create_logical_deployment, wait_for
from workflows.adapters.types import AdapterRolloutInput
from workflows.adapters.workflow import AdapterRollout
from workflows.registry.schema import AdapterOf
from workflows.rollout.gates import ERROR_RATE
from workflows.rollout.types import Outcome

NAMESPACE = "e2e-adapters"
LORA = {"args": ["--enable-lora"], "env": [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}]}


def files(root, text: str):
    root.mkdir()
    (root / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}')
    (root / "adapter_model.safetensors").write_bytes(text.encode() * 64)
    return str(root)


def served_models(fleet: str, pods: list[str]) -> list[set[str]]:
    """What each pod's ``/v1/models`` lists (empty while the fleet does not simulate it yet)."""
    return [set() if (r := httpx.get(f"{fleet}/pods/{pod}/v1/models", timeout=10)).status_code != 200
            else {m["id"] for m in r.json()["data"]} for pod in pods]


def answered_by(fleet: str, requests: int) -> list[str]:
    """The ``model`` each gateway request for the adapter was answered with (the base's simulated
    0.1 % of 500s left out)."""
    def one(_: int) -> httpx.Response:
        return httpx.post(f"{fleet}/gateway/{NAMESPACE}/chat/v1/completions",
                          json={"model": "sql-lora", "prompt": "select", "max_tokens": 2}, timeout=30)

    with ThreadPoolExecutor(requests) as pool:  # at once: each waits for the simulator's next tick
        answers = list(pool.map(one, range(requests)))
    assert all(r.status_code in (200, 500) for r in answers), [r.text for r in answers]
    return [r.json()["model"] for r in answers if r.status_code == 200]


def gateway_models(fleet: str) -> set[str] | None:
    """The models 4 requests for the adapter were answered with; None while the gateway refuses them."""
    try:
        return set(answered_by(fleet, 4))
    except AssertionError:
        return None


async def test_an_adapter_version_is_canaried_by_model_name_and_rolled_back(sandbox, sandbox_env, tmp_path):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    versioned = create_logical_deployment(api, NAMESPACE, "chat", "1.0.0", "llama-3-8b", replicas=2, container=LORA)
    s3 = S3Client(sandbox.urls["moto"], AWS_ENV["AWS_DEFAULT_REGION"])
    registry = Registry(s3, WEIGHTS_BUCKET)
    registry.register("llama-3-8b", "1.0.0", files(tmp_path / "base", "base"))
    for version in ("1.0.0", "1.1.0"):
        registry.register("sql-lora", version, files(tmp_path / version, version),
                          adapter=AdapterOf(base_model="llama-3-8b", base_version="1.0.0"))

    kube = KubeClient.connect(sandbox.sandbox.worker_kubeconfig)
    rollout = RolloutActivities(kube, s3, PrometheusClient(sandbox.urls["prometheus"]), VllmClient(),
                                ServingPods(model_cache_dir=tmp_path / "cache"), "inference-gateway", sandbox.env["TIDEPLANE_SERVICE_URL_TEMPLATE"])
    adapters = AdapterActivities(kube, registry, sandbox.env["TIDEPLANE_POD_URL_TEMPLATE"])
    registry_activities = RegistryActivities(s3, kube, WEIGHTS_BUCKET)
    temporal = await Client.connect(sandbox.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    queue = f"adapters-e2e-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api)

    def ready_pods() -> list[str]:
        pods = core.list_namespaced_pod(NAMESPACE).items
        return sorted(f"{NAMESPACE}/{p.metadata.name}" for p in pods if p.metadata.name.startswith(versioned)
                      and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))

    pods = await wait_for(lambda: (found := ready_pods()) and len(found) == 2 and found, 30, "2 Ready base replicas")
    await wait_for(lambda: all(httpx.get(f"{sandbox.urls['fleet']}/pods/{p}/v1/models").status_code == 200 for p in pods),
                   10, "the fleet to simulate both replicas")
    fleet = sandbox.urls["fleet"]
    async with Worker(
        temporal, task_queue=queue, workflows=[AdapterRollout], activity_executor=ThreadPoolExecutor(4),
        activities=[adapters.resolve_adapter, adapters.load_lora_adapter, adapters.unload_lora_adapter, adapters.set_adapter_route,
                    adapters.set_lora_module,
                    rollout.describe_deployment, rollout.stage_weights, rollout.query_gates,
                    registry_activities.list_registry_versions, registry_activities.set_registry_status],
    ):
        first = await temporal.execute_workflow(
            AdapterRollout.run, AdapterRolloutInput(deployment=f"{NAMESPACE}/chat", adapter="sql-lora", version="1.0.0"),
            id=f"adapter-rollout/{uuid.uuid4().hex[:6]}", task_queue=queue)
        assert first.outcome is Outcome.PROMOTED and first.previous_version is None
        # promoted into the base's --lora-modules: the base rolls, its new pods start with the adapter
        loaded_by_api = pods
        pods = await wait_for(lambda: (found := ready_pods()) and len(found) == 2 and not set(found) & set(loaded_by_api) and found,
                              30, "the base's pods replaced by ones started with --lora-modules")
        await wait_for(lambda: served_models(fleet, pods) == [{"llama-3-8b", "sql-lora-1.0.0"}] * 2, 10,
                       "the new pods to serve the adapter from their start")
        await wait_for(lambda: gateway_models(fleet) == {"sql-lora-1.0.0"}, 5, "the gateway to apply the adapter's rule")

        set_profile(api, "sql-lora", "1.1.0", Profile(error_rate=0.5))  # the bad version, on a healthy base
        canary = AdapterRolloutInput(deployment=f"{NAMESPACE}/chat", adapter="sql-lora", version="1.1.0",
                                     steps=[{"weight": 50, "window_seconds": 60}, {"weight": 100, "window_seconds": 60}],
                                     gate_interval_seconds=2, query_window_seconds=10, gates={"min_requests": 5},
                                     drain_seconds=1)
        seen: list[str] = []
        done = threading.Event()

        problems: list[str] = []

        def traffic() -> None:
            while not done.is_set():
                try:
                    seen.extend(answered_by(fleet, 8))
                except AssertionError as exc:  # e.g. a 404: a version unloaded while the gateway still sent to it
                    problems.append(str(exc))

        sender = threading.Thread(target=traffic, daemon=True)
        sender.start()
        try:
            result = await temporal.execute_workflow(AdapterRollout.run, canary, id=f"adapter-rollout/{uuid.uuid4().hex[:6]}",
                                                     task_queue=queue)
        finally:
            done.set()
            sender.join(30)
    assert result.outcome is Outcome.ROLLED_BACK and result.previous_version == "1.0.0" and result.weight_reached == 50, result.reason
    assert ERROR_RATE in [c.gate for c in result.failing_verdict.evaluation.failed], result.reason
    assert {"sql-lora-1.0.0", "sql-lora-1.1.0"} <= set(seen), "the canary answered its share by model name"
    assert problems == [], "every request answered (or failed by the bad version), none refused"
    assert sorted(result.unloaded_from) == pods
    assert served_models(fleet, pods) == [{"llama-3-8b", "sql-lora-1.0.0"}] * 2, "1.1.0 unloaded from every replica"
    assert gateway_models(fleet) == {"sql-lora-1.0.0"}
    assert registry.show("sql-lora", "1.1.0").status.state == "deprecated", "a gate failure: never again"
    assert registry.show("sql-lora", "1.0.0").deployments[f"{NAMESPACE}/chat"].state == "stable"
