"""Endpoints and EndpointSlices from pods, HTTPRoute/Gateway status, and node heartbeat Leases.

- Endpoints and EndpointSlice controllers: for every Service with a selector, its pods with an IP,
  Ready ones as ready addresses, the others (and Terminating ones) as not ready.
- The sandbox's gateway controller (`tideplane.io/sandbox-gateway`): every Gateway is Accepted and
  Programmed; every HTTPRoute gets, per parentRef, `Accepted` (False/NoMatchingParent when the
  Gateway does not exist) and `ResolvedRefs` (False/BackendNotFound when a Service backend does
  not exist), as a real Gateway API implementation reports them.
- Node heartbeats: each Ready node's kubelet renews its Lease in kube-node-lease (what
  `kubectl describe node` shows), every LEASE_RENEW_SECONDS sandbox seconds.
"""

from __future__ import annotations

import copy
import time
from datetime import datetime, timezone
from typing import Any

from .api import pod_ready
from .conditions import node_ready
from .control_plane import ControlPlane
from .resources import BY_KEY, GATEWAY
from .selectors import label_selector_matcher
from .timestamps import now_iso


PODS, SERVICES, NODES = BY_KEY["pods"], BY_KEY["services"], BY_KEY["nodes"]
ENDPOINTS, ENDPOINT_SLICES = BY_KEY["endpoints"], BY_KEY["endpointslices.discovery.k8s.io"]
ROUTES, GATEWAYS, LEASES = BY_KEY[f"httproutes.{GATEWAY}"], BY_KEY[f"gateways.{GATEWAY}"], BY_KEY["leases.coordination.k8s.io"]
GATEWAY_CONTROLLER = "tideplane.io/sandbox-gateway"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
LEASE_RENEW_SECONDS = 40.0


def _micro_time() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _write(store, res, want: dict[str, Any], have: dict[str, Any] | None) -> None:
    """Create or update to `want`, comparing only what the controller owns."""
    if have is None:
        store.create(res, want)
        return
    merged = copy.deepcopy(have)
    merged.update({k: v for k, v in want.items() if k != "metadata"})
    merged["metadata"].setdefault("labels", {}).update(want["metadata"].get("labels") or {})
    if merged != have:
        store.update(res, merged)


