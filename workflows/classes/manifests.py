"""The gateway objects of request classes, built from plain values (pure; unit-tested).

With the Gateway API Inference Extension installed, each class's pool is an ``InferencePool``
(``inference.networking.k8s.io/v1``: its endpoint picker routes to the replica with the least queue)
and each class an ``InferenceObjective`` (``inference.networking.x-k8s.io/v1alpha2``) whose
``priority`` orders the classes when a pool is short of capacity. Without it, each pool is a Service
over all the deployment's versions. Either way one HTTPRoute sends a request to its class's pool by
the class header (``x-request-class: batch``), and requests without one to the default class.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from workflows.core.naming import LABEL_APP, LABEL_MANAGED_BY, MANAGED_BY
from workflows.core.routes import inference_matches

POOL_GROUP = "inference.networking.k8s.io"
POOL_API_VERSION = f"{POOL_GROUP}/v1"
OBJECTIVE_API_VERSION = "inference.networking.x-k8s.io/v1alpha2"
ROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
CLASS_HEADER = "x-request-class"
Mode = Literal["inference-extension", "httproute"]


class RequestClass(BaseModel):
    name: Literal["realtime", "batch"]
    deployment: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=50,
                            description="NAME of the logical deployment (in the route's namespace) that is this class's pool")
    priority: int = Field(description="higher is served first when the pool is short of capacity (InferenceObjective)")


class RequestClassesInput(BaseModel):
    namespace: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    route: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63,
                       description="the HTTPRoute clients reach the classes through")
    classes: list[RequestClass] = Field(min_length=1, max_length=2)
    default_class: Literal["realtime", "batch"] = Field("realtime", description="where requests without the class header go")
    port: int = Field(8000, ge=1, le=65535, description="the model servers' port")
    endpoint_picker_port: int = Field(9002, ge=1, le=65535, description="the endpoint picker's gRPC port (ext-proc)")

    @model_validator(mode="after")
    def _consistent(self) -> RequestClassesInput:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: each class once, got {names}")
        if self.default_class not in names:
            raise ValueError(f"default_class {self.default_class!r} is not one of the classes {names}")
        return self


def pool_name(deployment: str) -> str:
    """The InferencePool (or fallback Service) of a class's deployment."""
    return f"{deployment}-pool"


def _labels(route: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, "tideplane.io/request-classes": route}


def inference_pool(req: RequestClassesInput, cls: RequestClass) -> dict:
    name = pool_name(cls.deployment)
    return {
        "apiVersion": POOL_API_VERSION, "kind": "InferencePool",
        "metadata": {"name": name, "namespace": req.namespace, "labels": _labels(req.route)},
        "spec": {"selector": {"matchLabels": {LABEL_APP: cls.deployment}}, "targetPorts": [{"number": req.port}],
                 # every field the CRD defaults, written out: what the server stores compares equal on the next apply
                 "endpointPickerRef": {"group": "", "kind": "Service", "name": f"{name}-epp",
                                       "port": {"number": req.endpoint_picker_port}, "failureMode": "FailClose"}},
    }


def inference_objective(req: RequestClassesInput, cls: RequestClass) -> dict:
    return {
        "apiVersion": OBJECTIVE_API_VERSION, "kind": "InferenceObjective",
        "metadata": {"name": f"{req.route}-{cls.name}", "namespace": req.namespace, "labels": _labels(req.route)},
        "spec": {"priority": cls.priority, "poolRef": {"group": POOL_GROUP, "kind": "InferencePool", "name": pool_name(cls.deployment)}},
    }


def pool_service(req: RequestClassesInput, cls: RequestClass) -> dict:
    """Without the extension: a Service over every version of the class's deployment."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": pool_name(cls.deployment), "namespace": req.namespace, "labels": _labels(req.route)},
        "spec": {"selector": {LABEL_APP: cls.deployment},
                 "ports": [{"name": "http", "port": req.port, "targetPort": "http", "protocol": "TCP"}]},
    }


def class_route(req: RequestClassesInput, mode: Mode, parent_ref: dict) -> dict:
    """One rule per class on the class header, then the default class for requests without it."""

    def backend(cls: RequestClass) -> dict:
        if mode == "inference-extension":
            return {"group": POOL_GROUP, "kind": "InferencePool", "name": pool_name(cls.deployment), "port": req.port}
        return {"kind": "Service", "name": pool_name(cls.deployment), "port": req.port}

    rules = [{"matches": inference_matches([{"type": "Exact", "name": CLASS_HEADER, "value": c.name}]),
              "backendRefs": [backend(c)]} for c in req.classes]
    default = next(c for c in req.classes if c.name == req.default_class)
    rules.append({"matches": inference_matches(), "backendRefs": [backend(default)]})  # inference paths only
    return {
        "apiVersion": ROUTE_API_VERSION, "kind": "HTTPRoute",
        "metadata": {"name": req.route, "namespace": req.namespace, "labels": _labels(req.route)},
        "spec": {"parentRefs": [parent_ref], "rules": rules},
    }
