"""RBAC enforced by the emulator: the worker's ServiceAccount gets exactly infra/k8s/base's grants.

Through the official client and the stock kubectl, against one emulated cluster for the module:
the admin (no credentials, the loopback operator) installs the worker's ServiceAccount and RBAC
as the sandbox launcher does, then acts as the worker with its TokenRequest token.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.rest import ApiException

from infra.sandbox.kubeclient import kubeconfig_yaml
from infra.sandbox.worker_identity import (
    WORKER_NAMESPACE,
    enable_serving_namespace,
    install_worker_identity,
    service_account_name,
)
from tests.kube_fixtures import run_kube_api

NS = "llm-serving"


@pytest.fixture(scope="module")
def cluster():
    """(url, admin client, the worker's token)."""
    with run_kube_api() as url:
        config = client.Configuration()
        config.host = url
        with client.ApiClient(config) as admin:
            enable_serving_namespace(admin, NS)  # as `kubectl apply -k infra/k8s/serving-namespace`
            yield url, admin, install_worker_identity(admin)


@pytest.fixture(scope="module")
def worker(cluster):
    url, _, token = cluster
    config = client.Configuration()
    config.host = url
    config.api_key = {"BearerToken": token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    with client.ApiClient(config) as api:
        yield api


def worker_user() -> str:
    return f"system:serviceaccount:{WORKER_NAMESPACE}:{service_account_name()}"


def deployment(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "replicas": 0, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:1"}]}}}}


def test_worker_can_do_what_its_role_grants(worker):
    apps = client.AppsV1Api(worker)
    apps.create_namespaced_deployment(NS, deployment("chat"))
    assert apps.read_namespaced_deployment("chat", NS).metadata.name == "chat"
    apps.patch_namespaced_deployment_scale("chat", NS, {"spec": {"replicas": 0}})
    client.CoreV1Api(worker).list_pod_for_all_namespaces()
    client.CoreV1Api(worker).read_namespace(NS)


def test_a_call_outside_the_rbac_is_forbidden(worker, cluster):
    apps, core = client.AppsV1Api(worker), client.CoreV1Api(worker)
    with pytest.raises(ApiException) as err:
        apps.delete_namespaced_deployment("chat", NS)  # the role has no delete on deployments
    assert err.value.status == 403
    status = json.loads(err.value.body)
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        f'deployments.apps "chat" is forbidden: User "{worker_user()}" cannot delete resource "deployments" '
        f'in API group "apps" in the namespace "{NS}"')
    assert status["details"] == {"name": "chat", "group": "apps", "kind": "deployments"}
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map(NS)
    assert json.loads(err.value.body)["message"] == (
        f'configmaps is forbidden: User "{worker_user()}" cannot list resource "configmaps" in API group "" '
        f'in the namespace "{NS}"')
    with pytest.raises(ApiException) as err:
        core.delete_node("gpu-a")
    assert err.value.status == 403 and json.loads(err.value.body)["message"].endswith(
        'cannot delete resource "nodes" in API group "" at the cluster scope')
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_eviction("x", NS, {"metadata": {"name": "x"}})
    assert err.value.status == 404  # pods/eviction create is granted: the pod simply does not exist


def test_writes_only_in_a_namespace_the_operator_enabled(worker, cluster):
    """The ClusterRole reads across namespaces; creating, updating, scaling and evicting need the
    Role that infra/k8s/serving-namespace binds in the namespace."""
    _, admin, _ = cluster
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": "not-enabled"}})
    apps, core = client.AppsV1Api(worker), client.CoreV1Api(worker)
    for call in (lambda: apps.create_namespaced_deployment("not-enabled", deployment("chat")),
                 lambda: apps.read_namespaced_deployment("chat", "not-enabled"),
                 lambda: core.create_namespaced_pod_eviction("x", "not-enabled", {"metadata": {"name": "x"}})):
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403 and 'in the namespace "not-enabled"' in json.loads(err.value.body)["message"]
    apps.list_deployment_for_all_namespaces()
    core.list_pod_for_all_namespaces()
    assert core.read_namespace(NS).metadata.labels["tideplane.io/serving"] == "true"


def test_unknown_token_is_unauthorized(cluster):
    config = client.Configuration()
    config.host = cluster[0]
    config.api_key = {"authorization": "Bearer not-issued-here"}
    with client.ApiClient(config) as api, pytest.raises(ApiException) as err:
        client.CoreV1Api(api).list_namespace()
    assert err.value.status == 401


def test_roles_and_bindings_in_a_namespace(cluster, worker):
    """A RoleBinding grants its Role's rules in its own namespace only, resourceNames narrow them."""
    _, admin, _ = cluster
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.create_namespaced_role(NS, {"metadata": {"name": "profiles-reader"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["profiles"]}]})
    rbac.create_namespaced_role_binding(NS, {"metadata": {"name": "worker-profiles"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "profiles-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": service_account_name(), "namespace": WORKER_NAMESPACE}]})
    client.CoreV1Api(admin).create_namespaced_config_map(NS, {"metadata": {"name": "profiles"}})
    client.CoreV1Api(admin).create_namespaced_config_map(NS, {"metadata": {"name": "other"}})
    core = client.CoreV1Api(worker)
    assert core.read_namespaced_config_map("profiles", NS).metadata.name == "profiles"
    for call in (lambda: core.read_namespaced_config_map("other", NS), lambda: core.list_namespaced_config_map(NS),
                 lambda: core.read_namespaced_config_map("profiles", "default")):
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403


