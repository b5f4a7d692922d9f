"""The worker's identity in the sandbox: the ServiceAccount and RBAC of infra/k8s/base, and a token.

The sandbox's worker talks to the API emulator as that ServiceAccount, so the end-to-end tests run
with exactly the least-privilege RBAC a real cluster gives it; the operator and the tests keep the
admin kubeconfig.
"""

from __future__ import annotations

import base64
from pathlib import Path

import yaml
from kubernetes import client

from activities.clients.kube import serving_namespace

BASE = Path(__file__).resolve().parents[1] / "k8s" / "base"
SERVING_ROLE = BASE.parent / "serving-namespace" / "role.yaml"
WORKER_MANIFESTS = (BASE / "serviceaccount.yaml", BASE / "rbac.yaml")
WORKER_NAMESPACE = yaml.safe_load((BASE / "kustomization.yaml").read_text())["namespace"]
TOKEN_SECONDS = 7 * 24 * 3600  # outlives any sandbox session


def worker_manifests() -> list[dict]:
    """The ServiceAccount, ClusterRole and ClusterRoleBinding, in the kustomization's namespace."""
    docs = [d for path in WORKER_MANIFESTS for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if doc["kind"] == "ServiceAccount":
            doc["metadata"]["namespace"] = WORKER_NAMESPACE
    return docs


def payload_key_ref() -> tuple[str, str]:
    """The Secret name and key the worker's Deployment takes TIDEPLANE_PAYLOAD_ENCRYPTION_KEY from."""
    deployment = yaml.safe_load((BASE / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ref = next(e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "TIDEPLANE_PAYLOAD_ENCRYPTION_KEY")
    return ref["name"], ref["key"]


def create_payload_key_secret(api: client.ApiClient, key: str) -> None:
    """That Secret in the worker's namespace (as the operator makes it out of band); one already
    there is left as it is."""
    name, item = payload_key_ref()
    secret = {"metadata": {"name": name}, "type": "Opaque", "data": {item: base64.b64encode(key.encode()).decode()}}
    try:
        client.CoreV1Api(api).create_namespaced_secret(WORKER_NAMESPACE, secret)
    except client.ApiException as exc:
        if exc.status != 409:
            raise


def read_payload_key(api: client.ApiClient) -> str:
    """The payload key as the kubelet resolves the worker's secretKeyRef: read from the Secret."""
    name, item = payload_key_ref()
    secret = client.CoreV1Api(api).read_namespaced_secret(name, WORKER_NAMESPACE)
    return base64.b64decode(secret.data[item]).decode()


def service_account_name() -> str:
    return next(d["metadata"]["name"] for d in worker_manifests() if d["kind"] == "ServiceAccount")


def install_worker_identity(api: client.ApiClient) -> str:
    """Create the worker's namespace, ServiceAccount and RBAC (as an admin); return a token for it."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    creates = {
        "ServiceAccount": lambda d: core.create_namespaced_service_account(WORKER_NAMESPACE, d),
        "ClusterRole": rbac.create_cluster_role,
        "ClusterRoleBinding": rbac.create_cluster_role_binding,
        "Role": lambda d: rbac.create_namespaced_role(WORKER_NAMESPACE, d),
        "RoleBinding": lambda d: rbac.create_namespaced_role_binding(WORKER_NAMESPACE, d),
    }
    for create, doc in [(lambda d: core.create_namespace(d), {"metadata": {"name": WORKER_NAMESPACE}}),
                        *[(creates[d["kind"]], d) for d in worker_manifests()]]:
        try:
            create(doc)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    request = core.create_namespaced_service_account_token(
        service_account_name(), WORKER_NAMESPACE, {"spec": {"expirationSeconds": TOKEN_SECONDS}})
    return request.status.token


def enable_serving_namespace(api: client.ApiClient, namespace: str) -> None:
    """What `kubectl apply -k` of infra/k8s/serving-namespace does for ``namespace`` (as an admin):
    the namespace with the label the worker checks, and the Role of the worker's writes bound to
    its ServiceAccount there. Without it the worker may not create anything in the namespace."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    docs = [d for d in yaml.safe_load_all(SERVING_ROLE.read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = WORKER_NAMESPACE
    creates = {
        "Role": lambda d: rbac.create_namespaced_role(namespace, d),
        "RoleBinding": lambda d: rbac.create_namespaced_role_binding(namespace, d),
    }
    for create, doc in [(core.create_namespace, serving_namespace(namespace)), *[(creates[d["kind"]], d) for d in docs]]:
        try:
            create(doc)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
