"""Kubernetes side of request classes: the gateway objects that send each class to its pool.

Whether the Gateway API Inference Extension is installed is read from discovery (its API groups
served at the versions we write), as kubectl would: no RBAC needed, no guess from a failed write.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities.clients.kube import API_TIMEOUT, KubeClient, fail, gateway_parent_ref, read_or_none
from workflows.classes import activities as contract
from workflows.classes.activities import AppliedClasses
from workflows.classes.manifests import (
    OBJECTIVE_API,
    POOL_API,
    ROUTE_API,
    Mode,
    RequestClassesInput,
    class_route,
    inference_objective,
    inference_pool,
    pool_service,
)


class RequestClassActivities(contract.RequestClassActivities):
    def __init__(self, kube: KubeClient, gateway: str) -> None:
        self.kube = kube
        self.gateway = gateway  # "NAMESPACE/NAME" or "NAME" (then in the route's namespace)

    def _mode(self) -> Mode:
        served = {(g.name, v.version) for g in client.ApisApi(self.kube.api).get_api_versions(_request_timeout=API_TIMEOUT).groups
                  for v in g.versions}
        wanted = {POOL_API[:2], OBJECTIVE_API[:2]}
        return "inference-extension" if wanted <= served else "httproute"

    def _apply_custom(self, api: tuple[str, str, str], body: dict[str, Any]) -> bool:
        """Create, or replace when spec or labels differ; True when something was written."""
        group, version, plural = api
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        what = f"{body['kind']} {ns}/{name}"
        try:
            have = read_or_none(self.kube.custom.get_namespaced_custom_object, group, version, ns, plural, name)
            if have is None:
                self.kube.custom.create_namespaced_custom_object(group, version, ns, plural, body, _request_timeout=API_TIMEOUT)
                return True
            labels = have["metadata"].get("labels") or {}
            if have.get("spec") == body["spec"] and labels.items() >= body["metadata"]["labels"].items():
                return False
            new = {**have, "spec": body["spec"], "metadata": {**have["metadata"], "labels": {**labels, **body["metadata"]["labels"]}}}
            self.kube.custom.replace_namespaced_custom_object(group, version, ns, plural, name, new, _request_timeout=API_TIMEOUT)
            return True
        except ApiException as exc:
            fail(exc, what)

    def _apply_service(self, body: dict[str, Any]) -> bool:
        core, ns, name = self.kube.core, body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            have = read_or_none(core.read_namespaced_service, name, ns)
            if have is None:
                core.create_namespaced_service(ns, body, _request_timeout=API_TIMEOUT)
                return True
            if have.spec.selector == body["spec"]["selector"] and [p.port for p in have.spec.ports or []] == [
                    p["port"] for p in body["spec"]["ports"]]:
                return False
            core.patch_namespaced_service(name, ns, body, _request_timeout=API_TIMEOUT)
            return True
        except ApiException as exc:
            fail(exc, f"Service {ns}/{name}")

    @activity.defn(name=contract.APPLY_REQUEST_CLASSES)
    def apply_request_classes(self, req: RequestClassesInput) -> AppliedClasses:
        self.kube.require_namespace(req.namespace)
        mode = self._mode()
        writes: list[tuple[str, bool]] = []
        for cls in req.classes:
            if mode == "inference-extension":
                for api, body in ((POOL_API, inference_pool(req, cls)), (OBJECTIVE_API, inference_objective(req, cls))):
                    writes.append((f"{body['kind']}/{body['metadata']['name']}", self._apply_custom(api, body)))
            else:
                body = pool_service(req, cls)
                writes.append((f"Service/{body['metadata']['name']}", self._apply_service(body)))
        route = class_route(req, mode, gateway_parent_ref(self.gateway, req.namespace))
        writes.append((f"HTTPRoute/{req.route}", self._apply_custom(ROUTE_API, route)))
        return AppliedClasses(mode=mode, objects=[name for name, _ in writes], changed=[name for name, changed in writes if changed])
