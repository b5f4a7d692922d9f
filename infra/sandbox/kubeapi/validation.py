"""Defaulting and validation of incoming objects: what the real API server rejects with 422."""

from __future__ import annotations

import random
import re
from typing import Any

from .errors import ApiError, bad_request, invalid
from .quantity import parse_quantity
from .resources import Resource
from .selectors import label_selector_matcher
from .store import now_iso

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


Causes = list[tuple[str, str, str]]


def _required(causes: Causes, field: str, what: str = "Required value") -> None:
    causes.append((field, "FieldValueRequired", what))


def _bad(causes: Causes, field: str, value: Any, why: str) -> None:
    causes.append((field, "FieldValueInvalid", f"Invalid value: {value!r}: {why}"))


def _containers(causes: Causes, spec: Any, prefix: str) -> None:
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not containers:
        _required(causes, f"{prefix}.containers")
        return
    for n, c in enumerate(containers):
        if not isinstance(c, dict) or not c.get("name"):
            _required(causes, f"{prefix}.containers[{n}].name")
            continue
        if not c.get("image"):
            _required(causes, f"{prefix}.containers[{n}].image")
        for kind in ("requests", "limits"):
            _quantities(causes, (c.get("resources") or {}).get(kind), f"{prefix}.containers[{n}].resources.{kind}")


def _quantities(causes: Causes, values: Any, field: str) -> None:
    for key, value in (values or {}).items() if isinstance(values, dict) else []:
        try:
            if parse_quantity(value) < 0:
                raise ValueError
        except (ApiError, ValueError):
            _bad(causes, f"{field}[{key}]", value, "must be a non-negative quantity")


def _validate_kind(res: Resource, obj: dict[str, Any], causes: Causes) -> None:
    spec = obj.get("spec")
    if res.kind == "Pod":
        _containers(causes, spec or {}, "spec")
    elif res.kind == "Node":
        _node_status(causes, obj)

    elif res.kind == "Deployment":
        if not isinstance(spec, dict):
            _required(causes, "spec")
            return
        replicas = spec.get("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            _bad(causes, "spec.replicas", replicas, "must be greater than or equal to 0")
        selector = spec.get("selector")
        template = spec.get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
            _required(causes, "spec.selector")
        elif not label_selector_matcher(selector)(labels):
            _bad(causes, "spec.template.metadata.labels", labels, "`selector` does not match template `labels`")
        _containers(causes, template.get("spec") or {}, "spec.template.spec")


def _node_status(causes: Causes, obj: dict[str, Any]) -> None:
    for kind in ("allocatable", "capacity"):
        _quantities(causes, (obj.get("status") or {}).get(kind), f"status.{kind}")


def check_status(res: Resource, obj: dict[str, Any]) -> None:
    """Status writes skip object validation, but a node's resources must still be quantities."""
    causes: Causes = []
    if res.kind == "Node":
        _node_status(causes, obj)
    if causes:
        raise invalid(res.kind, obj["metadata"]["name"], causes, res.group)


def prepare(res: Resource, obj: Any, creating: bool) -> dict[str, Any]:
    """Check an incoming object (422 Invalid naming the fields) and fill in the server's defaults."""
    if not isinstance(obj, dict):
        raise bad_request(f"the body of the request must be a JSON object for {res.kind}")
    causes: Causes = []
    if obj.get("kind") not in (None, res.kind):
        _bad(causes, "kind", obj["kind"], f"must be {res.kind}")
    if obj.get("apiVersion") not in (None, res.api_version):
        _bad(causes, "apiVersion", obj["apiVersion"], f"must be {res.api_version}")
    obj["kind"], obj["apiVersion"] = res.kind, res.api_version
    meta = obj.get("metadata")
    if meta is None:
        meta = obj["metadata"] = {}
    if not isinstance(meta, dict):
        raise invalid(res.kind, None, [("metadata", "FieldValueInvalid", "must be an object")], res.group)
    if creating and not meta.get("name") and meta.get("generateName"):
        meta["name"] = f"{meta['generateName']}{random_suffix()}"
    name = meta.get("name")
    if not name:
        _required(causes, "metadata.name", "name or generateName is required")
    elif not isinstance(name, str) or len(name) > 253 or not _NAME.match(name):
        _bad(causes, "metadata.name", name, "a lowercase RFC 1123 subdomain must consist of lower case "
             "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")
    for field in ("labels", "annotations"):
        values = meta.get(field)
        if values is not None and (not isinstance(values, dict)
                                   or not all(isinstance(v, str) for v in values.values())):
            _bad(causes, f"metadata.{field}", values, "must be a map of strings")
    _validate_kind(res, obj, causes)
    if causes:
        raise invalid(res.kind, name if isinstance(name, str) else None, causes, res.group)
    if not res.namespaced:
        meta.pop("namespace", None)
    _default(res, obj)
    return obj


def _default(res: Resource, obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if res.kind == "Pod":
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        for c in spec["containers"]:
            c.setdefault("imagePullPolicy", "IfNotPresent")
    elif res.kind == "Deployment":
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxSurge", "25%")
            rolling.setdefault("maxUnavailable", "25%")
    elif res.kind == "Service":
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec["type"] != "ExternalName" and not spec.get("clusterIP"):
            spec["clusterIP"] = f"10.96.{random.randint(0, 255)}.{random.randint(1, 254)}"
            spec["clusterIPs"] = [spec["clusterIP"]]
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
    elif res.kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
    elif res.kind == "Node":
        status = obj.setdefault("status", {})
        if status.get("allocatable") and not status.get("capacity"):
            status["capacity"] = dict(status["allocatable"])
        if status.get("capacity") and not status.get("allocatable"):
            status["allocatable"] = dict(status["capacity"])


def reset_status_on_create(res: Resource, obj: dict[str, Any]) -> None:
    """The server owns status: new pods start Pending, new deployments with an empty status."""
    if res.kind == "Pod":
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif res.kind == "Deployment":
        obj["status"] = {}
    elif res.kind == "Node":
        status = obj["status"]
        if not status.get("conditions"):
            ts = now_iso()
            status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                     "message": "kubelet is posting ready status",
                                     "lastHeartbeatTime": ts, "lastTransitionTime": ts}]
        name = obj["metadata"]["name"]
        info = {"machineID": name, "systemUUID": name, "bootID": name, "kernelVersion": "6.1.0",
                "osImage": "Amazon Linux 2023", "containerRuntimeVersion": "containerd://1.7.0",
                "kubeletVersion": "v1.32.0-tideplane-sandbox", "kubeProxyVersion": "v1.32.0-tideplane-sandbox",
                "operatingSystem": "linux", "architecture": "amd64"}
        status["nodeInfo"] = {**info, **(status.get("nodeInfo") or {})}


def check_replicas(value: Any, kind: str, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid(kind, name, [("spec.replicas", "FieldValueInvalid",
                                    f"Invalid value: {value!r}: must be greater than or equal to 0")])
    return value
