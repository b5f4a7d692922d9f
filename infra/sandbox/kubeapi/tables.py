"""meta.k8s.io/v1 Table rendering, so `kubectl get` prints the familiar columns."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from .resources import Resource

Row = Callable[[dict[str, Any]], list[Any]]


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def age(obj: dict[str, Any]) -> str:
    """kubectl's short human duration since creation (e.g. 45s, 3m20s, 5h, 2d)."""
    created = obj["metadata"].get("creationTimestamp")
    if not created:
        return "<unknown>"
    seconds = max(0, int((datetime.now(timezone.utc)
                          - datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def _node_status(node: dict[str, Any]) -> str:
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    text = "Ready" if ready and ready.get("status") == "True" else "NotReady"
    return text + (",SchedulingDisabled" if (node.get("spec") or {}).get("unschedulable") else "")


def _roles(node: dict[str, Any]) -> str:
    roles = [k.split("/", 1)[1] for k in (node["metadata"].get("labels") or {}) if k.startswith("node-role.kubernetes.io/")]
    return ",".join(sorted(roles)) or "<none>"


def _pod_status(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            return waiting["reason"]
    return status.get("reason") or status.get("phase") or "Unknown"


def _pod_ready(pod: dict[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return f"{sum(1 for c in statuses if c.get('ready'))}/{len(pod['spec'].get('containers') or [])}"


def _ports(svc: dict[str, Any]) -> str:
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in (svc.get("spec") or {}).get("ports") or []) or "<none>"


def _col(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> dict[str, Any]:
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}


NAME = _col("Name", fmt="name")
AGE = _col("Age")

COLUMNS: dict[str, tuple[list[dict[str, Any]], Row]] = {
    "Node": ([NAME, _col("Status"), _col("Roles"), AGE, _col("Version"), _col("Instance-Type", priority=1),
              _col("Capacity-Type", priority=1), _col("Zone", priority=1), _col("GPU", priority=1)],
             lambda o: [o["metadata"]["name"], _node_status(o), _roles(o), age(o),
                        ((o.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", ""),
                        (o["metadata"].get("labels") or {}).get("node.kubernetes.io/instance-type", ""),
                        (o["metadata"].get("labels") or {}).get("karpenter.sh/capacity-type", ""),
                        (o["metadata"].get("labels") or {}).get("topology.kubernetes.io/zone", ""),
                        ((o.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")]),
    "Pod": ([NAME, _col("Ready"), _col("Status"), _col("Restarts", "string"), AGE, _col("IP", priority=1),
             _col("Node", priority=1)],
            lambda o: [o["metadata"]["name"], _pod_ready(o), _pod_status(o),
                       str(sum(c.get("restartCount", 0) for c in (o.get("status") or {}).get("containerStatuses") or [])),
                       age(o), (o.get("status") or {}).get("podIP", "<none>"), o["spec"].get("nodeName", "<none>")]),
    "Deployment": ([NAME, _col("Ready"), _col("Up-to-date", "integer"), _col("Available", "integer"), AGE,
                    _col("Containers", priority=1), _col("Images", priority=1)],
                   lambda o: [o["metadata"]["name"],
                              f"{(o.get('status') or {}).get('readyReplicas', 0)}/{o['spec'].get('replicas', 1)}",
                              (o.get("status") or {}).get("updatedReplicas", 0),
                              (o.get("status") or {}).get("availableReplicas", 0), age(o),
                              ",".join(c["name"] for c in o["spec"]["template"]["spec"]["containers"]),
                              ",".join(c["image"] for c in o["spec"]["template"]["spec"]["containers"])]),
    "ReplicaSet": ([NAME, _col("Desired", "integer"), _col("Current", "integer"), _col("Ready", "integer"), AGE,
                    _col("Containers", priority=1), _col("Images", priority=1)],
                   lambda o: [o["metadata"]["name"], o["spec"].get("replicas", 1),
                              (o.get("status") or {}).get("replicas", 0),
                              (o.get("status") or {}).get("readyReplicas", 0), age(o),
                              ",".join(c["name"] for c in o["spec"]["template"]["spec"]["containers"]),
                              ",".join(c["image"] for c in o["spec"]["template"]["spec"]["containers"])]),
    "Service": ([NAME, _col("Type"), _col("Cluster-IP"), _col("External-IP"), _col("Port(s)"), AGE],
                lambda o: [o["metadata"]["name"], o["spec"].get("type", "ClusterIP"), o["spec"].get("clusterIP", "None"),
                           "<none>", _ports(o), age(o)]),
    "Namespace": ([NAME, _col("Status"), AGE],
                  lambda o: [o["metadata"]["name"], (o.get("status") or {}).get("phase", "Active"), age(o)]),
    "ConfigMap": ([NAME, _col("Data", "integer"), AGE],
                  lambda o: [o["metadata"]["name"], len(o.get("data") or {}), age(o)]),
    "Secret": ([NAME, _col("Type"), _col("Data", "integer"), AGE],
               lambda o: [o["metadata"]["name"], o.get("type", "Opaque"), len(o.get("data") or {}), age(o)]),
    "Event": ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message"), NAME],
              lambda o: [age(o), o.get("type", ""), o.get("reason", ""),
                         f"{(o.get('involvedObject') or {}).get('kind', '').lower()}/{(o.get('involvedObject') or {}).get('name', '')}",
                         o.get("message", ""), o["metadata"]["name"]]),
    "Lease": ([NAME, _col("Holder"), AGE],
              lambda o: [o["metadata"]["name"], (o.get("spec") or {}).get("holderIdentity", ""), age(o)]),
    "HTTPRoute": ([NAME, _col("Hostnames"), _col("Backends"), AGE],
                  lambda o: [o["metadata"]["name"], ",".join((o.get("spec") or {}).get("hostnames") or []) or "<none>",
                             ",".join(f"{b.get('name')}:{b.get('weight', 1)}" for r in (o.get("spec") or {}).get("rules") or []
                                      for b in r.get("backendRefs") or []) or "<none>", age(o)]),
}


def _partial(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def table(res: Resource, objects: list[dict[str, Any]], metadata: dict[str, Any], include: str | None) -> dict[str, Any]:
    columns, row = COLUMNS.get(res.kind, ([NAME, AGE], lambda o: [o["metadata"]["name"], age(o)]))
    embed = (lambda o: o) if include == "Object" else (lambda o: None) if include == "None" else _partial
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": columns,
        "rows": [{"cells": row(o), "object": embed(o)} for o in objects],
    }
