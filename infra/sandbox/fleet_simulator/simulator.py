"""``FleetSimulator``: the simulated replica of every Ready model pod, advanced each tick by the demand
its version's route share gives it; it answers the proxied and gateway requests (routing, queue
limit, token quotas, mirrors) and renders the metrics. The process around it is server.py."""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from dataclasses import dataclass

from infra.fleetmodel.fleet import least_queue
from infra.fleetmodel.metrics import HISTOGRAMS
from infra.fleetmodel.replica import Request
from infra.sandbox.answers import MirrorLog
from infra.sandbox.config import Demand, Profile
from infra.sandbox.fleet_simulator.cluster import (
    DEFAULT_GPU_MEMORY_MIB,
    GPU_MEMORY_LABEL,
    Cluster,
    _selects,
    assign_gpus,
    demand_rps,
    is_ready,
    pod_gpus,
    pod_rates,
    profile_for,
    queue_limit_for,
    shared_gpu_holders,
)
from infra.sandbox.fleet_simulator.exposition import Exposition, _dcgm_samples, _device_labels, _pod_labels
from infra.sandbox.fleet_simulator.replicas import SimulatedReplica, container_args
from infra.sandbox.apikeys import authenticate, enforced
from infra.sandbox.gateway import UpstreamStats, backend_for, headers_set_by, is_pool
from infra.sandbox.lora import LoraAdapters, ModelRequests, lora_settings
from infra.sandbox.ratelimit import TOKEN_FAMILY, Admission, TokenGate
from infra.sandbox.fleet_simulator.vllm_args import GPU_RESOURCE, LABEL_APP, LABEL_MODEL, LABEL_VERSION, gpu_memory_utilization

log = logging.getLogger("tideplane.fleet")

PROXY_TIMEOUT_S = 120.0  # real seconds a proxied request waits for its engine


@dataclass
class PodInfo:
    namespace: str
    name: str
    deployment: str
    version: str
    model: str
    node: str


