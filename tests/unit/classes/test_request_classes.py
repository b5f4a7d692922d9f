"""Request classes: the gateway objects tideplane writes, and how the sandbox gateway routes them."""

import pytest
from pydantic import ValidationError

from infra.fleetmodel.fleet import least_queue
from infra.sandbox.gateway import backend_for, is_pool
from workflows.classes.manifests import RequestClassesInput, class_route, inference_objective, inference_pool

CLASSES = RequestClassesInput(namespace="llm-serving", route="chat-classes", classes=[
    {"name": "realtime", "deployment": "chat", "priority": 10}, {"name": "batch", "deployment": "chat-batch", "priority": 0}])
GATEWAY = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"}


def test_pool_and_objective_per_class():
    pool = inference_pool(CLASSES, CLASSES.classes[1])
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "chat-batch"}}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    objective = inference_objective(CLASSES, CLASSES.classes[0])
    assert objective["apiVersion"] == "inference.networking.x-k8s.io/v1alpha2"
    assert objective["spec"] == {"priority": 10, "poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                                             "name": "chat-pool"}}


@pytest.mark.parametrize("mode", ["inference-extension", "httproute"])
def test_the_route_sends_each_class_to_its_pool_and_the_rest_to_the_default(mode):
    route = class_route(CLASSES, mode, GATEWAY)
    batch = backend_for(route, {"X-Request-Class": "batch"})
    assert batch["name"] == "chat-batch-pool" and is_pool(batch) == (mode == "inference-extension")
    assert backend_for(route, {"x-request-class": "realtime"})["name"] == "chat-pool"
    assert backend_for(route, {})["name"] == "chat-pool"
    assert backend_for(route, {"x-request-class": "bulk"})["name"] == "chat-pool"


def test_a_header_match_wins_over_an_earlier_catch_all_rule():
    route = {"spec": {"rules": [{"backendRefs": [{"name": "all"}]},
                                {"matches": [{"headers": [{"name": "x-request-class", "value": "batch"}]}],
                                 "backendRefs": [{"name": "batch"}]}]}}
    assert backend_for(route, {"x-request-class": "batch"})["name"] == "batch"
    assert backend_for(route, {})["name"] == "all"


def test_least_queue_depth():
    assert least_queue({("ns", "a"): 3, ("ns", "b"): 1, ("ns", "c"): 1}) == ("ns", "b")
    assert least_queue({}) is None


def test_bad_class_configuration_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="default_class 'realtime' is not one of the classes"):
        RequestClassesInput(namespace="n", route="r", classes=[{"name": "batch", "deployment": "b", "priority": 0}])
    with pytest.raises(ValidationError, match="each class once"):
        RequestClassesInput(namespace="n", route="r", classes=[{"name": "realtime", "deployment": "a", "priority": 0}] * 2)
