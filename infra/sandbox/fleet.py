"""Fleet simulator: simulated vLLM replicas and DCGM GPUs for the pods of the emulated cluster.

Every tick it reads pods, services, HTTPRoutes, nodes and the ``fleet-profiles`` /
``fleet-demand`` ConfigMaps from the Kubernetes API emulator over HTTP (official client), splits
each logical deployment's demand between versions by the HTTPRoute's backend weights and between
the Ready pods of a version, and runs each pod's vLLM engine, under the batching arguments of its
container (``--max-num-seqs``, ``--max-num-batched-tokens``, chunked prefill), with the fleet model the benchmarks
score (``infra.fleetmodel``: continuous batching, KV cache, preemption, calibrated step times),
so waiting requests, TTFT and GPU utilisation behave here as the benchmark says they do.
It serves what gates and scaling loops read in production — vLLM's and DCGM's metric names on
``GET /metrics`` — and an OpenAI-compatible ``POST /proxy/{namespace}/{service}/v1/completions``
whose requests join the pod's engine and are answered when it has generated them, and
``POST /gateway/{namespace}/{route}/v1/completions``, which routes as the Gateway would: the
HTTPRoute's rule for the request's headers, then an InferencePool's replica with the least queue
or a Service's (infra/sandbox/gateway.py); the answering pod is in the ``x-tideplane-pod`` header.
The gateway enforces one Envoy Gateway ``BackendTrafficPolicy`` per route, the oldest (a later one
on the same route is reported ``Accepted=False``, reason ``Conflicted``, and not enforced): once the requests
waiting in the engines behind it reach its ``circuitBreaker.maxPendingRequests``, a request is
answered 429 with ``Retry-After`` at once and counted in ``envoy_cluster_upstream_rq_pending_overflow``
(the simulated demand of ``fleet-demand`` enters the engines directly, not through the gateway).
Its BackendTrafficPolicies' token rate limits answer 429, and it counts each answer's tokens per
tenant in ``gen_ai_client_token_usage`` (infra/sandbox/ratelimit.py).

Time is scaled: with ``--time-scale 10`` one real second is ten sandbox seconds, so counters grow
ten times faster and a proxied request waits a tenth of its simulated latency. Latency values
themselves are in sandbox seconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from kubernetes import client
from pydantic import ValidationError

from infra.fleetmodel.engine import Engine, engine_for_service, load_engine
from infra.fleetmodel.fleet import least_queue
from infra.fleetmodel.metrics import HISTOGRAMS, Histogram, dcgm_gpu_util
from infra.fleetmodel.replica import Replica as ModelReplica
from infra.fleetmodel.replica import Request
from infra.sandbox.config import (
    DEMAND_CONFIGMAP,
    PROFILES_CONFIGMAP,
    SANDBOX_NAMESPACE,
    Demand,
    Profile,
)
from infra.sandbox.answers import MirrorLog, answer
from infra.sandbox.gateway import MODEL_HEADER, POOL_GROUP, backend_for, headers_set_by, is_pool
from infra.sandbox.httpserver import SandboxHTTPServer
from infra.sandbox.kubeapi.gpushare import gpu_index, physical_gpus, shared_resource
from infra.sandbox.lora import LoraAdapters, ModelRequests, lora_settings
from infra.sandbox.lora import error as lora_error
from infra.sandbox.kubeclient import api_client, raw
from infra.sandbox.oom import OomWatch
from infra.sandbox.ratelimit import TOKEN_FAMILY, Admission, TokenGate
from workflows.core.naming import GPU_RESOURCE, LABEL_APP, LABEL_MODEL, LABEL_VERSION
from workflows.core.batching_settings import engine_overrides
from workflows.core.gpu_shares import gpu_memory_utilization

log = logging.getLogger("tideplane.fleet")

DEFAULT_GPU_MEMORY_MIB = 81920
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, as GPU feature discovery labels nodes
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
PROXY_TIMEOUT_S = 120.0  # real seconds a proxied request waits for its engine
QUEUE_LIMIT_API = ("gateway.envoyproxy.io", "v1alpha1", "backendtrafficpolicies")
RETRY_AFTER_ANNOTATION = "tideplane.io/retry-after-seconds"
GATEWAY_CONTROLLER = "gateway.envoyproxy.io/gatewayclass-controller"  # Envoy Gateway's controllerName in policy status


# ---------------------------------------------------------------------------------------------
# Pure model: the benchmarks' vLLM replica (infra.fleetmodel), fed in sandbox time


def engine_of(profile: Profile, args: tuple[str, ...] = ()) -> Engine:
    """The profile's calibrated engine, or one with its stated TTFT, TPOT and capacity, under the
    batching arguments of the pod's container (``--max-num-seqs`` ..., as vLLM reads them); a
    calibrated engine gets the KV cache its ``--gpu-memory-utilization`` leaves (a replica sharing
    a GPU gets a smaller one; ``ValueError`` when the weights leave none: vLLM would not start)."""
    if profile.engine:
        engine = load_engine(profile.engine, gpu_memory_utilization=gpu_memory_utilization(list(args)))
    else:
        engine = engine_for_service(profile.ttft_seconds, profile.tpot_seconds, profile.prompt_tokens, profile.output_tokens,
                                    profile.capacity_rps, profile.gpu_memory_gib)
    return engine.with_batching(**engine_overrides(list(args)))


def container_args(pod: dict) -> tuple[str, ...]:
    """The args of the pod's containers (the serving container's engine arguments among them)."""
    return tuple(a for c in (pod.get("spec") or {}).get("containers") or [] for a in c.get("args") or [])


class Replica:
    """One pod's vLLM engine: continuous batching, KV cache and preemption as in ``infra.fleetmodel``.

    The demand arrives as a Poisson stream of requests of the profile's sizes; proxied requests
    join the same engine. Each completed request fails with the profile's ``error_rate``, drawn
    per request (HTTP 500), as a flaky release would.
    """

    def __init__(self, profile: Profile, rng: random.Random | None = None, clock: float = 0.0, args: tuple[str, ...] = ()):
        self.rng = rng or random.Random()
        self.profile = profile
        self.args = args  # the pod's container args: fixed for its life (a new template makes new pods)
        self.engine = ModelReplica(engine_of(profile, args), clock=clock)
        self.success = 0
        self.errors = 0
        self.prompt_tokens = 0  # of finished requests (vLLM counts per step; per request keeps totals exact)
        self.generation_tokens = 0
        self.busy_fraction = 0.0  # of the last tick: what DCGM samples
        self._proxied: list[Request] = []  # arrived through the proxy since the last tick
        self.lora = LoraAdapters()  # dynamically loaded adapters (infra/sandbox/lora.py); set from the pod

    def set_profile(self, profile: Profile) -> None:
        if profile != self.profile:
            self.profile = profile
            self.engine.engine = engine_of(profile, self.args)

    @property
    def clock(self) -> float:
        return self.engine.clock

    @property
    def waiting(self) -> int:
        return len(self.engine.waiting)

    @property
    def running(self) -> int:
        return len(self.engine.running)

    @property
    def kv_cache_usage(self) -> float:
        return min(1.0, self.engine.kv_usage)

    @property
    def gpu_utilisation(self) -> float:
        """Percent, as DCGM_FI_DEV_GPU_UTIL reports it: near full whenever a batch runs."""
        return dcgm_gpu_util(self.busy_fraction, self.engine.engine.busy_duty)

    @property
    def proxied(self) -> list[Request]:
        """Requests through the proxy not yet handed to the engine (they join at the next tick)."""
        return self._proxied

    @property
    def histograms(self) -> dict[str, Histogram]:
        return self.engine.histograms

    @property
    def preemptions(self) -> int:
        return self.engine.preemptions

    def advance(self, rps: float, dt: float) -> int:
        """Offer ``rps`` for ``dt`` sandbox seconds; returns the requests completed (incl. errors)."""
        start, end = self.engine.clock, self.engine.clock + dt
        arrivals, t = [], start
        while rps > 0:
            t += self.rng.expovariate(rps)
            if t >= end:
                break
            arrivals.append(Request(t, self.profile.prompt_tokens, self.profile.output_tokens))
        arrivals = sorted(arrivals + self._proxied, key=lambda r: r.arrival_s)
        self._proxied = []
        busy = self.engine.busy_s
        self.engine.advance_to(end, arrivals)
        self.busy_fraction = (self.engine.busy_s - busy) / dt if dt > 0 else 0.0
        done = self.engine.finished
        self.engine.finished = []
        self.engine.first_tokens.clear()
        for request in done:
            self.prompt_tokens += request.prompt_tokens
            self.generation_tokens += request.output_tokens
            request.failed = self.rng.random() < self.profile.error_rate
            self.errors += request.failed
            self.success += not request.failed
        return len(done)

    def submit(self, prompt_tokens: int, max_tokens: int) -> Request:
        """A proxied request joins the queue now; it is done when its ``finished_s`` is set."""
        request = Request(self.engine.clock, max(1, prompt_tokens), max(1, min(max_tokens, self.profile.output_tokens)))
        self._proxied.append(request)
        return request


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
    demand: dict[str, float], routes: list[dict], services: list[dict], pods: list[dict]
) -> dict[tuple[str, str], float]:
    """Requests/s offered to each Ready pod: (namespace, pod name) -> rps.

    Demand for ``namespace/name`` goes through the HTTPRoute ``name``'s first rule, split by
    backend weight; a backend's share is split evenly between its Service's Ready pods (a backend
    with none drops its share, as a gateway answers 503 for it). Without a route, all Ready pods
    labelled with the logical name share the demand.
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


