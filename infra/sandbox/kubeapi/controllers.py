"""Simulated control plane: deployment controller, scheduler, kubelet, node lifecycle and events.

One background thread reconciles everything while holding the store lock, woken by any write
(or by the next kubelet readiness deadline), so an idle sandbox costs no CPU. Durations are
sandbox seconds divided by the time scale.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
from collections import Counter
from typing import Any

import yaml

from infra.sandbox.config import PROFILES_CONFIGMAP, SANDBOX_NAMESPACE
from workflows.naming import GPU_RESOURCE, LABEL_MODEL, LABEL_VERSION

from .api import pod_ready
from .conditions import condition, set_condition
from .deployments import Workloads
from .quantity import parse_quantity
from .resources import BY_KEY
from .store import Store, now_iso

log = logging.getLogger(__name__)

PODS, NODES, EVENTS = BY_KEY["pods"], BY_KEY["nodes"], BY_KEY["events"]
CONFIGMAPS = BY_KEY["configmaps"]
NAMESPACES = BY_KEY["namespaces"]
DEFAULT_LOAD_SECONDS = 30.0
MAX_EVENTS = 2000
NAMESPACE_SYNC_SECONDS = 0.5  # real seconds a Terminating namespace lasts at least


def node_ready(node: dict[str, Any]) -> bool:
    cond = condition(node, "Ready")
    return bool(cond and cond.get("status") == "True")


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


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression(labels: dict[str, str], expr: dict[str, Any]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels:
        try:
            a, b = int(labels[key]), int(values[0])
        except (ValueError, IndexError):
            return False
        return a > b if op == "Gt" else a < b
    return False


def term_matches(node: dict[str, Any], term: dict[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    return (all(_expression(labels, e) for e in term.get("matchExpressions") or [])
            and all(_expression(fields, e) for e in term.get("matchFields") or []))


def node_affinity_matches(pod_spec: dict[str, Any], node: dict[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True
    return any(term_matches(node, t) for t in required.get("nodeSelectorTerms") or [])


def preference_score(pod_spec: dict[str, Any], node: dict[str, Any]) -> int:
    preferred = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("preferredDuringSchedulingIgnoredDuringExecution")) or []
    return sum(p.get("weight", 1) for p in preferred if term_matches(node, p.get("preference") or {}))


def _owners(pod: dict[str, Any]) -> list[str]:
    return [r["uid"] for r in pod["metadata"].get("ownerReferences") or [] if r.get("uid")]


class Controllers(threading.Thread):
    """Reconciles deployments, schedules pods, runs the kubelet and node lifecycle."""

    def __init__(self, store: Store, time_scale: float):
        super().__init__(name="kubeapi-controllers", daemon=True)
        self.store = store
        self.time_scale = time_scale
        self.ready_at: dict[str, float] = {}  # pod uid -> monotonic time it becomes Ready
        self.namespace_due: dict[str, float] = {}  # Terminating namespace uid -> when it is removed
        self.events: dict[tuple[str, str, str], str] = {}  # (uid, reason, message) -> Event name
        self.ip_counter = 0
        self.stopping = threading.Event()
        self.workloads = Workloads(self)

    def stop(self) -> None:
        self.stopping.set()
        self.store.dirty.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            now = time.monotonic()
            upcoming = [t - now for t in [*self.ready_at.values(), *self.namespace_due.values(),
                                          *self.workloads.wake_at] if t > now]
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
        self.kubelet()

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
        """Pods on a deleted node go away; NoExecute taints evict pods that do not tolerate them."""
        nodes = {n["metadata"]["name"]: n for n in self.store.list(NODES)}
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
            taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
            if any(not tolerates(pod["spec"].get("tolerations"), t) for t in taints):
                self.record(pod, "Normal", "TaintManagerEviction",
                            f"Marking for deletion Pod {meta['namespace']}/{meta['name']}", "taint-controller")
                self.store.delete(PODS, meta["namespace"], meta["name"])

    def delete_pod(self, pod: dict[str, Any]) -> None:
        self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])

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
        pending = [p for p in pods if not p["spec"].get("nodeName") and p["status"].get("phase") == "Pending"]
        for pod in sorted(pending, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"])):
            request = pod_requests(pod["spec"]) + Counter(pods=1)
            reasons: Counter = Counter()
            feasible = []
            for node in nodes:
                why = self._unfit(pod, node, request, used[node["metadata"]["name"]])
                if why:
                    reasons[why] += 1
                else:
                    feasible.append(node)
            if feasible:
                node = min(feasible, key=lambda n: self._rank(pod, n, used[n["metadata"]["name"]],
                                                              owners_on[n["metadata"]["name"]]))
                used[node["metadata"]["name"]].update(request)
                owners_on[node["metadata"]["name"]].update(_owners(pod))
                self._bind(pod, node)
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
        free_gpu = parse_quantity(allocatable.get(GPU_RESOURCE, 0)) - used[GPU_RESOURCE]
        siblings = sum(owners_on[uid] for uid in _owners(pod))
        return (-preference_score(pod["spec"], node), siblings, -free_gpu, node["metadata"]["name"])

    def _bind(self, pod: dict[str, Any], node: dict[str, Any]) -> None:
        new = copy.deepcopy(pod)
        node_name = node["metadata"]["name"]
        new["spec"]["nodeName"] = node_name
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

    # -- kubelet ------------------------------------------------------------------------------
    def load_seconds(self, pod: dict[str, Any]) -> float:
        """The model's load time from the fleet-profiles ConfigMap, at least the readiness delay."""
        labels = pod["metadata"].get("labels") or {}
        model, version = labels.get(LABEL_MODEL), labels.get(LABEL_VERSION)
        cm = self.store.try_get(CONFIGMAPS, SANDBOX_NAMESPACE, PROFILES_CONFIGMAP)
        data = (cm or {}).get("data") or {}
        seconds = DEFAULT_LOAD_SECONDS
        for key in (f"{model}@{version}", model, "default"):
            if key and key in data:
                try:
                    profile = yaml.safe_load(data[key])
                    seconds = float(profile.get("load_seconds", DEFAULT_LOAD_SECONDS))
                    break
                except (yaml.YAMLError, AttributeError, TypeError, ValueError):
                    log.warning("unreadable profile %s in %s/%s", key, SANDBOX_NAMESPACE, PROFILES_CONFIGMAP)
        delays = [(c.get("readinessProbe") or {}).get("initialDelaySeconds", 0) for c in pod["spec"]["containers"]]
        return max([seconds, *delays])

    def kubelet(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self.store.list(NODES)}
        now = time.monotonic()
        live = set()
        for pod in self.store.list(PODS):
            live.add(pod["metadata"]["uid"])
            node = nodes.get(pod["spec"].get("nodeName") or "")
            if node is None:
                continue
            phase = pod["status"].get("phase")
            if phase == "Pending":
                self._start(pod, node, now)
            elif phase == "Running":
                ready = node_ready(node) and now >= self.ready_at.get(pod["metadata"]["uid"], 0)
                if ready != pod_ready(pod):
                    self._set_ready(pod, ready)
        for uid in [u for u in self.ready_at if u not in live]:
            del self.ready_at[uid]

    def _start(self, pod: dict[str, Any], node: dict[str, Any], now: float) -> None:
        self.ip_counter += 1
        ts = now_iso()
        new = copy.deepcopy(pod)
        addresses = (node.get("status") or {}).get("addresses") or []
        host_ip = next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "10.0.0.1")
        status = new["status"]
        status.update(phase="Running", startTime=ts, hostIP=host_ip,
                      podIP=f"10.244.{self.ip_counter // 250 % 250}.{self.ip_counter % 250 + 1}")
        status["podIPs"] = [{"ip": status["podIP"]}]
        status["containerStatuses"] = [
            {"name": c["name"], "image": c["image"], "imageID": f"docker-pullable://{c['image']}",
             "containerID": f"containerd://{uuid.uuid4().hex}", "ready": False, "started": True,
             "restartCount": 0, "state": {"running": {"startedAt": ts}}}
            for c in pod["spec"]["containers"]
        ]
        conditions = status.setdefault("conditions", [])
        set_condition(conditions, "PodScheduled", "True")
        set_condition(conditions, "Initialized", "True")
        set_condition(conditions, "ContainersReady", "False", "ContainersNotReady", "containers with unready status")
        set_condition(conditions, "Ready", "False", "ContainersNotReady", "containers with unready status")
        self.ready_at[pod["metadata"]["uid"]] = now + self.load_seconds(pod) / self.time_scale
        self.store.update(PODS, new)
        for c in pod["spec"]["containers"]:
            self.record(pod, "Normal", "Pulled", f'Container image "{c["image"]}" already present on machine', "kubelet")
            self.record(pod, "Normal", "Started", f"Started container {c['name']}", "kubelet")

    def _set_ready(self, pod: dict[str, Any], ready: bool) -> None:
        new = copy.deepcopy(pod)
        status = new["status"]
        for cs in status.get("containerStatuses") or []:
            cs["ready"] = ready
        conditions = status.setdefault("conditions", [])
        if ready:
            set_condition(conditions, "ContainersReady", "True")
            set_condition(conditions, "Ready", "True")
        else:
            set_condition(conditions, "ContainersReady", "False", "ContainersNotReady", "containers with unready status")
            set_condition(conditions, "Ready", "False", "ContainersNotReady", "containers with unready status")
        self.store.update(PODS, new)
