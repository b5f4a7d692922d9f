"""Kubernetes side of the rollout: one Deployment + Service per version, and the HTTPRoute split.

Every write is declarative (create, or replace/patch to the desired state) so an activity retried
after a crash converges on the same objects instead of duplicating them. Errors that retrying
cannot fix (unknown namespace, invalid object, bad weights) are non-retryable and named.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError

from activities.clients.kube import API_TIMEOUT, KubeClient, fail, is_ready, label_selector, read_or_none, selector
from workers import telemetry
from workers.config import settings
from workflows import naming
from workflows.scaling.placement import node_selector, tolerations
from workflows.rollout.activities import (
    DESCRIBE_DEPLOYMENT,
    ENSURE_VERSION,
    SCALE_VERSION,
    SET_ROUTE_WEIGHTS,
    WAIT_READY,
    DeploymentRef,
    DeploymentState,
    EnsureVersionInput,
    ReadyResult,
    RouteWeightsInput,
    ScaleVersionInput,
    VersionInfo,
    WaitReadyInput,
)

ROUTE_API = ("gateway.networking.k8s.io", "v1")
CONTAINER = "server"
CACHE_VOLUME = "model-cache"
_CONFLICT_RETRIES = 5

# Old names of the helpers now in activities.clients.kube, until their last users move there.
_fail, _read_or_none, _is_ready, _selector, _label_selector = fail, read_or_none, is_ready, selector, label_selector


@functools.cache
def _client_for(kubeconfig: str | None, in_cluster: bool) -> client.ApiClient:
    return KubeClient.connect(kubeconfig, in_cluster).api


def api_client() -> client.ApiClient:
    """The process's Kubernetes client: the in-cluster service account, or settings().kubeconfig."""
    s = settings()
    return _client_for(str(s.kubeconfig) if s.kubeconfig else None, s.kube_in_cluster)


def require_namespace(namespace: str) -> None:
    """Fail non-retryably on an unknown namespace (lists in one just come back empty)."""
    KubeClient(api_client()).require_namespace(namespace)


def _get_route(ref: DeploymentRef) -> dict | None:
    api = client.CustomObjectsApi(api_client())
    return _read_or_none(api.get_namespaced_custom_object, *ROUTE_API, ref.namespace, "httproutes", ref.name)


def _route_weights(route: dict | None) -> dict[str, int]:
    """Service name -> weight in the route's first rule (the rule tideplane manages)."""
    rules = (route or {}).get("spec", {}).get("rules") or []
    refs = rules[0].get("backendRefs", []) if rules else []
    return {r["name"]: int(r.get("weight", 1)) for r in refs}


@activity.defn(name=DESCRIBE_DEPLOYMENT)
def describe_deployment(ref: DeploymentRef) -> DeploymentState:
    """The versions of a logical deployment in the cluster, their replicas and route weights."""
    require_namespace(ref.namespace)
    apps = client.AppsV1Api(api_client())
    deployments = apps.list_namespaced_deployment(
        ref.namespace, label_selector=_label_selector(_selector(ref.name)), _request_timeout=API_TIMEOUT
    ).items
    route = _get_route(ref)
    weights = _route_weights(route)
    versions = []
    for dep in sorted(deployments, key=lambda d: d.metadata.name):
        labels = dep.metadata.labels or {}
        version = labels.get(naming.LABEL_VERSION)
        if version is None:
            continue
        versions.append(
            VersionInfo(
                version=version,
                model=labels.get(naming.LABEL_MODEL, ""),
                replicas=dep.spec.replicas or 0,
                ready_replicas=(dep.status.ready_replicas if dep.status else None) or 0,
                route_weight=weights.get(naming.versioned_name(ref.name, version), 0),
            )
        )
    return DeploymentState(route_exists=route is not None, versions=versions)


def _tracing_env(req: EnsureVersionInput, object_name: str) -> dict[str, str]:
    """OpenTelemetry resource identity for the serving pods, and the exporter when one is set."""
    env = {
        "OTEL_SERVICE_NAME": req.deployment.name,
        "OTEL_RESOURCE_ATTRIBUTES": (
            f"service.version={req.version},k8s.namespace.name={req.deployment.namespace},"
            f"k8s.deployment.name={object_name},tideplane.model={req.model}"
        ),
    }
    s = settings()
    if s.otlp_traces_endpoint:
        env |= {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": s.otlp_traces_endpoint,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(s.trace_sample_ratio),
        }
    return env


def _cache_volume() -> dict:
    s = settings()
    if s.model_cache_pvc:
        return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": s.model_cache_pvc, "readOnly": True}}
    return {"name": CACHE_VOLUME, "hostPath": {"path": str(s.model_cache_dir), "type": "Directory"}}


