"""The Kubernetes API: one ApiClient per worker, typed API accessors, and the helpers every
Kubernetes activity shares (error translation, read-or-none, readiness, label selectors).

Every call carries ``API_TIMEOUT`` so a hung API server cannot hang an activity.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, NoReturn, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError
from urllib3.util.retry import Retry

from workflows.core import naming

# (connect, read) seconds on every API call: a hung API server must not hang an activity.
API_TIMEOUT = (5, 30)

# The label by which the operator enables a namespace for serving: the worker creates and changes
# objects only in namespaces that carry it (and are granted by a RoleBinding, infra/k8s/serving-namespace),
# and the worker's NetworkPolicy sends warm-up traffic only to them.
SERVING_NAMESPACE_LABEL = naming.LABEL_SERVING_NAMESPACE

# An API server answering 429/5xx for a moment (overload, leader change) is retried here, briefly,
# so that one blip does not spend an attempt of the activity; 409s stay with the callers (re-read,
# ``retry_on_conflict``). Writes are safe to repeat: creates treat 409 AlreadyExists (and only that
# 409: ``already_exists``) as "update", scale/patch are idempotent.
TRANSIENT_RETRIES = Retry(
    total=3, backoff_factor=0.2, status_forcelist=(429, 500, 502, 503, 504), allowed_methods=None, raise_on_status=False
)
# Read-modify-write attempts before an object that keeps changing fails the activity attempt.
CONFLICT_RETRIES = 5

T = TypeVar("T")


class KubeClient:
    """The worker's connection to one cluster; the generated API classes share its ApiClient."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.batch = client.BatchV1Api(api)

    @classmethod
    def connect(cls, kubeconfig: Path | str | None = None, in_cluster: bool = False) -> KubeClient:
        """From the pod's service account (``in_cluster``) or a kubeconfig file (None: the default one)."""
        cfg = client.Configuration()
        if in_cluster:
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None, client_configuration=cfg)
        cfg.retries = TRANSIENT_RETRIES
        return cls(client.ApiClient(cfg))

    def require_namespace(self, namespace: str) -> None:
        """Fail non-retryably on an unknown namespace (lists in one just come back empty) or one the
        operator has not enabled: rollouts and scaling loops act only where the label says so."""
        try:
            found = self.core.read_namespace(namespace, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                raise ApplicationError(f"namespace {namespace!r} not found", non_retryable=True) from None
            raise
        if (found.metadata.labels or {}).get(SERVING_NAMESPACE_LABEL) != "true":
            raise ApplicationError(
                f"namespace {namespace!r} is not enabled for tideplane: label it {SERVING_NAMESPACE_LABEL}=true and bind"
                " the worker's Role there (kubectl apply -k of a copy of infra/k8s/overlays/example/namespaces/llm-serving)",
                type="NamespaceNotEnabled",
                non_retryable=True,
            )


def serving_namespace(name: str) -> dict:
    """The manifest of a namespace enabled for serving (what infra/k8s/serving-namespace applies, minus the Role)."""
    return {"metadata": {"name": name, "labels": {SERVING_NAMESPACE_LABEL: "true"}}}


def fail(exc: ApiException, what: str) -> NoReturn:
    """Re-raise an API error: requests that cannot succeed as sent are non-retryable."""
    if exc.status in (400, 403, 404, 422):
        raise ApplicationError(f"{what}: HTTP {exc.status} {exc.reason}: {exc.body}", non_retryable=True) from None
    raise exc


def retry_on_conflict(what: str, attempt: Callable[[], T]) -> T:
    """``attempt()`` (read the object, change it, write it back with the resourceVersion read) again
    while the write answers 409 Conflict: someone changed the object in between, so it is re-read,
    never overwritten. Other API errors go through ``fail`` naming ``what``."""
    for _ in range(CONFLICT_RETRIES):
        try:
            return attempt()
        except ApiException as exc:
            if exc.status != 409:
                fail(exc, what)
    raise ApplicationError(f"{what} kept changing under us ({CONFLICT_RETRIES} conflicts)")


def already_exists(exc: ApiException) -> bool:
    """Whether a create's error says the object is already there: 409 with reason AlreadyExists. A
    409 Conflict is something else (the write raced another one) and says nothing about existence."""
    if exc.status != 409:
        return False
    try:
        return json.loads(exc.body or "{}").get("reason") == "AlreadyExists"
    except (TypeError, ValueError):
        return False


def read_or_none(read: Callable[..., Any], *args: Any) -> Any:
    """``read(*args)``, or None when the object does not exist."""
    try:
        return read(*args, _request_timeout=API_TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def apply_service(core: client.CoreV1Api, body: dict) -> bool:
    """Create the Service ``body`` describes or patch the one there (patch, never replace: its
    allocated clusterIP is kept); False when it already matches (selector, ports, labels). A JSON
    merge patch, so ``ports`` is replaced: a strategic merge keys ports by number, so a changed
    number would add a second port of the same name, which the API server refuses. A 409 on either
    write (created meanwhile, or a raced change) re-reads."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    want_ports = [(p.get("name"), p["port"], p.get("targetPort"), p.get("protocol", "TCP")) for p in body["spec"]["ports"]]

    def write() -> bool:
        have = read_or_none(core.read_namespaced_service, name, ns)
        if have is None:
            core.create_namespaced_service(ns, body, _request_timeout=API_TIMEOUT)
            return True
        ports = [(p.name, p.port, p.target_port, p.protocol) for p in have.spec.ports or []]
        labels = have.metadata.labels or {}
        if (have.spec.selector == body["spec"]["selector"] and ports == want_ports
                and all(labels.get(k) == v for k, v in body["metadata"].get("labels", {}).items())):
            return False
        core.patch_namespaced_service(name, ns, body, _request_timeout=API_TIMEOUT, _content_type="application/merge-patch+json")
        return True

    return retry_on_conflict(f"Service {ns}/{name}", write)


def is_ready(pod: client.V1Pod) -> bool:
    """A pod that serves: condition Ready and not being deleted."""
    if pod.metadata.deletion_timestamp is not None or not pod.status:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def selector(name: str, version: str | None = None) -> dict[str, str]:
    """The labels of a logical deployment's objects, or of one of its versions."""
    labels = {naming.LABEL_APP: name}
    if version is not None:
        labels[naming.LABEL_VERSION] = version
    return labels


def gateway_parent_ref(gateway: str, namespace: str) -> dict[str, str]:
    """The parentRef of a route in ``namespace`` to ``gateway`` ("NAMESPACE/NAME", or "NAME" in the route's namespace)."""
    gateway_ns, _, name = gateway.rpartition("/")
    ref = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name}
    if gateway_ns and gateway_ns != namespace:
        ref["namespace"] = gateway_ns
    return ref


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def container_named(containers: list | None, name: str) -> Any:
    """The container called ``name``, or the only one when none is (a Deployment written by hand)."""
    containers = containers or []
    return next((c for c in containers if c.name == name), containers[0] if len(containers) == 1 else None)


def edit_container_args(kube: KubeClient, namespace: str, deployment: str, container: str,
                        edit: Callable[[list[str]], list[str]]) -> None:
    """Replace one container's args in a Deployment's template with ``edit(args)`` (no write when
    unchanged; a conflicting write re-read and retried). A changed template rolls the pods."""
    what = f"Deployment {namespace}/{deployment}"

    def write() -> None:
        dep = read_or_none(kube.apps.read_namespaced_deployment, deployment, namespace)
        if dep is None:
            raise ApplicationError(f"{what} not found", type="NotFound", non_retryable=True)
        found = container_named(dep.spec.template.spec.containers, container)
        if found is None:
            raise ApplicationError(f"{what} has no container {container!r}", non_retryable=True)
        args = list(found.args or [])
        wanted = edit(args)
        if wanted != args:
            found.args = wanted
            kube.apps.replace_namespaced_deployment(deployment, namespace, dep, _request_timeout=API_TIMEOUT)

    retry_on_conflict(what, write)
