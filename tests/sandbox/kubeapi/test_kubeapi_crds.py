"""CustomResourceDefinitions: the Gateway API Inference Extension's kinds exist only once their CRDs
are applied, and their objects are defaulted, pruned and validated as the apiextensions server does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.kube_fixtures import emulated_cluster, namespace_for

CRDS = Path(__file__).resolve().parents[3] / "infra" / "k8s" / "inference-extension" / "crds.yaml"
POOLS = ("inference.networking.k8s.io", "v1")
OBJECTIVES = ("inference.networking.x-k8s.io", "v1alpha2")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with emulated_cluster(tmp_path_factory.mktemp("crds")) as c:
        yield c


def pool(name: str, **spec) -> dict:
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "targetPorts": [{"number": 8000}],
                     "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}}, **spec}}


def test_kinds_are_served_while_their_crd_exists(cluster, request):
    ns = namespace_for(cluster.api, request)
    custom = client.CustomObjectsApi(cluster.api)
    with pytest.raises(ApiException) as err:
        custom.list_namespaced_custom_object(*POOLS, ns, "inferencepools")
    assert err.value.status == 404

    applied = cluster.kubectl("apply", "-f", str(CRDS))
    assert applied.returncode == 0, applied.stderr
    crd = client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition("inferencepools.inference.networking.k8s.io")
    assert {c.type: c.status for c in crd.status.conditions} == {"NamesAccepted": "True", "Established": "True"}
    resources = cluster.kubectl("api-resources", "--api-group=inference.networking.k8s.io", "-o", "name")
    assert resources.stdout.split() == ["inferencepools.inference.networking.k8s.io"]

    created = custom.create_namespaced_custom_object(*POOLS, ns, "inferencepools", {**pool("chat"), "extra": 1})
    assert "extra" not in created, "fields the structural schema does not declare are pruned"
    assert created["spec"]["endpointPickerRef"]["failureMode"] == "FailClose", "schema defaults are applied"
    assert json.loads(cluster.kubectl("get", "infpool", "chat", "-n", ns, "-o", "json").stdout)["spec"]["selector"] == {
        "matchLabels": {"app": "chat"}}

    deleted = cluster.kubectl("delete", "-f", str(CRDS))
    assert deleted.returncode == 0, deleted.stderr
    with pytest.raises(ApiException) as err:
        custom.get_namespaced_custom_object(*POOLS, ns, "inferencepools", "chat")
    assert err.value.status == 404
    assert cluster.kubectl("apply", "-f", str(CRDS)).returncode == 0
    assert custom.list_namespaced_custom_object(*POOLS, ns, "inferencepools")["items"] == [], \
        "a deleted CRD took its objects with it"


def test_required_fields_and_ranges_are_refused_with_the_validators_messages(cluster, request):
    ns = namespace_for(cluster.api, request)
    assert cluster.kubectl("apply", "-f", str(CRDS)).returncode == 0
    custom = client.CustomObjectsApi(cluster.api)
    bad = pool("chat", targetPorts=[{"number": 70000}] * 9)
    del bad["spec"]["endpointPickerRef"]
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(*POOLS, ns, "inferencepools", bad)
    status = json.loads(err.value.body)
    assert err.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith('InferencePool.inference.networking.k8s.io "chat" is invalid: [')
    causes = {(c["field"], c["message"]) for c in status["details"]["causes"]}
    assert ("spec.endpointPickerRef", "Required value") in causes
    assert ("spec.targetPorts", "Too many: 9: must have at most 8 items") in causes
    assert ("spec.targetPorts[0].number",
            "Invalid value: 70000: spec.targetPorts[0].number in body should be less than or equal to 65535") in causes

    objective = {"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
                 "metadata": {"name": "batch"}, "spec": {"priority": "high", "poolRef": {}}}
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object(*OBJECTIVES, ns, "inferenceobjectives", objective)
    causes = {(c["field"], c["message"]) for c in json.loads(err.value.body)["details"]["causes"]}
    assert causes == {("spec.poolRef.name", "Required value"),
                      ("spec.priority", 'Invalid value: "high": spec.priority in body must be of type integer: "string"')}


def test_a_crd_is_checked_before_it_is_served(cluster):
    crd = next(yaml.safe_load_all(CRDS.read_text()))
    crd["metadata"]["name"] = "pools.inference.networking.k8s.io"
    crd["spec"]["versions"][0]["storage"] = False
    with pytest.raises(ApiException) as err:
        client.ApiextensionsV1Api(cluster.api).create_custom_resource_definition(crd)
    causes = {(c["field"], c["message"]) for c in json.loads(err.value.body)["details"]["causes"]}
    assert ("metadata.name", 'Invalid value: "pools.inference.networking.k8s.io": must be spec.names.plural+"."+spec.group') in causes
    assert any(field == "spec.versions" and "exactly one version marked as storage version" in message
               for field, message in causes)
