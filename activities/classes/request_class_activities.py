"""Kubernetes side of request classes: the gateway objects that send each class to its pool.

Whether the Gateway API Inference Extension is installed is read from discovery (its API groups
served at the versions we write), as kubectl would: no RBAC needed, no guess from a failed write.
"""

from __future__ import annotations

from typing import Any, Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities.clients.kube import API_TIMEOUT, KubeClient, apply_service, fail, gateway_parent_ref, read_or_none
from workflows.classes import contract
from workflows.classes.contract import AppliedClasses
from workflows.classes.manifests import (
    Mode,
    RequestClassesInput,
    class_route,
    inference_objective,
    inference_pool,
    pool_service,
)


# (group, version) literals here, not imported: the RBAC scanner (tests/unit/worker/test_k8s_manifests.py) reads them.
POOL_API = ("inference.networking.k8s.io", "v1")
OBJECTIVE_API = ("inference.networking.x-k8s.io", "v1alpha2")
ROUTE_API = ("gateway.networking.k8s.io", "v1")


class RequestClassActivities(contract.RequestClassActivities):
    def __init__(self, kube: KubeClient, gateway: str) -> None:
        self.kube = kube
        self.gateway = gateway  # "NAMESPACE/NAME" or "NAME" (then in the route's namespace)

    def _mode(self) -> Mode:
        served = {(g.name, v.version) for g in client.ApisApi(self.kube.api).get_api_versions(_request_timeout=API_TIMEOUT).groups
                  for v in g.versions}
        wanted = {POOL_API, OBJECTIVE_API}
        return "inference-extension" if wanted <= served else "httproute"

    def _custom(self, kind: str, ns: str, name: str) -> tuple[Callable, Callable, Callable]:
        """(read, create, replace) of one kind's object; every call names its group and plural in
        place (tests/unit/worker/test_k8s_manifests.py checks the Role grants exactly these)."""
        c, timeout = self.kube.custom, API_TIMEOUT
        return {
            "InferencePool": (
                lambda: read_or_none(c.get_namespaced_custom_object, *POOL_API, ns, "inferencepools", name),
                lambda body: c.create_namespaced_custom_object(*POOL_API, ns, "inferencepools", body, _request_timeout=timeout),
                lambda body: c.replace_namespaced_custom_object(*POOL_API, ns, "inferencepools", name, body, _request_timeout=timeout),
            ),
            "InferenceObjective": (
                lambda: read_or_none(c.get_namespaced_custom_object, *OBJECTIVE_API, ns, "inferenceobjectives", name),
                lambda body: c.create_namespaced_custom_object(*OBJECTIVE_API, ns, "inferenceobjectives", body, _request_timeout=timeout),
                lambda body: c.replace_namespaced_custom_object(*OBJECTIVE_API, ns, "inferenceobjectives", name, body,
                                                                _request_timeout=timeout),
            ),
            "HTTPRoute": (
                lambda: read_or_none(c.get_namespaced_custom_object, *ROUTE_API, ns, "httproutes", name),
                lambda body: c.create_namespaced_custom_object(*ROUTE_API, ns, "httproutes", body, _request_timeout=timeout),
                lambda body: c.replace_namespaced_custom_object(*ROUTE_API, ns, "httproutes", name, body, _request_timeout=timeout),
            ),
        }[kind]

    def _apply_custom(self, body: dict[str, Any]) -> bool:
        """Create, or replace when spec or labels differ; True when something was written."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        read, create, replace = self._custom(body["kind"], ns, name)
        try:
            have = read()
            if have is None:
                create(body)
                return True
            labels = have["metadata"].get("labels") or {}
            if have.get("spec") == body["spec"] and labels.items() >= body["metadata"]["labels"].items():
                return False
            replace({**have, "spec": body["spec"], "metadata": {**have["metadata"], "labels": {**labels, **body["metadata"]["labels"]}}})
            return True
        except ApiException as exc:
            fail(exc, f"{body['kind']} {ns}/{name}")

    @activity.defn(name=contract.APPLY_REQUEST_CLASSES)
    def apply_request_classes(self, req: RequestClassesInput) -> AppliedClasses:
        self.kube.require_namespace(req.namespace)
        mode = self._mode()
        writes: list[tuple[str, bool]] = []
        for cls in req.classes:
            if mode == "inference-extension":
                for body in (inference_pool(req, cls), inference_objective(req, cls)):
                    writes.append((f"{body['kind']}/{body['metadata']['name']}", self._apply_custom(body)))
            else:
                body = pool_service(req, cls)
                writes.append((f"Service/{body['metadata']['name']}", apply_service(self.kube.core, body)))
        route = class_route(req, mode, gateway_parent_ref(self.gateway, req.namespace))
        writes.append((f"HTTPRoute/{req.route}", self._apply_custom(route)))
        return AppliedClasses(mode=mode, objects=[name for name, _ in writes], changed=[name for name, changed in writes if changed])
