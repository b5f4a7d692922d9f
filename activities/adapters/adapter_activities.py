"""LoRA adapters on running vLLM replicas: the registry entry, vLLM's dynamic LoRA API per pod, the route rule.

vLLM loads an adapter into one process: ``POST /v1/load_lora_adapter`` ``{"lora_name",
"lora_path"}`` and ``POST /v1/unload_lora_adapter`` ``{"lora_name"}`` go to every Ready pod of the
base version, each at ``pod_url_template`` (``http://{pod_ip}:8000`` in a cluster). The server
needs ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (the rollout's ``args`` and
``env``); without them it refuses, and the error says which is missing. vLLM answers "has already
been loaded" (400) and "cannot be found" (404) for a repeated call: both are success here, so a
retried activity converges.
"""

from __future__ import annotations

import httpx
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import (
    API_TIMEOUT,
    KubeClient,
    edit_container_args,
    fail,
    is_ready,
    label_selector,
    selector,
)
from activities.core.deployments import CONTAINER, edit_route_rules
from activities.registry.store import Registry, RegistryError
from workflows.adapters import contract
from workflows.adapters.contract import (
    AdapterOnReplicasInput,
    AdapterReplicas,
    AdapterRouteInput,
    LoraModuleInput,
    ResolveAdapterInput,
    ResolvedAdapter,
)
from workflows.adapters.routing import adapter_rule, matches_adapter, with_adapter_module, with_adapter_rule
from workflows.core.lora import lora_modules, with_lora_modules
from workflows.core.versions import WeightFile

HTTP_TIMEOUT = httpx.Timeout(60.0, connect=5.0)  # loading reads the adapter's files on the pod
ALREADY_LOADED = "has already been loaded"
NOT_LOADED = "cannot be found"
NOT_ENABLED = "LoRA is not enabled"


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body  # vLLM's new and old ErrorResponse
        return str(inner.get("message") or inner.get("detail") or body)  # FastAPI's 404: {"detail": "Not Found"}
    return str(body)


def lora_call_outcome(action: str, status: int, message: str, pod: str) -> None:
    """Raise for an answer that is neither success nor the idempotent repeat of ``action``."""
    if status == 200:
        return
    if action == "load" and status == 400 and ALREADY_LOADED in message:
        return
    if action == "unload" and status == 404 and NOT_LOADED in message:
        return
    if status == 404 and (message == "Not Found" or message.startswith("no route")):
        raise ApplicationError(
            f"pod {pod} has no /v1/{action}_lora_adapter: run the base with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (env)",
            type="RuntimeLoraUpdatingOff", non_retryable=True,
        )
    if NOT_ENABLED in message:
        raise ApplicationError(
            f"pod {pod} refused the adapter: {message} (add --enable-lora to the base rollout's args)",
            type="LoraNotEnabled", non_retryable=True,
        )
    if 400 <= status < 500:
        raise ApplicationError(f"pod {pod}: {action} refused ({status}): {message}", type="LoraRefused", non_retryable=True)
    raise ApplicationError(f"pod {pod}: {action} failed ({status}): {message}")  # retried


class AdapterActivities(contract.AdapterActivities):
    def __init__(self, kube: KubeClient, registry: Registry, pod_url_template: str, port: int = 8000, api_key: str | None = None) -> None:
        """``pod_url_template``: one pod's server, from ``{pod_ip}``, ``{namespace}``, ``{pod}`` and ``{port}``;
        ``api_key``: the engines' key (VLLM_API_KEY), sent as a bearer token."""
        self.kube = kube
        self.registry = registry
        self.pod_url_template = pod_url_template
        self.port = port
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @activity.defn(name="resolve_adapter")
    def resolve_adapter(self, req: ResolveAdapterInput) -> ResolvedAdapter:
        try:
            manifest = self.registry.resolve(req.adapter, req.version)
        except RegistryError as exc:
            raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from None
        if manifest.adapter is None:
            raise ApplicationError(
                f"adapter: {manifest.ref} is a model, not a LoRA adapter (register it with --base MODEL@VERSION)",
                type="NotAnAdapter", non_retryable=True,
            )
        return ResolvedAdapter(
            files=[WeightFile(uri=manifest.weights.uri(f.path), sha256=f.sha256) for f in manifest.weights.files],
            base_model=manifest.adapter.base_model,
            base_version=manifest.adapter.base_version,
        )

    @activity.defn(name="load_lora_adapter")
    def load_lora_adapter(self, req: AdapterOnReplicasInput) -> AdapterReplicas:
        if not req.lora_path:
            raise ApplicationError("lora_path: required to load an adapter", non_retryable=True)
        return self._on_replicas(req, "load", {"lora_name": req.lora_name, "lora_path": req.lora_path})

    @activity.defn(name="unload_lora_adapter")
    def unload_lora_adapter(self, req: AdapterOnReplicasInput) -> AdapterReplicas:
        return self._on_replicas(req, "unload", {"lora_name": req.lora_name})

    def _on_replicas(self, req: AdapterOnReplicasInput, action: str, body: dict) -> AdapterReplicas:
        ref = req.deployment
        try:
            pods = self.kube.core.list_namespaced_pod(
                ref.namespace, label_selector=label_selector(selector(ref.name, req.base_version)), _request_timeout=API_TIMEOUT
            ).items
        except ApiException as exc:
            fail(exc, f"list the pods of {ref} {req.base_version}")
        ready = sorted((p for p in pods if is_ready(p)), key=lambda p: p.metadata.name)
        if action == "load" and not ready:
            raise ApplicationError(f"no Ready pod of {ref} {req.base_version} to load {req.lora_name} on")  # retried
        done = []
        with httpx.Client(timeout=HTTP_TIMEOUT, headers=self.headers) as http:
            for pod in ready:
                name = f"{pod.metadata.namespace}/{pod.metadata.name}"
                base = self.pod_url_template.format(
                    pod_ip=pod.status.pod_ip, namespace=pod.metadata.namespace, pod=pod.metadata.name, port=self.port
                ).rstrip("/")
                try:
                    resp = http.post(f"{base}/v1/{action}_lora_adapter", json=body)
                except httpx.HTTPError as exc:
                    raise ApplicationError(f"pod {name}: {action} {req.lora_name}: {exc}") from None  # retried
                lora_call_outcome(action, resp.status_code, _message(resp), name)
                done.append(name)
                activity.heartbeat(name)
        return AdapterReplicas(pods=done)

    @activity.defn(name="set_adapter_route")
    def set_adapter_route(self, req: AdapterRouteInput) -> None:
        if req.weights and (any(not 0 <= w <= 100 for w in req.weights.values()) or sum(req.weights.values()) != 100):
            raise ApplicationError(f"weights: must be 0..100 and sum to 100, got {req.weights}", non_retryable=True)
        ref = req.deployment
        if not req.weights:
            edit_route_rules(self.kube, ref, lambda rules: [r for r in rules if not matches_adapter(r, req.adapter)], must_exist=False)
            return
        rule = adapter_rule(req.adapter, ref.versioned(req.base_version), req.port, req.weights)
        edit_route_rules(self.kube, ref, lambda rules: with_adapter_rule(rules, req.adapter, rule))

    @activity.defn(name="set_lora_module")
    def set_lora_module(self, req: LoraModuleInput) -> None:
        edit_container_args(
            self.kube, req.deployment.namespace, req.deployment.versioned(req.base_version), CONTAINER,
            lambda args: with_lora_modules(args, with_adapter_module(lora_modules(args), req.adapter, req.version, req.lora_path)),
        )