class FleetSimulator:
    """All simulated replicas and GPUs; thread-safe (the HTTP server and the tick loop share it)."""

    def __init__(self, time_scale: float = 1.0, seed: int | None = None):
        self.time_scale = time_scale
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.cluster = Cluster()
        self.replicas: dict[tuple[str, str], tuple[PodInfo, SimulatedReplica]] = {}
        self.gpus: dict[str, list[str | None]] = {}
        self.shared_gpus: dict[str, list[list[str]]] = {}  # time-sliced node -> pods on each physical GPU
        self.clock = 0.0  # sandbox seconds simulated so far
        self._demand_since: dict[str, tuple[Demand, float]] = {}  # key -> (demand, clock when set)
        self._round_robin = 0
        self.mirrors = MirrorLog()  # answers to requests mirrored by an HTTPRoute (infra/sandbox/answers.py)
        self.queue_full: dict[tuple[str, str], int] = {}  # (namespace, route) -> requests the gateway refused
        # What the gateway answered per backend (Envoy's counters): every pod's answers (the demand
        # arrives through the route), and the 503s for a backend Service with no Ready pod (a lost
        # canary pod's share, which no pod counts)
        self.upstream = UpstreamStats()
        self._answered: dict[tuple[str, str], tuple[int, int]] = {}  # pod -> (success, errors) counted so far
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
                        replica = SimulatedReplica(profile, random.Random(self.rng.random()), clock=self.clock, args=container_args(pod))
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
            unserved: dict[tuple[str, str, str], float] = {}
            rates = pod_rates(demand, cluster.routes, cluster.services, cluster.pods, unserved)
            for backend, rps in unserved.items():
                self.upstream.found_none_healthy(backend, rps * dt)
            for key, (info, replica) in self.replicas.items():
                replica.set_profile(profile_for(cluster.profiles, info.model, info.version))
                replica.advance(rates.get(key, 0.0) if is_ready(present[key]) else 0.0, dt)
            self._count_answers()
            self._queued = {key: replica.waiting + len(replica.engine.inbound) for key, (_, replica) in self.replicas.items()}
            self._assign_gpus(present)
            self.mirrors.advance(demand, cluster.routes, self._serving_version, dt)

    def _count_answers(self) -> None:
        """Each replica's answers since the last tick, as the gateway's upstream answers for its version."""
        counted = {}
        for key, (info, replica) in self.replicas.items():
            success, errors = self._answered.get(key, (0, 0))
            if replica.success != success or replica.errors != errors:
                self.upstream.answered((info.namespace, info.deployment, info.version), replica.success - success, replica.errors - errors)
            counted[key] = (replica.success, replica.errors)
        self._answered = counted

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

    def route(self, namespace: str, service: str) -> tuple[PodInfo, SimulatedReplica] | None:
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

    def gateway_route(self, namespace: str, route: str, headers, path: str = "/v1/completions") -> tuple[PodInfo, SimulatedReplica] | str:
        """The replica the gateway sends a request for ``path`` on ``route`` to, or why none (infra/sandbox/gateway.py)."""
        with self.lock:
            found = next((r for r in self.cluster.routes if r["metadata"].get("namespace") == namespace
                          and r["metadata"]["name"] == route), None)
            backend = backend_for(found, headers, self.rng.random(), path) if found else None
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
            svc = next((s for s in self.cluster.services if s["metadata"].get("namespace") == namespace and s["metadata"]["name"] == service), None)
            version = (((svc or {}).get("spec") or {}).get("selector") or {}).get(LABEL_VERSION, "")
        found_replica = self.route(namespace, service)
        if found_replica is None:
            self.upstream.found_none_healthy((namespace, route, version))
        return found_replica or f"no Ready pod behind service {namespace}/{service}"
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
        """The cluster's exporters: dcgm-exporter's and kube-state-metrics' series. No engine series
        (each pod serves its own on its address, pod_metrics) and no gateway's (gateway_metrics)."""
        with self.lock:
            out = Exposition()
            self._dcgm(out)
            self._node_labels(out)
            return out.text()

    def gateway_metrics(self) -> str:
        """The gateway's own series, as its proxy (Envoy), endpoint picker and AI gateway label them:
        by the route's namespace and name and, for Envoy's counters, the backend's deployment and version."""
        with self.lock:
            out = Exposition()
            for (namespace, route), count in self.queue_full.items():
                out.sample("envoy_cluster_upstream_rq_pending_overflow", "counter", "Requests the gateway refused: queue full.",
                           {"namespace": namespace, "deployment": route}, count)
            for family, help_text, labels, count in self.upstream.samples():
                out.sample(family, "counter", help_text, labels, count)
            self.model_requests.expose(out)
            self._token_usage(out)
            return out.text()

    def pod_metrics(self, namespace: str, name: str) -> str | None:
        """One pod's ``/metrics`` as its vLLM server writes it: vLLM's families, labelled ``model_name``
        and ``engine`` only (the HTTP server's, ``handler``/``method``/``status``); None: no such replica."""
        with self.lock:
            found = self.replicas.get((namespace, name))
            if found is None:
                return None
            info, replica = found
            out = Exposition()
            _engine_samples(out, replica, {"model_name": info.model, "engine": "0"})
            return out.text()

    def gateway_authenticate(self, namespace: str, route: str, headers) -> dict[str, str] | tuple[int, str]:
        """The route's SecurityPolicy on a request: the headers it goes on with (the tenant from its
        API key), or (status, why) it is refused (infra/sandbox/apikeys.py)."""
        with self.lock:
            policy = enforced(self.cluster.security_policies, namespace, route)
            secrets = self.cluster.secrets
        return authenticate(policy, secrets, headers)

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

    def pod(self, namespace: str, name: str) -> tuple[PodInfo, SimulatedReplica] | None:
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


def _engine_samples(out: Exposition, replica: SimulatedReplica, labels: dict[str, str]) -> None:
    """A replica's vLLM families (vllm/v1/metrics/loggers.py names, types and HELP) and its HTTP
    server's ``http_requests_total`` (prometheus-fastapi-instrumentator: status grouped 2xx/5xx)."""
    out.sample("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", labels, replica.waiting)
    out.sample("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", labels, replica.running)
    out.sample("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", labels, round(replica.kv_cache_usage, 4))
    out.sample("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", labels, replica.preemptions)
    for name, (_, help_text) in HISTOGRAMS.items():
        out.histogram(name, help_text, labels, replica.histograms[name])
    out.sample("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", labels, replica.prompt_tokens)
    out.sample("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", labels, replica.generation_tokens)
    out.sample("vllm:request_success_total", "counter", "Count of successfully processed requests.", {**labels, "finished_reason": "length"}, replica.success)
    for status, count in (("2xx", replica.success), ("5xx", replica.errors)):
        out.sample("http_requests_total", "counter", "Total number of requests by method, status and handler.",
                   {"method": "POST", "status": status, "handler": "/v1/completions"}, count)
