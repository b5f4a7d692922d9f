"""The Deployment and Service of one version: its pods' spec from the worker's settings
(``ServingPods``: the model cache, traces, the engine cache, the node cache), the image allow-list,
and which replicas a scale-down removes first (``mark_deletion_costs``).

Composes the node cache: a version pre-staged onto the nodes is read from each node's cache (an
init container stages what the node lacks) and prefers nodes that hold it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from kubernetes.client.exceptions import ApiException

from activities.clients.kube import API_TIMEOUT, KubeClient, fail, selector
from activities.core.deployments import CONTAINER
from activities.node_cache.cache import NodeCache
from activities.node_cache.access import node_cache_token_env
from activities.rollout.model_cache import safe_component
from workflows.core import naming
from workflows.core.gpu_shares import GPU_MEMORY_UTILIZATION_FLAG, SHARED_GPU_RESOURCE
from workflows.core.pools import node_selector, tolerations
from workflows.node_cache.chunks import cached_version_label
from workflows.node_cache.contract import NodeCacheRequest
from workflows.rollout import contract
from workflows.rollout.contract import EnsureVersionInput

CACHE_VOLUME = "model-cache"
ENGINE_CACHE_VOLUME = "engine-cache"
ENGINE_CACHE_ENV = "VLLM_CACHE_ROOT"  # vLLM's torch.compile and CUDA-graph cache
NODE_CACHE_VOLUME, NODE_VERSION_VOLUME = "node-cache", "node-cache-version"
STAGE_INIT_CONTAINER = "stage-weights"
# A deleted replica drains: preStop waits while its endpoint is removed everywhere (no new
# requests), then SIGTERM and vLLM finishes what it accepted within the grace period.
PRE_STOP_SECONDS = 5
DRAIN_GRACE_SECONDS = 120


@dataclass(frozen=True)
class ServingPods:
    """How serving pods see the model cache and where they send traces (from the worker's Settings)."""

    model_cache_dir: Path
    model_cache_pvc: str | None = None  # None: a hostPath of model_cache_dir on the node
    otlp_traces_endpoint: str | None = None
    trace_sample_ratio: float = 0.1
    engine_cache_dir: Path | None = None  # VLLM_CACHE_ROOT per version on the node's disk; None: none
    node_cache_dir: Path | None = None  # the node-local weight cache (activities/node_cache/); None: pods never read it
    node_cache_image: str = "ghcr.io/tideplane/worker:0.1.0"  # what the pods' staging init container runs
    engine_api_key_secret: str | None = None  # "SECRET/KEY" in each serving namespace: VLLM_API_KEY from it; None: no key
    # the node cache's secret: the staging init container gets its version's chunk-server token from it
    node_cache_secret: str | None = field(default=None, repr=False)


DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def mark_deletion_costs(kube: KubeClient, namespace: str, pods_selector: str) -> None:
    """Before a scale-down: each replica's pod-deletion-cost is the number of other model pods on
    its node, so the ReplicaSet controller removes replicas from the least-loaded nodes first and
    those nodes empty (to be removed, or stopped back into a warm pool). Deletion itself drains: the
    pod leaves the endpoints, then the server finishes what it accepted (preStop, grace period)."""
    pods = [p for p in kube.core.list_namespaced_pod(namespace, label_selector=pods_selector, _request_timeout=API_TIMEOUT).items
            if p.metadata.deletion_timestamp is None]
    if len(pods) < 2:
        return
    on_node: dict[str, int] = {}
    for p in kube.core.list_pod_for_all_namespaces(label_selector=naming.LABEL_MODEL, _request_timeout=API_TIMEOUT).items:
        if p.spec.node_name and p.metadata.deletion_timestamp is None:
            on_node[p.spec.node_name] = on_node.get(p.spec.node_name, 0) + 1
    for p in pods:
        cost = str(on_node.get(p.spec.node_name, 1) - 1) if p.spec.node_name else "0"
        if (p.metadata.annotations or {}).get(DELETION_COST) == cost:
            continue
        try:
            kube.core.patch_namespaced_pod(
                p.metadata.name, namespace, {"metadata": {"annotations": {DELETION_COST: cost}}}, _request_timeout=API_TIMEOUT
            )
        except ApiException as exc:
            if exc.status != 404:  # gone meanwhile: nothing to rank
                fail(exc, f"pod {namespace}/{p.metadata.name}: deletion cost")


def _tracing_env(req: EnsureVersionInput, object_name: str, pods: ServingPods) -> dict[str, str]:
    """OpenTelemetry resource identity for the serving pods, and the exporter when one is set."""
    env = {
        "OTEL_SERVICE_NAME": req.deployment.name,
        "OTEL_RESOURCE_ATTRIBUTES": (
            f"service.version={req.version},k8s.namespace.name={req.deployment.namespace},"
            f"k8s.deployment.name={object_name},tideplane.model={req.model}"
        ),
    }
    if pods.otlp_traces_endpoint:
        env |= {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": pods.otlp_traces_endpoint,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(pods.trace_sample_ratio),
        }
    return env


def image_allowed(image: str, prefixes: Collection[str]) -> bool:
    """Whether ``image`` names a repository under one of ``prefixes``, both as the container runtime
    resolves them (``vllm/vllm-openai:v0.6.3`` is ``docker.io/vllm/vllm-openai:v0.6.3``), a prefix
    ending at a path, tag or digest boundary (``docker.io/vllm`` does not admit ``docker.io/vllmx``)."""
    name = canonical_image(image)
    for prefix in prefixes:
        wanted = canonical_image(prefix.rstrip("/")) if prefix.rstrip("/") else ""
        if wanted and (name == wanted or name.startswith(wanted) and name[len(wanted)] in "/:@"):
            return True
    return False


def image_pinning_problem(image: str, pinning: str) -> str | None:
    """Why ``image`` is refused under TIDEPLANE_IMAGE_PINNING ``pinning`` (None: accepted): ``digest``
    admits only ``IMAGE@sha256:...``; ``tag`` (the default) any version tag (``latest`` and untagged
    references are refused at start, workflows/rollout/types.py)."""
    if pinning == "digest" and "@sha256:" not in image:
        return f"image {image!r} is not pinned by digest (TIDEPLANE_IMAGE_PINNING=digest): use IMAGE@sha256:..."
    return None


def canonical_image(image: str) -> str:
    """An image reference with its registry: Docker Hub names gain ``docker.io/`` (and ``library/``)."""
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if slash else f"docker.io/library/{image}"


# Serving containers run unprivileged: no root, no privilege escalation, no capabilities, the
# runtime's default seccomp profile (the Kubernetes "restricted" Pod Security Standard).
SERVING_USER = 1000
CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": SERVING_USER,
    "runAsGroup": SERVING_USER,
    "seccompProfile": {"type": "RuntimeDefault"},
}