def test_self_subject_access_review(worker):
    authz = client.AuthorizationV1Api(worker)

    def can(verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
        review = authz.create_self_subject_access_review({"spec": {"resourceAttributes": {
            "verb": verb, "resource": resource, "group": group, "subresource": subresource, "namespace": NS}}})
        return review.status.allowed

    assert can("create", "deployments", "apps") and can("patch", "deployments", "apps", "scale")
    assert not can("delete", "deployments", "apps") and not can("get", "secrets")
    assert can("create", "pods", subresource="eviction") and not can("create", "pods")


def test_kubectl_auth_as_the_worker(cluster, tmp_path):
    """`kubectl auth whoami` and `auth can-i` (sent as protobuf) as the worker: the admin
    impersonates its ServiceAccount (kubectl sends a bearer token over TLS only)."""
    url = cluster[0]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_yaml(url))

    def kubectl(*args: str, user: str = worker_user()) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), f"--as={user}", *args],
                              capture_output=True, text=True, timeout=30,
                              env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})

    whoami = kubectl("auth", "whoami", "-o", "json")
    assert whoami.returncode == 0, whoami.stderr
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == worker_user()
    yes = kubectl("auth", "can-i", "patch", "deployments.apps", "--subresource=scale", "-n", NS)
    assert (yes.returncode, yes.stdout.strip()) == (0, "yes")
    no = kubectl("auth", "can-i", "delete", "deployments.apps", "-n", NS)
    assert (no.returncode, no.stdout.strip()) == (1, "no")
    denied = kubectl("get", "configmaps", "-n", NS)
    assert denied.returncode == 1
    assert (f'Error from server (Forbidden): configmaps is forbidden: User "{worker_user()}" cannot list resource '
            f'"configmaps" in API group "" in the namespace "{NS}"') in denied.stderr


def test_the_worker_may_not_impersonate(worker):
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(worker).list_namespace(_headers={"Impersonate-User": "system:admin"})
    assert err.value.status == 403
    assert json.loads(err.value.body)["message"] == (
        f'users "system:admin" is forbidden: User "{worker_user()}" cannot impersonate resource "users" '
        'in API group "" at the cluster scope')


def test_the_sandbox_worker_runs_as_its_service_account(sandbox):
    """The sandbox's worker kubeconfig (TIDEPLANE_KUBECONFIG) is the ServiceAccount's, bound to
    exactly infra/k8s/base's RBAC; the operator's (KUBECONFIG) is the admin."""
    assert sandbox.env["TIDEPLANE_KUBECONFIG"] != sandbox.env["KUBECONFIG"]
    with kube_config.new_client_from_config(config_file=sandbox.env["TIDEPLANE_KUBECONFIG"]) as api:
        review = client.AuthenticationV1Api(api).create_self_subject_review({})
        assert review.status.user_info.username == worker_user()
        client.CoreV1Api(api).list_node()
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(api).list_namespaced_config_map("tideplane-sandbox")
        assert err.value.status == 403
    with kube_config.new_client_from_config(config_file=sandbox.env["KUBECONFIG"]) as api:
        client.CoreV1Api(api).list_namespaced_config_map("tideplane-sandbox")
