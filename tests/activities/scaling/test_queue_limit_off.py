"""clear_queue_limit against the Kubernetes emulator: a queue limit turned off leaves the route's
BackendTrafficPolicy with only what others wrote there (the token quotas, anyone's annotation; the
emulator prunes spec fields its trimmed CRD lacks, so a stranger's spec field is a unit test), and
the object goes once nothing but its target is left. Run twice, it changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client
from temporalio.testing import ActivityEnvironment

from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.scaling.scaling_activities import RETRY_AFTER_ANNOTATION, ScalingActivities, queue_limit_policy
from activities.core.traffic_policy import POLICY_API, POLICY_PLURAL, apply_traffic_policy
from tests.activities.conftest import NOWHERE
from workflows.core.naming import DeploymentRef, traffic_policy_name
from workflows.quotas.policy import MONTHLY_QUOTAS_ANNOTATION, QuotaFile, quota_policy
from workflows.scaling.contract import ClearQueueLimitInput, QueueLimitInput
from workflows.scaling.queue_limit import QueueLimit
from workflows.core.traffic_policy import QUOTA_FIELDS

NS = "llm-serving"
CHAT = DeploymentRef(namespace=NS, name="chat")
LIMIT = QueueLimitInput(deployment=CHAT, limit=QueueLimit(max_pending_requests=7, retry_after_seconds=2))
QUOTAS = QuotaFile(namespace=NS, route="chat", tenants=[{"name": "acme", "tokens_per_minute": 100, "monthly_tokens": 10_000}])
ENVOY_GATEWAY_CRDS = Path(__file__).parents[3] / "infra" / "k8s" / "envoy-gateway" / "crds.yaml"


@pytest.fixture
def cluster(kube_api):
    """The emulator serving Envoy Gateway's CRDs, with the serving namespace."""
    for crd in yaml.safe_load_all(ENVOY_GATEWAY_CRDS.read_text()):
        client.ApiextensionsV1Api(kube_api).create_custom_resource_definition(crd)
    client.CoreV1Api(kube_api).create_namespace({"metadata": {"name": NS}})
    return kube_api


def policies(api: client.ApiClient) -> dict[str, dict]:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(*POLICY_API, NS, POLICY_PLURAL)["items"]
    return {p["metadata"]["name"]: p for p in items}


def test_turned_off_the_limit_leaves_the_quotas_and_anyone_elses_fields(cluster):
    kube = KubeClient(cluster)
    scaling = ScalingActivities(kube, PrometheusClient(NOWHERE))
    run = ActivityEnvironment().run
    run(scaling.set_queue_limit, LIMIT)
    apply_traffic_policy(kube, quota_policy(QUOTAS, {}), QUOTA_FIELDS)
    custom, name = client.CustomObjectsApi(cluster), traffic_policy_name("chat")
    custom.patch_namespaced_custom_object(*POLICY_API, NS, POLICY_PLURAL, name, {"metadata": {"annotations": {"example.com/team": "serving"}}})
    before = policies(cluster)[name]
    assert before["spec"]["circuitBreaker"] == {"maxPendingRequests": 7}

    assert run(scaling.clear_queue_limit, ClearQueueLimitInput(deployment=CHAT)) == "updated"
    after = policies(cluster)[name]
    assert set(after["spec"]) == {"targetRefs", "rateLimit"} and after["spec"]["rateLimit"] == before["spec"]["rateLimit"]
    assert set(before["metadata"]["annotations"]) - set(after["metadata"]["annotations"]) == {RETRY_AFTER_ANNOTATION}
    assert after["metadata"]["annotations"]["example.com/team"] == "serving"
    assert after["metadata"]["annotations"][MONTHLY_QUOTAS_ANNOTATION] == before["metadata"]["annotations"][MONTHLY_QUOTAS_ANNOTATION]
    assert run(scaling.clear_queue_limit, ClearQueueLimitInput(deployment=CHAT)) == "unchanged"
    assert policies(cluster)[name]["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]


def test_a_policy_left_with_only_its_target_is_deleted_with_the_old_named_one(cluster):
    kube = KubeClient(cluster)
    scaling = ScalingActivities(kube, PrometheusClient(NOWHERE))
    run = ActivityEnvironment().run
    run(scaling.set_queue_limit, LIMIT)
    old = queue_limit_policy(CHAT, LIMIT.limit)  # a worker of before wrote it under its own name after ours
    old["metadata"]["name"] = "chat-queue-limit"
    client.CustomObjectsApi(cluster).create_namespaced_custom_object(*POLICY_API, NS, POLICY_PLURAL, old)
    assert set(policies(cluster)) == {traffic_policy_name("chat"), "chat-queue-limit"}

    assert run(scaling.clear_queue_limit, ClearQueueLimitInput(deployment=CHAT)) == "deleted"
    assert policies(cluster) == {}  # the old one too: the quotas writer would have adopted its fields back
    assert run(scaling.clear_queue_limit, ClearQueueLimitInput(deployment=CHAT)) == "unchanged"
