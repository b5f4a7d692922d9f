"""Simulated control plane: namespace and node lifecycle, scheduler, events; the deployment
controllers (workloads.py) and the kubelet (kubelet.py) run in the same pass.

One background thread reconciles everything while holding the store lock, woken by any write
(or by the next timer: a readiness, restart, termination or eviction deadline), so an idle
sandbox costs no CPU. Durations are
sandbox seconds divided by the time scale.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
import uuid
from collections import Counter
from typing import Any

from . import gpushare
from .conditions import condition, node_ready, set_condition
from .kubelet import Kubelet
from .networking import Networking
from .predicates import node_affinity_matches, term_matches, tolerates
from .quantity import parse_quantity
from .resources import BY_KEY
from .store import Store
from .timestamps import now_iso
from .workloads import Workloads

log = logging.getLogger(__name__)

PODS, NODES, EVENTS = BY_KEY["pods"], BY_KEY["nodes"], BY_KEY["events"]
NAMESPACES = BY_KEY["namespaces"]
MAX_EVENTS = 2000
NOT_READY_TAINT, UNREACHABLE_TAINT = "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"
NAMESPACE_SYNC_SECONDS = 0.5  # real seconds a Terminating namespace lasts at least


def pod_requests(spec: dict[str, Any]) -> Counter:
    """Resource requests of a pod (limits stand in for missing requests), init containers taken as a max."""
    def of(container: dict[str, Any]) -> Counter:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return Counter({k: parse_quantity(v) for k, v in merged.items()})

    total: Counter = Counter()
    for c in spec.get("containers") or []:
        total.update(of(c))
    for c in spec.get("initContainers") or []:
        for k, v in of(c).items():
            total[k] = max(total[k], v)
    return total


def preference_score(pod_spec: dict[str, Any], node: dict[str, Any]) -> int:
    preferred = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("preferredDuringSchedulingIgnoredDuringExecution")) or []
    return sum(p.get("weight", 1) for p in preferred if term_matches(node, p.get("preference") or {}))


def _owners(pod: dict[str, Any]) -> list[str]:
    return [r["uid"] for r in pod["metadata"].get("ownerReferences") or [] if r.get("uid")]


class Controllers(threading.Thread):
    """Reconciles deployments, schedules pods, runs the kubelet and node lifecycle."""

    def __init__(self, store: Store, time_scale: float, pod_network: str = "10.244"):
        super().__init__(name="kubeapi-controllers", daemon=True)
        self.store = store
        self.time_scale = time_scale
        self.namespace_due: dict[str, float] = {}  # Terminating namespace uid -> when it is removed
        self.events: dict[tuple[str, str, str], str] = {}  # (uid, reason, message) -> Event name
        self.ip_counter = 0
        self.pod_network = pod_network  # pod IPs are <pod_network>.x.y
        self.stopping = threading.Event()
        self.workloads = Workloads(self)
        self.kubelet = Kubelet(self)
        self.networking = Networking(self)
        self.taint_seen: dict[tuple[str, str], float] = {}  # (node, NoExecute taint key) -> when first seen
        self.evict_at: list[float] = []  # when a tolerated NoExecute taint's window closes

    def stop(self) -> None:
        self.stopping.set()
        self.store.dirty.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            now = time.monotonic()
            upcoming = [t - now for t in [*self.kubelet.due(), *self.namespace_due.values(),
                                          *self.workloads.wake_at, *self.evict_at,
                                          *self.networking.wake_at] if t > now]
            self.store.dirty.wait(min([1.0, *upcoming]) + 0.01)
            self.store.dirty.clear()
            try:
                with self.store.lock:
                    self.reconcile()
            except Exception:  # a bug in one pass must not stop the simulated control plane
                log.exception("controller pass failed")
                time.sleep(0.5)

    def reconcile(self) -> None:
        self.namespace_lifecycle()
        self.node_lifecycle()
        self.workloads.reconcile()
        self.schedule()
        self.kubelet.reconcile({n["metadata"]["name"]: n for n in self.store.list(NODES)})
        self.networking.reconcile()

    # -- events -----------------------------------------------------------------------------
    def record(self, obj: dict[str, Any], kind: str, reason: str, message: str, component: str) -> None:
        """Emit a core/v1 Event, counting repeats like the real event recorder."""
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        key = (meta["uid"], reason, message)
        ts = now_iso()
        existing = self.store.try_get(EVENTS, ns, self.events.get(key, ""))
        if existing:
            event = copy.deepcopy(existing)
            event["count"] = event.get("count", 1) + 1
            event["lastTimestamp"] = ts
            self.store.update(EVENTS, event)
            return
        if ("", ns) not in self.store.objects["namespaces"]:
            return
        name = f"{meta['name']}.{uuid.uuid4().hex[:16]}"
        self.events[key] = name
        self.store.create(EVENTS, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"), "name": meta["name"],
                               "namespace": meta.get("namespace"), "uid": meta["uid"],
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message, "type": kind, "count": 1,
            "source": {"component": component}, "firstTimestamp": ts, "lastTimestamp": ts,
            "reportingComponent": component, "reportingInstance": component,
        })
        events = self.store.objects[EVENTS.key]
        if len(events) > MAX_EVENTS:
            oldest = sorted(events.values(), key=lambda e: int(e["metadata"]["resourceVersion"]))[: len(events) - MAX_EVENTS]
            for e in oldest:
                self.store.delete(EVENTS, e["metadata"]["namespace"], e["metadata"]["name"])
            live = {e["metadata"]["name"] for e in events.values()}
            self.events = {k: v for k, v in self.events.items() if v in live}

    # -- namespace controller ---------------------------------------------------------------
    def namespace_lifecycle(self) -> None:
        """A Terminating namespace is emptied, then removed (its `kubernetes` finalizer done), a
        moment after its deletion as the real namespace controller's work takes: until then its
        objects can still be read and deleted (`kubectl delete -f` of a namespace and its content)."""
        now = time.monotonic()
        for ns in self.store.list(NAMESPACES):
            meta = ns["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            due = self.namespace_due.setdefault(meta["uid"], now + NAMESPACE_SYNC_SECONDS)
            if now >= due and not meta.get("finalizers"):
                self.store.delete(NAMESPACES, "", meta["name"])
                del self.namespace_due[meta["uid"]]

    # -- node lifecycle ---------------------------------------------------------------------
    def node_lifecycle(self) -> None:
        """Pods on a deleted node are garbage-collected at once; a node that is not Ready gets the
        node.kubernetes.io/not-ready (Ready False) or unreachable (Unknown) NoExecute taint; a
        NoExecute taint evicts the pods that do not tolerate it at once, and those that tolerate it
        for tolerationSeconds (300 s by default admission) when that window has passed."""
        now = time.monotonic()
        self.evict_at = []
        nodes = {}
        for node in self.store.list(NODES):
            nodes[node["metadata"]["name"]] = self._lifecycle_taints(node)
        seen = set()
        for node in nodes.values():
            for taint in (node.get("spec") or {}).get("taints") or []:
                if taint.get("effect") == "NoExecute":
                    key = (node["metadata"]["name"], taint.get("key", ""))
                    seen.add(key)
                    self.taint_seen.setdefault(key, now)
        self.taint_seen = {k: v for k, v in self.taint_seen.items() if k in seen}
        for pod in self.store.list(PODS):
            node_name = pod["spec"].get("nodeName")
            if not node_name:
                continue
            node = nodes.get(node_name)
            meta = pod["metadata"]
            if node is None:
                self.record(pod, "Warning", "NodeNotFound", f"Node {node_name} was deleted; deleting pod", "node-controller")
                self.store.delete(PODS, meta["namespace"], meta["name"])
                continue
            if meta.get("deletionTimestamp"):
                continue
            taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
            due = [self._eviction_due(pod, node_name, t) for t in taints]
            if any(t <= now for t in due):
                self.record(pod, "Normal", "TaintManagerEviction",
                            f"Marking for deletion Pod {meta['namespace']}/{meta['name']}", "taint-eviction-controller")
                self.delete_pod(pod)
            else:
                self.evict_at += [t for t in due if t != math.inf]

    def _lifecycle_taints(self, node: dict[str, Any]) -> dict[str, Any]:
        """Keep the not-ready/unreachable NoExecute taint in step with the node's Ready condition."""
        cond = condition(node, "Ready")
        status = (cond or {}).get("status", "True")
        wanted = {"False": NOT_READY_TAINT, "Unknown": UNREACHABLE_TAINT}.get(status)
        taints = (node.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t.get("key") not in (NOT_READY_TAINT, UNREACHABLE_TAINT)]
        if wanted:
            kept.append(next((t for t in taints if t.get("key") == wanted),
                             {"key": wanted, "effect": "NoExecute", "timeAdded": now_iso()}))
        if kept == taints:
            return node
        new = copy.deepcopy(node)
        new.setdefault("spec", {})["taints"] = kept
        return self.store.update(NODES, new)

    def _eviction_due(self, pod: dict[str, Any], node_name: str, taint: dict[str, Any]) -> float:
        """When a NoExecute taint evicts the pod: now if not tolerated, never if tolerated for ever."""
        matching = [t for t in pod["spec"].get("tolerations") or [] if tolerates([t], taint)]
        if not matching:
            return 0.0
        windows = [t["tolerationSeconds"] for t in matching if t.get("tolerationSeconds") is not None]
        if len(windows) < len(matching):
            return math.inf
        return self.taint_seen[(node_name, taint.get("key", ""))] + max(0, min(windows)) / self.time_scale

    def delete_pod(self, pod: dict[str, Any]) -> None:
        """Delete as a controller does, through the API: gracefully."""
        self.store.delete_pod(pod)

    # -- scheduler ----------------------------------------------------------------------------
    def schedule(self) -> None:
        nodes = self.store.list(NODES)
        pods = self.store.list(PODS)
        used: dict[str, Counter] = {n["metadata"]["name"]: Counter() for n in nodes}
        owners_on: dict[str, Counter] = {name: Counter() for name in used}  # controller uid -> pods per node
        for p in pods:
            if p["spec"].get("nodeName") in used and p["status"].get("phase") not in ("Succeeded", "Failed"):
                used[p["spec"]["nodeName"]].update(pod_requests(p["spec"]) + Counter(pods=1))
                owners_on[p["spec"]["nodeName"]].update(_owners(p))
        # VRAM of shared GPUs (time-slicing / MPS replicas): claimed fraction per physical GPU
        live = [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]
        vram = {n["metadata"]["name"]: gpushare.used_fractions(n, [p for p in live if p["spec"].get("nodeName") == n["metadata"]["name"]])
                for n in nodes if gpushare.shared_resource(n)}
        pending = [p for p in pods if not p["spec"].get("nodeName") and p["status"].get("phase") == "Pending"]
        for pod in sorted(pending, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"])):
            request = pod_requests(pod["spec"]) + Counter(pods=1)
            reasons: Counter = Counter()
            feasible = []
            gpu_of: dict[str, tuple[int, float]] = {}  # shared node -> (GPU index, claimed fraction)
            for node in nodes:
                name = node["metadata"]["name"]
                why = self._unfit(pod, node, request, used[name])
                if not why and name in vram:
                    fraction = gpushare.claim(pod["spec"], gpushare.shared_resource(node))
                    index = gpushare.pick_gpu(vram[name], fraction, gpushare.policy(pod)) if fraction else None
                    if fraction and index is None:
                        why = gpushare.no_room_message(fraction)
                    elif fraction:
                        gpu_of[name] = (index, fraction)
                if why:
                    reasons[why] += 1
                else:
                    feasible.append(node)
            if feasible:
                node = min(feasible, key=lambda n: self._rank(pod, n, used[n["metadata"]["name"]],
                                                              owners_on[n["metadata"]["name"]]))
                name = node["metadata"]["name"]
                used[name].update(request)
                owners_on[name].update(_owners(pod))
                shared_gpu = gpu_of.get(name)
                if shared_gpu:
                    vram[name][shared_gpu[0]] += shared_gpu[1]
                self._bind(pod, node, shared_gpu[0] if shared_gpu else None)
            else:
                detail = ", ".join(f"{count} {why}" for why, count in sorted(reasons.items()))
                message = (f"0/{len(nodes)} nodes are available: {detail}. preemption: not eligible."
                           if nodes else "no nodes available to schedule pods")
                self._unschedulable(pod, message)

    def _unfit(self, pod: dict[str, Any], node: dict[str, Any], request: Counter, used: Counter) -> str | None:
        spec = node.get("spec") or {}
        tolerations = pod["spec"].get("tolerations")
        if not node_ready(node):
            return "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
        if spec.get("unschedulable") and not tolerates(
                tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
            return "node(s) were unschedulable"
        if not node_affinity_matches(pod["spec"], node):
            return "node(s) didn't match Pod's node affinity/selector"
        for taint in spec.get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
                return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        for resource, amount in sorted(request.items()):
            if amount <= 0:
                continue
            if resource not in allocatable:
                if resource in ("cpu", "memory", "pods", "ephemeral-storage"):
                    continue  # the node did not declare it: do not constrain
                return f"Insufficient {resource}"
            if used[resource] + amount > parse_quantity(allocatable[resource]):
                return f"Insufficient {resource}"
        return None

    @staticmethod
    def _rank(pod: dict[str, Any], node: dict[str, Any], used: Counter, owners_on: Counter) -> tuple:
        """Lower is better: preferred affinity, then spreading a deployment's pods, then free GPUs."""
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        free_gpu = parse_quantity(allocatable.get(gpushare.GPU_RESOURCE, 0)) - used[gpushare.GPU_RESOURCE]
        siblings = sum(owners_on[uid] for uid in _owners(pod))
        return (-preference_score(pod["spec"], node), siblings, -free_gpu, node["metadata"]["name"])

    def _bind(self, pod: dict[str, Any], node: dict[str, Any], gpu_index: int | None = None) -> None:
        new = copy.deepcopy(pod)
        node_name = node["metadata"]["name"]
        new["spec"]["nodeName"] = node_name
        if gpu_index is not None:
            new["metadata"]["annotations"] = {**(new["metadata"].get("annotations") or {}), gpushare.GPU_INDEX_ANNOTATION: str(gpu_index)}
        conditions = new["status"].setdefault("conditions", [])
        set_condition(conditions, "PodScheduled", "True")
        self.store.update(PODS, new)
        meta = pod["metadata"]
        self.record(pod, "Normal", "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {node_name}",
                    "default-scheduler")

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        cond = condition(pod, "PodScheduled")
        if cond and cond.get("status") == "False" and cond.get("message") == message:
            return
        new = copy.deepcopy(pod)
        set_condition(new["status"].setdefault("conditions", []), "PodScheduled", "False", "Unschedulable", message)
        self.store.update(PODS, new)
        self.record(pod, "Warning", "FailedScheduling", message, "default-scheduler")