class Networking:
    def __init__(self, ctl: ControlPlane):
        self.ctl = ctl
        self.store = ctl.store
        self.renewed: dict[str, float] = {}  # node name -> when its lease was last renewed
        self.wake_at: list[float] = []

    def reconcile(self) -> None:
        self.endpoints()
        self.gateways()
        self.leases()

    # -- endpoints ------------------------------------------------------------------------------
    def endpoints(self) -> None:
        services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in self.store.list(SERVICES)}
        for ep in self.store.list(ENDPOINTS):
            if (ep["metadata"]["namespace"], ep["metadata"]["name"]) not in services:
                self.store.delete(ENDPOINTS, ep["metadata"]["namespace"], ep["metadata"]["name"])
        pods_by_ns: dict[str, list[dict[str, Any]]] = {}
        for pod in self.store.list(PODS):
            pods_by_ns.setdefault(pod["metadata"]["namespace"], []).append(pod)
        for (ns, name), svc in services.items():
            selector = (svc.get("spec") or {}).get("selector")
            if not selector:
                continue
            matches = label_selector_matcher({"matchLabels": selector})
            pods = [p for p in pods_by_ns.get(ns, []) if (p.get("status") or {}).get("podIP")
                    and matches(p["metadata"].get("labels") or {})]
            ports = [{k: v for k, v in {"name": p.get("name"), "port": p.get("targetPort", p.get("port")),
                                        "protocol": p.get("protocol", "TCP")}.items() if v is not None}
                     for p in (svc.get("spec") or {}).get("ports") or []]
            self._endpoints(svc, pods, ports)
            self._slice(svc, pods, ports)

    def _endpoints(self, svc: dict[str, Any], pods: list[dict[str, Any]], ports: list[dict[str, Any]]) -> None:
        meta = svc["metadata"]

        def address(p: dict[str, Any]) -> dict[str, Any]:
            return {"ip": p["status"]["podIP"], "nodeName": p["spec"].get("nodeName"),
                    "targetRef": {"kind": "Pod", "namespace": meta["namespace"], "name": p["metadata"]["name"],
                                  "uid": p["metadata"]["uid"]}}

        serving = [address(p) for p in pods if pod_ready(p) and not p["metadata"].get("deletionTimestamp")]
        waiting = [address(p) for p in pods if not (pod_ready(p) and not p["metadata"].get("deletionTimestamp"))]
        subset: dict[str, Any] = {"ports": ports}
        if serving:
            subset["addresses"] = serving
        if waiting:
            subset["notReadyAddresses"] = waiting
        want = {"apiVersion": "v1", "kind": "Endpoints",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": meta.get("labels") or {}},
                "subsets": [subset] if pods else []}
        _write(self.store, ENDPOINTS, want, self.store.try_get(ENDPOINTS, meta["namespace"], meta["name"]))

    def _slice(self, svc: dict[str, Any], pods: list[dict[str, Any]], ports: list[dict[str, Any]]) -> None:
        meta = svc["metadata"]
        name = f"{meta['name'][:57]}-{meta['uid'][:5]}"
        endpoints = [{"addresses": [p["status"]["podIP"]],
                      "conditions": {"ready": pod_ready(p) and not p["metadata"].get("deletionTimestamp"),
                                     "serving": pod_ready(p), "terminating": bool(p["metadata"].get("deletionTimestamp"))},
                      "nodeName": p["spec"].get("nodeName"),
                      "targetRef": {"kind": "Pod", "namespace": meta["namespace"], "name": p["metadata"]["name"],
                                    "uid": p["metadata"]["uid"]}} for p in pods]
        want = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": meta["namespace"],
                             "labels": {"kubernetes.io/service-name": meta["name"],
                                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": meta["name"],
                                                  "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
                "addressType": "IPv4", "endpoints": endpoints, "ports": ports}
        _write(self.store, ENDPOINT_SLICES, want, self.store.try_get(ENDPOINT_SLICES, meta["namespace"], name))

    # -- gateway controller ---------------------------------------------------------------------
    def gateways(self) -> None:
        for gw in self.store.list(GATEWAYS):
            conditions = copy.deepcopy((gw.get("status") or {}).get("conditions") or [])
            generation = gw["metadata"].get("generation", 1)
            self._condition(conditions, "Accepted", "True", "Accepted", "Accepted by the sandbox gateway", generation)
            self._condition(conditions, "Programmed", "True", "Programmed", "Programmed in the fleet simulator", generation)
            self._set_status(GATEWAYS, gw, {**(gw.get("status") or {}), "conditions": conditions})
        for route in self.store.list(ROUTES):
            ns = route["metadata"]["namespace"]
            generation = route["metadata"].get("generation", 1)
            spec = route.get("spec") or {}
            missing = [b["name"] for r in spec.get("rules") or [] for b in (r or {}).get("backendRefs") or []
                       if not b.get("group") and b.get("kind", "Service") == "Service"
                       and self.store.try_get(SERVICES, b.get("namespace") or ns, b.get("name", "")) is None]
            old_parents = {(p.get("parentRef") or {}).get("name"): p for p in (route.get("status") or {}).get("parents") or []}
            parents = []
            for ref in spec.get("parentRefs") or []:
                conditions = copy.deepcopy((old_parents.get(ref.get("name")) or {}).get("conditions") or [])
                if self.store.try_get(GATEWAYS, ref.get("namespace") or ns, ref.get("name", "")):
                    self._condition(conditions, "Accepted", "True", "Accepted", "Route is accepted", generation)
                else:
                    self._condition(conditions, "Accepted", "False", "NoMatchingParent",
                                    f"Gateway {ref.get('namespace') or ns}/{ref.get('name')} not found", generation)
                if missing:
                    self._condition(conditions, "ResolvedRefs", "False", "BackendNotFound",
                                    f"Service {ns}/{missing[0]} not found", generation)
                else:
                    self._condition(conditions, "ResolvedRefs", "True", "ResolvedRefs", "Resolved all the Object references",
                                    generation)
                parents.append({"parentRef": ref, "controllerName": GATEWAY_CONTROLLER, "conditions": conditions})
            self._set_status(ROUTES, route, {"parents": parents})

    @staticmethod
    def _condition(conditions: list[dict[str, Any]], kind: str, status: str, reason: str, message: str,
                   generation: int) -> None:
        """A metav1.Condition: lastTransitionTime kept while the status stays."""
        old = next((c for c in conditions if c["type"] == kind), None)
        new = {"type": kind, "status": status, "reason": reason, "message": message, "observedGeneration": generation,
               "lastTransitionTime": old["lastTransitionTime"] if old and old["status"] == status else now_iso()}
        if old:
            conditions[conditions.index(old)] = new
        else:
            conditions.append(new)

    def _set_status(self, res, obj: dict[str, Any], status: dict[str, Any]) -> None:
        if obj.get("status") != status:
            new = copy.deepcopy(obj)
            new["status"] = status
            self.store.update(res, new)

    # -- node leases ----------------------------------------------------------------------------
    def leases(self) -> None:
        now = time.monotonic()
        self.wake_at = []
        nodes = {n["metadata"]["name"]: n for n in self.store.list(NODES)}
        self.renewed = {k: v for k, v in self.renewed.items() if k in nodes}
        if ("", LEASE_NAMESPACE) not in self.store.objects["namespaces"]:
            return
        interval = LEASE_RENEW_SECONDS / self.ctl.time_scale
        for name, node in nodes.items():
            if not node_ready(node):
                continue  # a NotReady node's kubelet posts nothing
            due = self.renewed.get(name, -interval) + interval
            if now < due:
                self.wake_at.append(due)
                continue
            self.renewed[name] = now
            self.wake_at.append(now + interval)
            lease = self.store.try_get(LEASES, LEASE_NAMESPACE, name)
            stamp = _micro_time()
            if lease is None:
                self.store.create(LEASES, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": LEASE_NAMESPACE,
                                 "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                                      "uid": node["metadata"]["uid"]}]},
                    "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                             "acquireTime": stamp, "renewTime": stamp}})
            else:
                new = copy.deepcopy(lease)
                new["spec"]["renewTime"] = stamp
                self.store.update(LEASES, new)
