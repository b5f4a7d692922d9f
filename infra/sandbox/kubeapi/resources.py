"""The API resources the emulator serves, and their discovery documents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
SUB_VERBS = ["get", "patch", "update"]


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = tuple(ALL_VERBS)  # ("create",): a review, answered and never stored

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def custom(self) -> bool:
        """Served from a CustomResourceDefinition on a real cluster (no strategic merge, schema validation)."""
        return self.group in CUSTOM_GROUPS

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


GATEWAY = "gateway.networking.k8s.io"
CUSTOM_GROUPS = {GATEWAY}  # grows with the groups of applied CRDs (crds.py)
RBAC = "rbac.authorization.k8s.io"

RESOURCES = [
    Resource("", "v1", "namespaces", "Namespace", False, ("ns",), ("status",)),
    Resource("", "v1", "nodes", "Node", False, ("no",), ("status",)),
    Resource("", "v1", "pods", "Pod", True, ("po",), ("status", "eviction", "log"), ("all",)),
    Resource("", "v1", "services", "Service", True, ("svc",), ("status",), ("all",)),
    Resource("", "v1", "events", "Event", True, ("ev",)),
    Resource("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    Resource("", "v1", "secrets", "Secret", True),
    Resource("apps", "v1", "deployments", "Deployment", True, ("deploy",), ("status", "scale"), ("all",)),
    Resource("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), ("status",), ("all",)),
    Resource("batch", "v1", "jobs", "Job", True, (), ("status",), ("all",)),
    Resource("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), ("status", "scale"), ("all",)),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), ("status",)),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True),
    Resource(GATEWAY, "v1", "httproutes", "HTTPRoute", True, (), ("status",), ("gateway-api",)),
    Resource(GATEWAY, "v1", "gateways", "Gateway", True, ("gtw",), ("status",), ("gateway-api",)),
    Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
             ("crd", "crds"), ("status",), ("api-extensions",)),
    Resource("", "v1", "endpoints", "Endpoints", True, ("ep",)),
    Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    Resource("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",), ("token",)),
    Resource(RBAC, "v1", "roles", "Role", True),
    Resource(RBAC, "v1", "rolebindings", "RoleBinding", True),
    Resource(RBAC, "v1", "clusterroles", "ClusterRole", False),
    Resource(RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    Resource("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
             verbs=("create",)),
    Resource("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", False, verbs=("create",)),
]

# Built-in kinds; crds.py adds and removes the versions of applied CustomResourceDefinitions.
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
BY_KEY = {r.key: r for r in RESOURCES}
GROUP_VERSIONS: dict[str, list[str]] = {}
for _r in RESOURCES:
    if _r.group and _r.version not in GROUP_VERSIONS.setdefault(_r.group, []):
        GROUP_VERSIONS[_r.group].append(_r.version)

# Subresources whose kind is not the parent's.
SUBRESOURCE_KINDS = {"eviction": ("policy", "v1", "Eviction", ["create"]), "scale": ("autoscaling", "v1", "Scale", SUB_VERBS),
                     "log": ("", "v1", "Pod", ["get"]),
                     "token": ("authentication.k8s.io", "v1", "TokenRequest", ["create"])}


def resource_list(group: str, version: str) -> dict[str, Any]:
    """The APIResourceList for one group/version (what `kubectl api-resources` reads)."""
    items: list[dict[str, Any]] = []
    for r in RESOURCES:
        if (r.group, r.version) != (group, version):
            continue
        entry: dict[str, Any] = {
            "name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
            "kind": r.kind, "verbs": list(r.verbs),
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r.categories:
            entry["categories"] = list(r.categories)
        items.append(entry)
        for sub in r.subresources:
            sub_entry: dict[str, Any] = {"name": f"{r.plural}/{sub}", "singularName": "", "namespaced": r.namespaced,
                                         "kind": r.kind, "verbs": SUB_VERBS}
            if sub in SUBRESOURCE_KINDS:
                g, v, kind, verbs = SUBRESOURCE_KINDS[sub]
                sub_entry.update(kind=kind, verbs=verbs)
                if g:
                    sub_entry.update(group=g, version=v)
            items.append(sub_entry)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": items}


def api_group(group: str) -> dict[str, Any]:
    versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in GROUP_VERSIONS[group]]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": versions,
            "preferredVersion": versions[0]}


def api_group_list() -> dict[str, Any]:
    groups = [api_group(g) for g in GROUP_VERSIONS]
    for g in groups:
        del g["kind"], g["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


KUBERNETES_VERSION = "v1.32.0-tideplane-sandbox"  # the API server's, and every node's kubelet
VERSION_INFO = {
    "major": "1", "minor": "32", "gitVersion": KUBERNETES_VERSION, "gitCommit": "sandbox",
    "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23",
    "compiler": "gc", "platform": "linux/amd64",
}