ENGINE_API_KEY_ENV = "VLLM_API_KEY"  # vLLM's --api-key default: every /v1 endpoint then asks for it


def _api_key_env(pods: ServingPods) -> dict[str, contract.EnvFromSecret]:
    if pods.engine_api_key_secret is None:
        return {}
    secret, key = pods.engine_api_key_secret.split("/", 1)
    return {ENGINE_API_KEY_ENV: contract.EnvFromSecret.model_validate({"valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})}


def _env_var(name: str, value: str | contract.EnvFromSecret) -> dict:
    if isinstance(value, str):
        return {"name": name, "value": value}
    return {"name": name, "valueFrom": value.valueFrom.model_dump()}


def _cache_volume(pods: ServingPods) -> dict:
    if pods.model_cache_pvc:
        return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": pods.model_cache_pvc, "readOnly": True}}
    return {"name": CACHE_VOLUME, "hostPath": {"path": str(pods.model_cache_dir), "type": "Directory"}}


def engine_cache_path(pods: ServingPods, model: str, version: str) -> Path | None:
    """The version's own engine cache directory on the node (None: no engine cache)."""
    if pods.engine_cache_dir is None:
        return None
    return pods.engine_cache_dir / safe_component(model, "model") / safe_component(version, "version")


def deployment_manifest(req: EnsureVersionInput, pods: ServingPods) -> dict:
    """The Deployment serving one version: vLLM-style args, GPUs, readiness, the weights read-only,
    and, on GPUs, the priority class's node selector (realtime on on-demand, batch on spot).

    With an engine cache, VLLM_CACHE_ROOT is the version's own directory on the node (hostPath,
    created if missing): the only writable mount, so a version's compile cache is reused by the
    next replica on that node and no version can write another's cache or the weights."""
    name = req.deployment.versioned(req.version)
    labels = {
        **selector(req.deployment.name, req.version),
        naming.LABEL_MODEL: req.model,
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
        naming.LABEL_CLASS: req.priority_class,
    }
    node_version = node_cache_version_dir(req, pods)
    weights = str(node_version) if node_version is not None else req.weights_path
    args = ["--model", weights, "--served-model-name", req.model, "--port", str(req.port)]
    if req.gpu_memory_utilization is not None:
        args += [GPU_MEMORY_UTILIZATION_FLAG, f"{req.gpu_memory_utilization:g}"]
    if pods.otlp_traces_endpoint:
        args += ["--otlp-traces-endpoint", pods.otlp_traces_endpoint]
    env = _tracing_env(req, name, pods) | _api_key_env(pods) | req.env
    engine_cache = engine_cache_path(pods, req.model, req.version)
    if engine_cache is not None:
        env[ENGINE_CACHE_ENV] = str(engine_cache)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": req.image,
        "args": args + req.args,
        "ports": [{"name": "http", "containerPort": req.port, "protocol": "TCP"}],
        "env": [_env_var(k, v) for k, v in sorted(env.items())],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": str(pods.model_cache_dir), "readOnly": True}],
        "securityContext": CONTAINER_SECURITY,
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
    }
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": DRAIN_GRACE_SECONDS,
        "securityContext": POD_SECURITY,
        "containers": [container],
        "volumes": [_cache_volume(pods)],
    }
    if engine_cache is not None:
        container["volumeMounts"].append({"name": ENGINE_CACHE_VOLUME, "mountPath": str(engine_cache)})
        pod_spec["volumes"].append({"name": ENGINE_CACHE_VOLUME, "hostPath": {"path": str(engine_cache), "type": "DirectoryOrCreate"}})
    if node_version is not None:
        _read_from_node_cache(req, pods.node_cache_dir, pods.node_cache_image, pod_spec, node_version, pods.node_cache_secret)
    if req.gpus_per_replica:
        # a share of one GPU (time-slicing replicas, workflows/scaling/gpu_sharing.py), or whole GPUs
        gpus = {SHARED_GPU_RESOURCE: "1"} if req.gpu_memory_utilization is not None else {naming.GPU_RESOURCE: str(req.gpus_per_replica)}
        container["resources"] = {"limits": gpus, "requests": dict(gpus)}
        # The priority class picks the GPU capacity type: realtime on on-demand nodes, batch on spot.
        pod_spec["nodeSelector"] = node_selector(req.priority_class)
        pod_spec["tolerations"] = [
            *tolerations(req.priority_class),
            {"key": naming.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": req.deployment.namespace, "labels": labels},
        "spec": {
            "replicas": req.replicas,
            "selector": {"matchLabels": selector(req.deployment.name, req.version)},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def node_cache_version_dir(req: EnsureVersionInput, pods: ServingPods) -> Path | None:
    """Where the version's files are in every node's cache, when its pods read it there (the rollout
    pre-staged it and the worker knows the cache); None: they read the shared model cache."""
    if not req.node_cache_files or pods.node_cache_dir is None:
        return None
    return NodeCache(pods.node_cache_dir).version_dir(safe_component(req.model, "model"), safe_component(req.version, "version"))


def _read_from_node_cache(
    req: EnsureVersionInput, cache_dir: Path, image: str, pod_spec: dict, version_dir: Path, secret: str | None = None,
) -> None:
    """The server loads the version from its node's cache, mounted read-only; the pod prefers nodes
    labelled as holding it, and on any other node (a new one, or one that evicted it) an init
    container runs the node staging code first (``node-cache stage``: S3, each chunk verified; chunks
    the node holds for other versions are linked, not fetched), so the pod starts either way."""
    node = "$(NODE_NAME)"  # the kubelet expands it from the init container's env
    request = NodeCacheRequest(model=req.model, version=req.version, files=req.node_cache_files, node=node, stagers=[node])
    pod_spec["initContainers"] = [{
        "name": STAGE_INIT_CONTAINER,
        "image": image,
        "args": ["node-cache", "stage", "--request", request.model_dump_json()],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "TIDEPLANE_NODE_CACHE_DIR", "value": str(cache_dir)}, *node_cache_token_env(secret, req.model, req.version)],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": NODE_CACHE_VOLUME, "mountPath": str(cache_dir)}],
    }]
    pod_spec["containers"][0]["volumeMounts"].append({"name": NODE_VERSION_VOLUME, "mountPath": str(version_dir), "readOnly": True})
    pod_spec["volumes"] += [
        {"name": NODE_CACHE_VOLUME, "hostPath": {"path": str(cache_dir), "type": "DirectoryOrCreate"}},
        {"name": NODE_VERSION_VOLUME, "hostPath": {"path": str(version_dir), "type": "DirectoryOrCreate"}},
    ]
    pod_spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "preference": {"matchExpressions": [{"key": cached_version_label(req.model, req.version), "operator": "In", "values": ["true"]}]},
    }]}}


def service_manifest(req: EnsureVersionInput) -> dict:
    name = req.deployment.versioned(req.version)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": req.deployment.namespace,
            "labels": {**selector(req.deployment.name, req.version), naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
        },
        "spec": {
            "selector": selector(req.deployment.name, req.version),
            "ports": [{"name": "http", "port": req.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