# ---------------------------------------------------------------------------------------------
# Exposition


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + "n").replace(chr(34), chr(92) + chr(34))}"' for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


class Exposition:
    """Prometheus text format 0.0.4, grouped per metric family."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def sample(self, family: str, kind: str, help_text: str, labels: dict[str, str], value: float, suffix: str = "") -> None:
        entry = self._families.setdefault(family, (kind, help_text, []))
        entry[2].append(f"{family}{suffix}{_labels(labels)} {float(value)!r}")

    def histogram(self, family: str, help_text: str, labels: dict[str, str], hist: Histogram) -> None:
        for le, count in hist.cumulative():
            self.sample(family, "histogram", help_text, {**labels, "le": le}, count, "_bucket")
        self.sample(family, "histogram", help_text, labels, hist.sum, "_sum")
        self.sample(family, "histogram", help_text, labels, hist.count, "_count")

    def text(self) -> str:
        lines = []
        for name, (kind, help_text, samples) in self._families.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The simulator


@dataclass
class Cluster:
    """What the simulator read from the API in one tick."""

    pods: list[dict] = field(default_factory=list)
    services: list[dict] = field(default_factory=list)
    routes: list[dict] = field(default_factory=list)
    pools: list[dict] = field(default_factory=list)  # InferencePools, where the Inference Extension's CRD is applied
    traffic_policies: list[dict] = field(default_factory=list)  # Envoy Gateway BackendTrafficPolicies: queue limits, token quotas
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


@dataclass
class PodInfo:
    namespace: str
    name: str
    deployment: str
    version: str
    model: str
    node: str

    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.name, "deployment": self.deployment, "version": self.version, "model_name": self.model, "node": self.node}


class Fleet:
    """All simulated replicas and GPUs; thread-safe (the HTTP server and the tick loop share it)."""

    def __init__(self, time_scale: float = 1.0, seed: int | None = None):
        self.time_scale = time_scale
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.cluster = Cluster()
        self.replicas: dict[tuple[str, str], tuple[PodInfo, Replica]] = {}
        self.gpus: dict[str, list[str | None]] = {}
        self.shared_gpus: dict[str, list[list[str]]] = {}  # time-sliced node -> pods on each physical GPU
        self.clock = 0.0  # sandbox seconds simulated so far
        self._demand_since: dict[str, tuple[Demand, float]] = {}  # key -> (demand, clock when set)
        self._round_robin = 0
        self.mirrors = MirrorLog()  # answers to requests mirrored by an HTTPRoute (infra/sandbox/answers.py)
        self.queue_full: dict[tuple[str, str], int] = {}  # (namespace, route) -> requests the gateway refused
        self._queued: dict[tuple[str, str], int] = {}  # pod -> requests waiting in its engine after the last tick
        self._refusals = threading.Lock()
        self.token_gate = TokenGate()  # the gateway's token rate limits and counters (infra/sandbox/ratelimit.py)
        self.model_requests = ModelRequests()  # gateway requests per served model (adapter canaries' gates)

    def update(self, cluster: Cluster, real_dt: float) -> None:
        """Take a new snapshot, then advance every Ready replica by ``real_dt * time_scale``."""
        with self.lock:
            self.cluster = cluster
            present = {}
            for pod in cluster.pods:
                labels = pod["metadata"].get("labels") or {}
                if LABEL_APP not in labels or not pod.get("spec", {}).get("nodeName"):
                    continue
                key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                present[key] = pod
                if key not in self.replicas and is_ready(pod):
                    info = PodInfo(key[0], key[1], labels[LABEL_APP], labels.get(LABEL_VERSION, ""), labels.get(LABEL_MODEL, ""), pod["spec"]["nodeName"])
                    profile = profile_for(cluster.profiles, info.model, info.version)
                    try:
                        replica = Replica(profile, random.Random(self.rng.random()), clock=self.clock, args=container_args(pod))
                    except ValueError as exc:  # vLLM exits at start: the weights leave no room for a KV cache
                        log.warning("pod %s/%s cannot serve: %s", *key, exc)
                        continue
                    replica.lora = LoraAdapters(*lora_settings(pod))
                    self.replicas[key] = (info, replica)
            for key in [k for k in self.replicas if k not in present]:
                del self.replicas[key]
            dt = real_dt * self.time_scale
            self.clock += dt
            demand = self._current_demand(cluster.demand)
            rates = pod_rates(demand, cluster.routes, cluster.services, cluster.pods)
            for key, (info, replica) in self.replicas.items():
                replica.set_profile(profile_for(cluster.profiles, info.model, info.version))
                replica.advance(rates.get(key, 0.0) if is_ready(present[key]) else 0.0, dt)
            self._queued = {key: replica.waiting + len(replica.engine.inbound) for key, (_, replica) in self.replicas.items()}
            self._assign_gpus(present)
            self.mirrors.advance(demand, cluster.routes, self._serving_version, dt)

    def _serving_version(self, namespace: str, service: str) -> tuple[str, Profile] | None:
        """(version, profile) behind a Service with a simulated Ready replica; caller holds the lock."""
        svc = next((s for s in self.cluster.services if s["metadata"].get("namespace") == namespace and s["metadata"]["name"] == service), None)
        selector = ((svc or {}).get("spec") or {}).get("selector")
        for pod in self.cluster.pods:
            key = (pod["metadata"].get("namespace"), pod["metadata"]["name"])
            if key[0] == namespace and key in self.replicas and _selects(selector, pod["metadata"].get("labels") or {}):
                info, replica = self.replicas[key]
                return info.version, replica.profile
        return None

    def _current_demand(self, demand: dict[str, Demand]) -> dict[str, float]:
        """rps per logical deployment now; a changed demand restarts its curve's clock."""
        self._demand_since = {
            key: since if (since := self._demand_since.get(key)) and since[0] == value else (value, self.clock)
            for key, value in demand.items()
        }
        return {key: demand_rps(value, self.clock - start) for key, (value, start) in self._demand_since.items()}

    def _assign_gpus(self, present: dict[tuple[str, str], dict]) -> None:
        node_gpus = {}
        for node in self.cluster.nodes:
            status = node.get("status") or {}
            amount = (status.get("allocatable") or status.get("capacity") or {}).get(GPU_RESOURCE, 0)
            node_gpus[node["metadata"]["name"]] = int(amount)
        wanted: dict[str, list[tuple[str, int]]] = {}
        for pod in self.cluster.pods:
            node = (pod.get("spec") or {}).get("nodeName")
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if node and phase in ("Pending", "Running") and pod_gpus(pod):
                wanted.setdefault(node, []).append((f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", pod_gpus(pod)))
        self.gpus = assign_gpus(self.gpus, node_gpus, wanted)
        self.shared_gpus = shared_gpu_holders(self.cluster.nodes, self.cluster.pods)

    def route(self, namespace: str, service: str) -> tuple[PodInfo, Replica] | None:
        """A Ready pod of the Service (round robin), or None."""
        with self.lock:
            svc = next((s for s in self.cluster.services if s["metadata"].get("namespace") == namespace and s["metadata"]["name"] == service), None)
            if svc is None:
                return None
            selector = (svc.get("spec") or {}).get("selector")
            ready = sorted(
                (p["metadata"]["namespace"], p["metadata"]["name"])
                for p in self.cluster.pods
                if p["metadata"].get("namespace") == namespace and is_ready(p) and _selects(selector, p["metadata"].get("labels") or {})
            )
            ready = [key for key in ready if key in self.replicas]
            if not ready:
                return None
            self._round_robin += 1
            return self.replicas[ready[self._round_robin % len(ready)]]

    def gateway_route(self, namespace: str, route: str, headers) -> tuple[PodInfo, Replica] | str:
        """The replica the gateway sends a request on ``route`` to, or why none (infra/sandbox/gateway.py)."""
        with self.lock:
            found = next((r for r in self.cluster.routes if r["metadata"].get("namespace") == namespace
                          and r["metadata"]["name"] == route), None)
            backend = backend_for(found, headers, self.rng.random()) if found else None
            if backend is None:
                return f"no HTTPRoute {namespace}/{route} rule takes this request"
            headers.update(headers_set_by(backend))  # e.g. the adapter version X-Gateway-Model-Name names
            if not is_pool(backend):
                service = backend.get("name", "")
            else:
                pool = next((p for p in self.cluster.pools if p["metadata"].get("namespace") == namespace
                             and p["metadata"]["name"] == backend.get("name")), None)
                if pool is None:
                    return f"no InferencePool {namespace}/{backend.get('name')}"
                selector = ((pool.get("spec") or {}).get("selector") or {}).get("matchLabels")
                queues = {(p["metadata"]["namespace"], p["metadata"]["name"]): 0 for p in self.cluster.pods
                          if p["metadata"].get("namespace") == namespace and is_ready(p)
                          and _selects(selector, p["metadata"].get("labels") or {})}
                queues = {key: self.replicas[key][1].waiting + self.replicas[key][1].running for key in queues if key in self.replicas}
                key = least_queue(queues)
                return self.replicas[key] if key else f"no Ready replica in InferencePool {namespace}/{backend.get('name')}"
        return self.route(namespace, service) or f"no Ready pod behind service {namespace}/{service}"
    def refuse_when_queue_full(self, namespace: str, route: str) -> int | None:
        """The gateway's queue limit on ``route``: Retry-After seconds when the requests waiting in
        the engines behind it have reached its ``maxPendingRequests`` (refused and counted), else None.

        Reads the queues as the last tick left them (plus requests proxied since), without the
        simulator's lock: a gateway answers without waiting for the engines."""
        cluster, queued, replicas = self.cluster, self._queued, self.replicas
        limit = queue_limit_for(cluster.policies_of(namespace, route))
        found = next((r for r in cluster.routes if r["metadata"].get("namespace") == namespace and r["metadata"]["name"] == route), None)
        if limit is None or found is None:
            return None
        behind = cluster.pods_behind(found)
        waiting = sum(queued.get(key, 0) + len(replicas[key][1].proxied) for key in behind if key in replicas)
        if waiting < limit.max_pending:
            return None
        with self._refusals:
            self.queue_full[(namespace, route)] = self.queue_full.get((namespace, route), 0) + 1
        return limit.retry_after_s

    def wait_for(self, info: PodInfo, request: Request) -> str | None:
        """Block (real time) until the engine has answered a proxied request: "done", "timeout", or
        None when its pod is gone."""
        deadline = time.monotonic() + PROXY_TIMEOUT_S
        while time.monotonic() < deadline:
            with self.lock:
                if (info.namespace, info.name) not in self.replicas:
                    return None
                if hasattr(request, "failed"):
                    return "done"
            time.sleep(0.02)
        return "timeout"

    def metrics(self) -> str:
        with self.lock:
            out = Exposition()
            for info, replica in self.replicas.values():
                labels = info.labels()
                out.sample("vllm:num_requests_waiting", "gauge", "Requests waiting to be processed.", labels, replica.waiting)
                out.sample("vllm:num_requests_running", "gauge", "Requests in the running batch.", labels, replica.running)
                out.sample("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 1 means 100 percent.", labels, round(replica.kv_cache_usage, 4))
                out.sample("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.", labels, replica.preemptions)
                for name, (_, help_text) in HISTOGRAMS.items():
                    out.histogram(name, help_text, labels, replica.histograms[name])
                out.sample("vllm:prompt_tokens_total", "counter", "Prefill tokens processed.", labels, replica.prompt_tokens)
                out.sample("vllm:generation_tokens_total", "counter", "Generation tokens processed.", labels, replica.generation_tokens)
                out.sample("vllm:request_success_total", "counter", "Successfully finished requests.", {**labels, "finished_reason": "length"}, replica.success)
                for status, count in (("200", replica.success), ("500", replica.errors)):
                    out.sample("http_requests_total", "counter", "HTTP requests by status.", {**labels, "status": status, "handler": "/v1/completions"}, count)
            for (namespace, route), count in self.queue_full.items():
                out.sample("envoy_cluster_upstream_rq_pending_overflow", "counter", "Requests the gateway refused: queue full.",
                           {"namespace": namespace, "deployment": route}, count)
            self.model_requests.expose(out)
            self._dcgm(out)
            self._node_labels(out)
            self._token_usage(out)
            return out.text()

    def gateway_admit(self, namespace: str, route: str, headers) -> Admission | str:
        """The gateway's rate limits on a request to ``route``: let through, or why not (a 429)."""
        with self.lock:
            policies, now = self.cluster.policies_of(namespace, route), self.clock
        return self.token_gate.admit(policies, namespace, headers, now)

    def gateway_answered(self, admission: Admission, namespace: str, route: str, info: PodInfo, headers, usage: dict) -> None:
        """An answer through the gateway: its tokens count against the rate limits and in the token counters."""
        labels = {"namespace": namespace, "route": route, "gen_ai_operation_name": "completion",
                  "gen_ai_request_model": info.model, "version": info.version}
        self.token_gate.answered(admission, labels, headers, usage["prompt_tokens"], usage["completion_tokens"])

    def _token_usage(self, out: Exposition) -> None:
        """Envoy AI Gateway's token histogram (one +Inf bucket: the sum and count are what metering reads)."""
        help_text = "Number of tokens processed."
        for labels, tokens, answers in self.token_gate.series():
            out.sample(TOKEN_FAMILY, "histogram", help_text, {**labels, "le": "+Inf"}, answers, "_bucket")
            out.sample(TOKEN_FAMILY, "histogram", help_text, labels, tokens, "_sum")
            out.sample(TOKEN_FAMILY, "histogram", help_text, labels, answers, "_count")

    def adapter_fails(self, served: str) -> bool:
        """A request an adapter version answered (served as ``<adapter>-<version>``) fails with the
        error rate of its ``fleet-profiles`` entry ``<adapter>@<version>``, if any: a bad adapter on a
        healthy base."""
        profile = next((p for key, p in self.cluster.profiles.items() if key.replace("@", "-") == served), None)
        return profile is not None and self.rng.random() < profile.error_rate

    def pod(self, namespace: str, name: str) -> tuple[PodInfo, Replica] | None:
        """One pod's replica, as its own address reaches it (the LoRA API is per vLLM process)."""
        with self.lock:
            return self.replicas.get((namespace, name))

    def _node_labels(self, out: Exposition) -> None:
        """kube-state-metrics' ``kube_node_labels``, which cost queries join GPUs to pools with."""
        for node in self.cluster.nodes:
            node_labels = node["metadata"].get("labels") or {}
            labels = {"node": node["metadata"]["name"]}
            labels |= {"label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key): value for key, value in sorted(node_labels.items())}
            out.sample("kube_node_labels", "gauge", "Kubernetes labels converted to Prometheus labels.", labels, 1)

    def _dcgm(self, out: Exposition) -> None:
        pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in self.cluster.pods}
        for node in self.cluster.nodes:
            name = node["metadata"]["name"]
            node_labels = node["metadata"].get("labels") or {}
            total = int(node_labels.get(GPU_MEMORY_LABEL, DEFAULT_GPU_MEMORY_MIB))
            for index, holders in enumerate(self.shared_gpus.get(name, [])):
                # a time-sliced GPU is one device to DCGM: its pods' claims are preallocated, and a
                # kernel of any of them counts as the device busy. dcgm-exporter with
                # --kubernetes-virtual-gpus copies the device's series to each pod on it (label vgpu)
                device = _device_labels(name, index, node_labels)
                used = min(total, int(sum(gpu_memory_utilization(list(container_args(pods[h]))) for h in holders) * total))
                util = min(100.0, sum(self.replicas[k][1].gpu_utilisation for h in holders
                                      if (k := tuple(h.split("/", 1))) in self.replicas))
                copies = [device | _pod_labels(h) | {"vgpu": str(share)} for share, h in enumerate(holders)] or [device]
                for labels in copies:
                    _dcgm_samples(out, labels, util, used, total)
            for index, holder in enumerate(self.gpus.get(name, [])):
                labels = _device_labels(name, index, node_labels)
                util, used = 0.0, 0
                if holder is not None:
                    labels |= _pod_labels(holder)
                    namespace, pod_name = labels["namespace"], labels["pod"]
                    pod_labels = pods[holder]["metadata"].get("labels") or {}
                    profile = profile_for(self.cluster.profiles, pod_labels.get(LABEL_MODEL, ""), pod_labels.get(LABEL_VERSION, ""))
                    used = min(total, int(profile.gpu_memory_gib * 1024))
                    replica = self.replicas.get((namespace, pod_name))
                    util = replica[1].gpu_utilisation if replica else 0.0
                _dcgm_samples(out, labels, util, used, total)


def _device_labels(node: str, index: int, node_labels: dict[str, str]) -> dict[str, str]:
    """dcgm-exporter's labels of GPU ``index`` of ``node`` (a stable UUID per node and index)."""
    return {"gpu": str(index), "UUID": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}')}", "device": f"nvidia{index}",
            "modelName": node_labels.get(GPU_PRODUCT_LABEL, "NVIDIA H100 80GB HBM3"), "Hostname": node}


def _dcgm_samples(out: Exposition, labels: dict[str, str], util: float, used: int, total: int) -> None:
    out.sample("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", labels, util)
    out.sample("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", labels, used)
    out.sample("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", labels, total - used)


def _pod_labels(holder: str) -> dict[str, str]:
    """The labels dcgm-exporter's pod mapping adds to a GPU's series for the pod ``namespace/name``."""
    namespace, _, pod = holder.partition("/")
    return {"namespace": namespace, "pod": pod, "container": "vllm"}


# ---------------------------------------------------------------------------------------------
# HTTP

_PROXY = re.compile(r"^/proxy/([a-z0-9-]+)/([a-z0-9-]+)(/.*)$")
_GATEWAY = re.compile(r"^/gateway/([a-z0-9-]+)/([a-z0-9-]+)/v1/completions$")  # through an HTTPRoute, as clients call
_POD = re.compile(r"^/pods/([a-z0-9-]+)/([a-z0-9.-]+)(/.*)$")  # one pod, as http://<pod IP>:8000 reaches it
_LORA_ROUTES = {"/v1/load_lora_adapter": LoraAdapters.load, "/v1/unload_lora_adapter": LoraAdapters.unload}


def completion_body(info: PodInfo, request: Request, max_tokens: int) -> dict:
    """An OpenAI text_completion response as vLLM returns it."""
    words = ("the", "tide", "rises", "and", "falls", "over", "the", "plane")
    text = " ".join(words[i % len(words)] for i in range(request.output_tokens))
    prompt_tokens = request.prompt_tokens
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": info.model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": "length" if request.output_tokens >= max_tokens else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": request.output_tokens, "total_tokens": prompt_tokens + request.output_tokens},
    }


