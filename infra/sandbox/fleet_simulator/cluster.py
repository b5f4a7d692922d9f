"""What the fleet simulator reads of the emulated cluster every tick (pods, services, HTTPRoutes,
nodes, traffic policies and the fleet ConfigMaps), how it splits each deployment's demand between
its versions' Ready pods, which GPU each pod holds, and the traffic policies' status it reports."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kubernetes import client
from pydantic import ValidationError

from infra.sandbox.apikeys import SECURITY_POLICY_API, secret_refs
from infra.sandbox.config import DEMAND_CONFIGMAP, PROFILES_CONFIGMAP, SANDBOX_NAMESPACE, Demand, Profile
from infra.sandbox.gateway import POOL_GROUP, is_pool
from infra.sandbox.kubeapi.gpushare import gpu_index, physical_gpus, shared_resource
from infra.sandbox.kubeclient import raw
from infra.sandbox.fleet_simulator.vllm_args import GPU_RESOURCE, LABEL_APP, LABEL_VERSION

log = logging.getLogger("tideplane.fleet")


DEFAULT_GPU_MEMORY_MIB = 81920
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, as GPU feature discovery labels nodes
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
QUEUE_LIMIT_API = ("gateway.envoyproxy.io", "v1alpha1", "backendtrafficpolicies")
RETRY_AFTER_ANNOTATION = "tideplane.io/retry-after-seconds"
GATEWAY_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"  # Envoy Gateway's controllerName in policy status


def demand_rps(demand: Demand, t: float) -> float:
    """The rate ``t`` sandbox seconds after the demand was set: its curve, else its constant rps."""
    points = demand.curve
    if not points:
        return demand.rps
    if demand.period_seconds:
        t %= demand.period_seconds
    if t <= points[0][0]:
        return points[0][1]
    for (t0, r0), (t1, r1) in zip(points, points[1:]):
        if t <= t1:
            return r1 if t1 == t0 else r0 + (r1 - r0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def profile_for(profiles: dict[str, Profile], model: str, version: str) -> Profile:
    """``<model>@<version>``, then ``<model>``, then ``default``, then the built-in default."""
    for key in (f"{model}@{version}", model, "default"):
        if key in profiles:
            return profiles[key]
    return Profile()


def is_ready(pod: dict) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_gpus(pod: dict) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("limits") or {}).get(GPU_RESOURCE) or (resources.get("requests") or {}).get(GPU_RESOURCE) or 0
        total += int(amount)
    return total


def _selects(selector: dict | None, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_rates(
    demand: dict[str, float], routes: list[dict], services: list[dict], pods: list[dict],
    unserved: dict[tuple[str, str, str], float] | None = None,
) -> dict[tuple[str, str], float]:
    """Requests/s offered to each Ready pod: (namespace, pod name) -> rps.

    Demand for ``namespace/name`` goes through the HTTPRoute ``name``'s first rule, split by
    backend weight; a backend's share is split evenly between its Service's Ready pods (a backend
    with none drops its share, as a gateway answers 503 for it: added to ``unserved`` by
    (namespace, route, the Service's version)). Without a route, all Ready pods labelled with the
    logical name share the demand.
    """
    ready = [p for p in pods if is_ready(p)]
    route_by = {(r["metadata"].get("namespace", "default"), r["metadata"]["name"]): r for r in routes}
    service_by = {(s["metadata"].get("namespace", "default"), s["metadata"]["name"]): s for s in services}
    rates: dict[tuple[str, str], float] = {}

    def spread(rps: float, members: list[dict]) -> None:
        for pod in members:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            rates[key] = rates.get(key, 0.0) + rps / len(members)

    for ref, rps in demand.items():
        namespace, _, name = ref.partition("/")
        if rps <= 0 or not name:
            continue
        route = route_by.get((namespace, name))
        if route is None:
            members = [p for p in ready if p["metadata"]["namespace"] == namespace and (p["metadata"].get("labels") or {}).get(LABEL_APP) == name]
            if members:
                spread(rps, members)
            continue
        rules = route.get("spec", {}).get("rules") or [{}]
        backends = [(b["name"], int(b.get("weight", 1))) for b in rules[0].get("backendRefs") or []]
        total = sum(w for _, w in backends)
        for service_name, weight in backends:
            service = service_by.get((namespace, service_name))
            if not weight or service is None:
                continue
            selector = (service.get("spec") or {}).get("selector")
            members = [p for p in ready if p["metadata"]["namespace"] == namespace and _selects(selector, p["metadata"].get("labels") or {})]
            if members:
                spread(rps * weight / total, members)
            elif unserved is not None:
                key = (namespace, name, (selector or {}).get(LABEL_VERSION, ""))
                unserved[key] = unserved.get(key, 0.0) + rps * weight / total
    return rates


def assign_gpus(
    previous: dict[str, list[str | None]], node_gpus: dict[str, int], wanted: dict[str, list[tuple[str, int]]]
) -> dict[str, list[str | None]]:
    """GPU index -> holder per node, keeping existing holders where they are (device plugin style).

    ``wanted``: node -> [(pod key, GPUs requested)] for the pods bound there. Pods that left free
    their GPUs; new pods take the lowest free indices.
    """
    result: dict[str, list[str | None]] = {}
    for node, count in node_gpus.items():
        holders = {key: n for key, n in wanted.get(node, [])}
        slots: list[str | None] = [None] * count
        old = previous.get(node, [])
        for i, holder in enumerate(old[:count]):
            if holder in holders:
                slots[i] = holder
        for key, n in wanted.get(node, []):
            missing = n - slots.count(key)
            for i in range(count):
                if missing <= 0:
                    break
                if slots[i] is None:
                    slots[i] = key
                    missing -= 1
        result[node] = slots
    return result


@dataclass(frozen=True)
class QueueLimit:
    """A BackendTrafficPolicy's limit on one HTTPRoute, as the gateway in front of it enforces it."""

    max_pending: int
    retry_after_s: int


def _routes_targeted(policy: dict) -> list[str]:
    return [t.get("name") for t in (policy.get("spec") or {}).get("targetRefs") or [] if t.get("kind") == "HTTPRoute"]


def _policy_age(policy: dict) -> tuple[str, str]:
    """Envoy Gateway's order of policies on one target: creation time (RFC 3339 seconds sort as
    text), then the name where two were created within the same second."""
    return policy["metadata"].get("creationTimestamp") or "", policy["metadata"]["name"]


def queue_limit_for(policies: list[dict]) -> QueueLimit | None:
    """The tightest ``circuitBreaker.maxPendingRequests`` of the enforced BackendTrafficPolicies; None: none."""
    limits = []
    for policy in policies:
        pending = ((policy.get("spec") or {}).get("circuitBreaker") or {}).get("maxPendingRequests")
        retry = str((policy["metadata"].get("annotations") or {}).get(RETRY_AFTER_ANNOTATION, "1"))
        if pending is not None:
            limits.append(QueueLimit(int(pending), max(1, int(retry)) if retry.isdigit() else 1))
    return min(limits, key=lambda q: q.max_pending) if limits else None


def shared_gpu_holders(nodes: list[dict], pods: list[dict]) -> dict[str, list[list[str]]]:
    """Pods (``namespace/name``) on each physical GPU of the time-sliced nodes, as the scheduler annotated them."""
    out: dict[str, list[list[str]]] = {}
    for node in nodes:
        if shared_resource(node):
            out[node["metadata"]["name"]] = [[] for _ in range(physical_gpus(node))]
    for pod in pods:
        gpus = out.get((pod.get("spec") or {}).get("nodeName"))
        index = gpu_index(pod)
        if gpus is not None and index is not None and index < len(gpus) and (pod.get("status") or {}).get("phase") in ("Pending", "Running"):
            gpus[index].append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
    return out


@dataclass
class Cluster:
    """What the simulator read from the API in one tick."""

    pods: list[dict] = field(default_factory=list)
    services: list[dict] = field(default_factory=list)
    routes: list[dict] = field(default_factory=list)
    pools: list[dict] = field(default_factory=list)  # InferencePools, where the Inference Extension's CRD is applied
    traffic_policies: list[dict] = field(default_factory=list)  # Envoy Gateway BackendTrafficPolicies: queue limits, token quotas
    security_policies: list[dict] = field(default_factory=list)  # Envoy Gateway SecurityPolicies: API key -> tenant
    secrets: dict[tuple[str, str], dict] = field(default_factory=dict)  # the Secrets those policies name, by (namespace, name)
    nodes: list[dict] = field(default_factory=list)
    profiles: dict[str, Profile] = field(default_factory=dict)
    demand: dict[str, Demand] = field(default_factory=dict)

    def policies_of(self, namespace: str, route: str) -> list[dict]:
        """The BackendTrafficPolicy the gateway enforces on the HTTPRoute ``namespace/route`` (none
        or one): as Envoy Gateway, the oldest of those that target it; the others are Conflicted there."""
        targeting = [
            p for p in self.traffic_policies
            if p["metadata"].get("namespace") == namespace and route in _routes_targeted(p)
        ]
        return sorted(targeting, key=_policy_age)[:1]

    def policy_status(self, policy: dict) -> dict:
        """The status Envoy Gateway reports on ``policy``: per targeted route that exists, an ancestor
        (the route's Gateway) with ``Accepted`` True, or False with reason ``Conflicted`` where an
        older policy holds the route (envoyproxy/gateway internal/gatewayapi/backendtrafficpolicy.go)."""
        namespace = policy["metadata"].get("namespace")
        ancestors = []
        for name in _routes_targeted(policy):
            found = next((r for r in self.routes if r["metadata"].get("namespace") == namespace and r["metadata"]["name"] == name), None)
            if found is None:
                continue  # Envoy Gateway writes no status for a target that does not exist
            holder = self.policies_of(namespace, name)[0]
            condition = ({"type": "Accepted", "status": "True", "reason": "Accepted", "message": "Policy has been accepted."}
                         if holder["metadata"]["name"] == policy["metadata"]["name"] else
                         {"type": "Accepted", "status": "False", "reason": "Conflicted",
                          "message": f"Unable to target HTTPRoute {name}, another BackendTrafficPolicy has already attached to it"})
            for parent in (found.get("spec") or {}).get("parentRefs") or [{}]:
                ref = {"group": parent.get("group", "gateway.networking.k8s.io"), "kind": parent.get("kind", "Gateway"),
                       "name": parent.get("name", ""), "namespace": parent.get("namespace", namespace)}
                ancestors.append({"ancestorRef": ref, "controllerName": GATEWAY_CONTROLLER, "conditions": [condition]})
        return {"ancestors": ancestors}

    def pods_behind(self, route: dict) -> list[tuple[str, str]]:
        """(namespace, pod) of the Ready pods behind any backend of the route: Services and InferencePools."""
        namespace = route["metadata"].get("namespace")
        selectors = []
        for rule in (route.get("spec") or {}).get("rules") or []:
            for backend in rule.get("backendRefs") or []:
                kind = self.pools if is_pool(backend) else self.services
                obj = next((o for o in kind if o["metadata"].get("namespace") == namespace and o["metadata"]["name"] == backend.get("name")), None)
                spec = (obj or {}).get("spec") or {}
                selectors.append(spec["selector"].get("matchLabels") if is_pool(backend) and spec.get("selector") else spec.get("selector"))
        return [
            (namespace, p["metadata"]["name"]) for p in self.pods
            if p["metadata"].get("namespace") == namespace and is_ready(p)
            and any(_selects(sel, p["metadata"].get("labels") or {}) for sel in selectors)
        ]


def read_cluster(api: client.ApiClient) -> Cluster:
    """One consistent-enough snapshot of the emulated cluster over HTTP."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    cluster = Cluster(
        pods=raw(core.list_pod_for_all_namespaces(_preload_content=False))["items"],
        services=raw(core.list_service_for_all_namespaces(_preload_content=False))["items"],
        nodes=raw(core.list_node(_preload_content=False))["items"],
    )
    try:
        cluster.routes = raw(custom.list_cluster_custom_object("gateway.networking.k8s.io", "v1", "httproutes", _preload_content=False))["items"]
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    try:
        cluster.pools = raw(custom.list_cluster_custom_object(POOL_GROUP, "v1", "inferencepools", _preload_content=False))["items"]
    except client.ApiException as exc:
        if exc.status != 404:  # 404: the CRD is not installed
            raise
    try:
        cluster.traffic_policies = raw(custom.list_cluster_custom_object(*QUEUE_LIMIT_API, _preload_content=False))["items"]
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    try:
        cluster.security_policies = raw(custom.list_cluster_custom_object(*SECURITY_POLICY_API, _preload_content=False))["items"]
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    for namespace, name in {ref for policy in cluster.security_policies for ref in secret_refs(policy)}:
        try:
            cluster.secrets[(namespace, name)] = raw(core.read_namespaced_secret(name, namespace, _preload_content=False))
        except client.ApiException as exc:
            if exc.status != 404:
                raise
    for name, parse in ((PROFILES_CONFIGMAP, Profile), (DEMAND_CONFIGMAP, Demand)):
        try:
            data = raw(core.read_namespaced_config_map(name, SANDBOX_NAMESPACE, _preload_content=False)).get("data") or {}
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            continue
        for key, text in data.items():
            try:
                value = parse.model_validate_json(text)
            except ValidationError as exc:
                log.warning("ignoring %s[%s]: %s", name, key, exc)
                continue
            if isinstance(value, Profile):
                cluster.profiles[key] = value
            else:
                cluster.demand[key] = value
    return cluster


def report_policy_status(api: client.ApiClient, cluster: Cluster) -> None:
    """Write each BackendTrafficPolicy's status where it changed, as Envoy Gateway's controller does."""
    custom = client.CustomObjectsApi(api)
    for policy in cluster.traffic_policies:
        status = cluster.policy_status(policy)
        if (policy.get("status") or {}).get("ancestors", []) == status["ancestors"]:
            continue
        try:
            custom.patch_namespaced_custom_object_status(*QUEUE_LIMIT_API[:2], policy["metadata"]["namespace"], QUEUE_LIMIT_API[2],
                                                         policy["metadata"]["name"], {"status": status})
        except client.ApiException as exc:
            log.warning("status of BackendTrafficPolicy %s/%s: %s", policy["metadata"]["namespace"], policy["metadata"]["name"], exc.reason)