def deployment_manifest(req: EnsureVersionInput) -> dict:
    """The Deployment serving one version: vLLM-style args, GPUs, readiness, the weights read-only,
    and, on GPUs, the priority class's node selector (realtime on on-demand, batch on spot)."""
    name = naming.versioned_name(req.deployment.name, req.version)
    labels = {
        **_selector(req.deployment.name, req.version),
        naming.LABEL_MODEL: req.model,
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
        naming.LABEL_CLASS: req.priority_class,
    }
    cache_dir = str(settings().model_cache_dir)
    args = ["--model", req.weights_path, "--served-model-name", req.model, "--port", str(req.port)]
    if settings().otlp_traces_endpoint:
        args += ["--otlp-traces-endpoint", settings().otlp_traces_endpoint]
    env = _tracing_env(req, name) | req.env
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": req.image,
        "args": args + req.args,
        "ports": [{"name": "http", "containerPort": req.port, "protocol": "TCP"}],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": cache_dir, "readOnly": True}],
    }
    pod_spec: dict[str, Any] = {"containers": [container], "volumes": [_cache_volume()]}
    if req.gpus_per_replica:
        container["resources"] = {
            "limits": {naming.GPU_RESOURCE: str(req.gpus_per_replica)},
            "requests": {naming.GPU_RESOURCE: str(req.gpus_per_replica)},
        }
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
            "selector": {"matchLabels": _selector(req.deployment.name, req.version)},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def service_manifest(req: EnsureVersionInput) -> dict:
    name = naming.versioned_name(req.deployment.name, req.version)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": req.deployment.namespace,
            "labels": {**_selector(req.deployment.name, req.version), naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
        },
        "spec": {
            "selector": _selector(req.deployment.name, req.version),
            "ports": [{"name": "http", "port": req.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _create_or_replace_deployment(apps: client.AppsV1Api, body: dict) -> None:
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    for _ in range(_CONFLICT_RETRIES):
        current = _read_or_none(apps.read_namespaced_deployment, name, ns)
        try:
            if current is None:
                apps.create_namespaced_deployment(ns, body, _request_timeout=API_TIMEOUT)
            else:
                body["metadata"]["resourceVersion"] = current.metadata.resource_version
                body["metadata"]["annotations"] = current.metadata.annotations  # e.g. the revision
                apps.replace_namespaced_deployment(name, ns, body, _request_timeout=API_TIMEOUT)
            return
        except ApiException as exc:
            if exc.status != 409:
                _fail(exc, f"Deployment {ns}/{name}")
    raise ApplicationError(f"Deployment {ns}/{name} kept changing under us ({_CONFLICT_RETRIES} conflicts)")


def _create_or_patch_service(core: client.CoreV1Api, body: dict) -> None:
    """Patch rather than replace: a Service's allocated clusterIP must be kept."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        if _read_or_none(core.read_namespaced_service, name, ns) is None:
            try:
                core.create_namespaced_service(ns, body, _request_timeout=API_TIMEOUT)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        core.patch_namespaced_service(name, ns, body, _request_timeout=API_TIMEOUT)
    except ApiException as exc:
        _fail(exc, f"Service {ns}/{name}")


@activity.defn(name=ENSURE_VERSION)
def ensure_version(req: EnsureVersionInput) -> None:
    """Create or update the Deployment and Service for one version (no route change)."""
    cache = settings().model_cache_dir
    if not Path(req.weights_path).is_relative_to(cache):
        raise ApplicationError(
            f"weights_path {req.weights_path!r} is outside the model cache {str(cache)!r} that pods mount",
            non_retryable=True,
        )
    require_namespace(req.deployment.namespace)
    api = api_client()
    _create_or_replace_deployment(client.AppsV1Api(api), deployment_manifest(req))
    _create_or_patch_service(client.CoreV1Api(api), service_manifest(req))


@activity.defn(name=SCALE_VERSION)
def scale_version(req: ScaleVersionInput) -> None:
    """Set one version's replicas through the Deployment's scale subresource."""
    require_namespace(req.deployment.namespace)
    name = naming.versioned_name(req.deployment.name, req.version)
    try:
        client.AppsV1Api(api_client()).patch_namespaced_deployment_scale(
            name, req.deployment.namespace, {"spec": {"replicas": req.replicas}}, _request_timeout=API_TIMEOUT
        )
    except ApiException as exc:
        _fail(exc, f"scale Deployment {req.deployment.namespace}/{name} (version {req.version})")


def _waiting_reason(pod: client.V1Pod) -> str:
    """Why a pod is not Ready yet, as an operator would want to read it in the UI."""
    status = pod.status
    for cond in (status.conditions if status else None) or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"{pod.metadata.name}: {cond.reason or 'Pending'}: {cond.message or ''}".rstrip(": ")
    phase = (status.phase if status else None) or "Pending"
    return f"{pod.metadata.name}: {phase}, not Ready"


@activity.defn(name=WAIT_READY)
def wait_ready(req: WaitReadyInput) -> ReadyResult:
    """Poll until ``replicas`` pods of the version are Ready; the workflow's timeout bounds the wait.

    The start time travels in the heartbeat details, so a retried attempt still reports the
    cold start from the first call.
    """
    require_namespace(req.deployment.namespace)
    api = api_client()
    name = naming.versioned_name(req.deployment.name, req.version)
    if _read_or_none(client.AppsV1Api(api).read_namespaced_deployment, name, req.deployment.namespace) is None:
        raise ApplicationError(f"Deployment {req.deployment.namespace}/{name} not found", non_retryable=True)
    details = activity.info().heartbeat_details
    started = float(details[0]["started_at"]) if details else time.time()
    core = client.CoreV1Api(api)
    selector = _label_selector(_selector(req.deployment.name, req.version))
    while True:
        pods = core.list_namespaced_pod(
            req.deployment.namespace, label_selector=selector, _request_timeout=API_TIMEOUT
        ).items
        ready = sum(1 for p in pods if _is_ready(p))
        if ready >= req.replicas:
            return ReadyResult(ready_replicas=ready, seconds=round(time.time() - started, 3))
        waiting = [_waiting_reason(p) for p in pods if not _is_ready(p)]
        if len(pods) < req.replicas:
            waiting.append(f"{req.replicas - len(pods)} pod(s) not created yet")
        activity.heartbeat({"started_at": started, "ready": ready, "desired": req.replicas, "waiting": waiting[:10]})
        activity.wait_for_cancelled_sync(req.poll_seconds)
        if activity.is_cancelled():
            raise CancelledError(f"wait_ready {name} cancelled")


def _parent_ref(namespace: str) -> dict:
    gateway_ns, _, gateway = settings().gateway.rpartition("/")
    ref = {"group": ROUTE_API[0], "kind": "Gateway", "name": gateway}
    if gateway_ns and gateway_ns != namespace:
        ref["namespace"] = gateway_ns
    return ref


@activity.defn(name=SET_ROUTE_WEIGHTS)
def set_route_weights(req: RouteWeightsInput) -> None:
    """Make the HTTPRoute's first rule send exactly these weights to the versions' Services.

    Versions at weight 0 stay listed so the next step can re-weight them; the route is created
    (attached to settings().gateway) when missing. Read-modify-replace keeps the rule's matches
    and filters, and the resourceVersion makes a concurrent edit a retried conflict, not a loss.
    The weights set are exported as ``tideplane_rollout_weight`` (the rollouts dashboard).
    """
    if not req.weights or any(not 0 <= w <= 100 for w in req.weights.values()) or sum(req.weights.values()) != 100:
        raise ApplicationError(f"route weights must be 0..100 and sum to 100, got {req.weights}", non_retryable=True)
    ref = req.deployment
    require_namespace(ref.namespace)
    core = client.CoreV1Api(api_client())
    backends = []
    for version, weight in sorted(req.weights.items()):
        service = naming.versioned_name(ref.name, version)
        if weight and _read_or_none(core.read_namespaced_service, service, ref.namespace) is None:
            raise ApplicationError(
                f"cannot send {weight}% to version {version}: Service {ref.namespace}/{service} not found",
                non_retryable=True,
            )
        backends.append({"group": "", "kind": "Service", "name": service, "port": req.port, "weight": weight})

    api = client.CustomObjectsApi(api_client())
    what = f"HTTPRoute {ref.namespace}/{ref.name}"
    for _ in range(_CONFLICT_RETRIES):
        route = _get_route(ref)
        try:
            if route is None:
                body = {
                    "apiVersion": "/".join(ROUTE_API),
                    "kind": "HTTPRoute",
                    "metadata": {
                        "name": ref.name,
                        "namespace": ref.namespace,
                        "labels": {**_selector(ref.name), naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
                    },
                    "spec": {"parentRefs": [_parent_ref(ref.namespace)], "rules": [{"backendRefs": backends}]},
                }
                api.create_namespaced_custom_object(*ROUTE_API, ref.namespace, "httproutes", body, _request_timeout=API_TIMEOUT)
                break
            rules = route.setdefault("spec", {}).setdefault("rules", [])
            if not rules:
                rules.append({})
            if rules[0].get("backendRefs") == backends:
                break
            rules[0]["backendRefs"] = backends
            api.replace_namespaced_custom_object(
                *ROUTE_API, ref.namespace, "httproutes", ref.name, route, _request_timeout=API_TIMEOUT
            )
            break
        except ApiException as exc:
            if exc.status != 409:
                _fail(exc, what)
    else:
        raise ApplicationError(f"{what} kept changing under us ({_CONFLICT_RETRIES} conflicts)")
    telemetry.record_route_weights(ref.namespace, ref.name, req.weights)


ACTIVITIES = [describe_deployment, ensure_version, scale_version, wait_ready, set_route_weights]
