"""End to end against the sandbox: the HTTPRoute a rollout writes routes only the inference paths
(issue 33). The base runs with runtime LoRA updating on, as adapters need; through a route with no
``matches`` (every path, as routes were written before) any client reaches vLLM's
``/v1/load_lora_adapter``; once the production ``set_route_weights`` (every route change of a
rollout) has written the route, the sandbox gateway answers that path 404 and completions still go through."""

from __future__ import annotations

import httpx
from kubernetes import config
from temporalio.testing import ActivityEnvironment

from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.clients.s3 import S3Client
from activities.clients.vllm import VllmClient
from activities.rollout.rollout_activities import RolloutActivities
from activities.rollout.serving_pods import ServingPods
from infra.sandbox.launcher import AWS_ENV
from tests.sandbox_fixtures import create_logical_deployment, wait_for
from workflows.core.naming import DeploymentRef
from workflows.rollout.contract import RouteWeightsInput

NAMESPACE = "e2e-gateway-paths"
LORA = {"args": ["--enable-lora"], "env": [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}]}


def load_adapter(fleet: str) -> httpx.Response:
    return httpx.post(f"{fleet}/gateway/{NAMESPACE}/chat/v1/load_lora_adapter",
                      json={"lora_name": "evil", "lora_path": "/tmp/anything"}, timeout=30)


def complete(fleet: str) -> httpx.Response:
    return httpx.post(f"{fleet}/gateway/{NAMESPACE}/chat/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)


async def test_a_rollout_route_refuses_the_engine_admin_paths(sandbox, tmp_path):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    create_logical_deployment(api, NAMESPACE, "chat", "1.0.0", "llama-3-8b", replicas=1, container=LORA)
    fleet = sandbox.urls["fleet"]
    await wait_for(lambda: complete(fleet).status_code in (200, 500), 60, "the version answering through the gateway")
    before = load_adapter(fleet)
    assert before.status_code != 404 or "no HTTPRoute" not in before.text, "a route without matches lets every path through"

    kube = KubeClient.connect(sandbox.sandbox.worker_kubeconfig)
    s3 = S3Client(sandbox.urls["moto"], AWS_ENV["AWS_DEFAULT_REGION"])
    rollout = RolloutActivities(kube, s3, PrometheusClient(sandbox.urls["prometheus"]), VllmClient(),
                                ServingPods(model_cache_dir=tmp_path / "cache"), "inference-gateway", sandbox.env["TIDEPLANE_SERVICE_URL_TEMPLATE"])
    ActivityEnvironment().run(rollout.set_route_weights, RouteWeightsInput(deployment=DeploymentRef(namespace=NAMESPACE, name="chat"), weights={"1.0.0": 100}))

    await wait_for(lambda: load_adapter(fleet).status_code == 404, 30, "the gateway refusing /v1/load_lora_adapter")
    refused = load_adapter(fleet)
    assert "no HTTPRoute e2e-gateway-paths/chat rule takes this request" in refused.text
    assert complete(fleet).status_code in (200, 500)  # the inference path still goes through