def make_handler(fleet: Fleet) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args) -> None:  # access logs would flood the log file
            log.debug(fmt, *args)

        def _send(self, status: int, body: bytes, content_type: str = "application/json", headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str) -> None:
            self._send(status, json.dumps({"object": "error", "message": message, "code": status}).encode())

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, fleet.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif self.path.startswith("/mirror/"):
                try:
                    pairs = fleet.mirrors.read(self.path)
                except ValueError as exc:
                    pairs = None
                    self._error(400, f"bad mirror query: {exc}")
                    return
                if pairs is None:
                    self._error(404, f"no route {self.path}: use /mirror/<namespace>/<route>")
                else:
                    self._send(200, json.dumps(pairs).encode())
            elif pod := _POD.match(self.path):
                self._pod_request(*pod.groups(), None)
            elif self.path in ("/healthz", "/"):
                self._send(200, b'{"status": "ok"}')
            elif match := _PROXY.match(self.path):
                namespace, service, rest = match.groups()
                target = fleet.route(namespace, service)
                if target is None:
                    self._error(503, f"no Ready pod behind service {namespace}/{service}")
                elif rest == "/health":
                    self._send(200, b"")
                elif rest == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": target[1].lora.model_cards(target[0].model)}).encode())
                else:
                    self._error(404, f"no route {rest}")
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if pod := _POD.match(self.path):
                self._pod_request(*pod.groups(), body)
                return
            match = _PROXY.match(self.path)
            gateway = _GATEWAY.match(self.path)
            if not gateway and (not match or match.group(3) != "/v1/completions"):
                self._error(404, f"no route {self.path}")
                return
            try:
                request = json.loads(body or b"{}")
                prompt = request.get("prompt", "")
                max_tokens = int(request.get("max_tokens", 16))
            except (ValueError, TypeError, AttributeError) as exc:
                self._error(400, f"bad request body: {exc}")
                return
            model = request.get("model") if isinstance(request.get("model"), str) else None
            if gateway:
                admission = fleet.gateway_admit(*gateway.groups(), self.headers)
                if isinstance(admission, str):
                    self._error(429, admission)
                    return
                retry_after = fleet.refuse_when_queue_full(*gateway.groups())
                if retry_after is not None:
                    message = f"queue full at {'/'.join(gateway.groups())}: retry after {retry_after}s"
                    self._send(429, json.dumps({"object": "error", "message": message, "code": 429}).encode(),
                               headers={"Retry-After": str(retry_after)})
                    return
                headers = {**self.headers, **({MODEL_HEADER: model} if model else {})}  # body-based routing
                target = fleet.gateway_route(*gateway.groups(), headers)
                model = headers.get(MODEL_HEADER, model)  # the endpoint picker writes it back into the body
                if isinstance(target, str):
                    self._error(503, target)
                    return
            else:
                namespace, service, _ = match.groups()
                target = fleet.route(namespace, service)
                if target is None:
                    self._error(503, f"no Ready pod behind service {namespace}/{service}")
                    return
            info, replica = target
            if not replica.lora.serves(model, info.model):
                self._send(404, json.dumps(lora_error(404, f"The model `{model}` does not exist.", "NotFoundError")[1]).encode())
                return
            with fleet.lock:
                submitted = replica.submit(max(1, len(str(prompt)) // 4), max_tokens)
            outcome = fleet.wait_for(info, submitted)
            if outcome == "done" and model in replica.lora.loaded:
                submitted.failed = submitted.failed or fleet.adapter_fails(model)
            if gateway and outcome == "done":
                requested = json.loads(body or b"{}").get("model") or info.model
                latency = (submitted.finished_s - submitted.arrival_s) if submitted.finished_s is not None else None
                fleet.model_requests.record((*gateway.groups(), str(requested), model or info.model), submitted.failed, latency)
            if outcome is None:
                self._error(503, f"pod {info.name} went away before answering")
            elif outcome == "timeout":
                self._error(504, f"pod {info.name} did not answer within {PROXY_TIMEOUT_S:g}s")
            elif submitted.failed:
                self._error(500, f"simulated failure of {info.model}@{info.version} in pod {info.name}")
            else:
                body = completion_body(info, submitted, max_tokens)
                body["model"] = model or info.model
                body["choices"][0]["text"] = answer(str(prompt), info.version, replica.profile)  # infra/sandbox/answers.py
                if gateway:
                    fleet.gateway_answered(admission, *gateway.groups(), info, self.headers, body["usage"])
                self._send(200, json.dumps(body).encode(), headers={"x-tideplane-pod": f"{info.namespace}/{info.name}"})

        def _pod_request(self, namespace: str, name: str, rest: str, body: bytes | None) -> None:
            """``/pods/<namespace>/<pod>``: ``GET /v1/models``, ``POST /v1/{load,unload}_lora_adapter``."""
            target = fleet.pod(namespace, name)
            call = _LORA_ROUTES.get(rest) if body is not None else None
            if target is None:
                self._error(503, f"no simulated replica for pod {namespace}/{name}")
            elif body is None and rest == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": target[1].lora.model_cards(target[0].model)}).encode())
            elif call is None or not target[1].lora.runtime_updating:
                self._error(404, f"no route {rest}")  # vLLM adds the LoRA routes only with runtime updating
            else:
                try:
                    request = json.loads(body or b"{}")
                except ValueError as exc:
                    self._error(400, f"bad request body: {exc}")
                    return
                with fleet.lock:
                    status, answer_body = call(target[1].lora, request if isinstance(request, dict) else {})
                if isinstance(answer_body, str):
                    self._send(status, answer_body.encode(), "text/plain; charset=utf-8")
                else:
                    self._send(status, json.dumps(answer_body).encode())

    return Handler


def run(kube_url: str, host: str, port: int, time_scale: float, tick_seconds: float = 0.5) -> None:
    """Serve until killed; the tick loop keeps going through API errors (the emulator may restart)."""
    fleet = Fleet(time_scale)
    server = SandboxHTTPServer((host, port), make_handler(fleet))
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info("fleet simulator on http://%s:%d reading %s (time scale %s)", host, port, kube_url, time_scale)
    api = api_client(kube_url)
    oom = OomWatch(kube_url)
    last = time.monotonic()
    while True:
        try:
            cluster = read_cluster(api)
        except Exception as exc:  # noqa: BLE001 - a flaky read must not stop the fleet
            log.warning("reading the cluster failed: %s", exc)
            cluster = None
        now = time.monotonic()
        if cluster is not None:
            fleet.update(cluster, now - last)
            oom.check(fleet)
            report_policy_status(api, cluster)
        last = now
        time.sleep(max(0.0, tick_seconds - (time.monotonic() - now)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infra.sandbox.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--kube-url", required=True, help="the Kubernetes API emulator, e.g. http://127.0.0.1:16443")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--time-scale", type=float, default=1.0, help="sandbox seconds per real second")
    parser.add_argument("--tick", type=float, default=0.5, help="real seconds between simulation steps")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(args.kube_url, args.host, args.port, args.time_scale, args.tick)


if __name__ == "__main__":
    main()
