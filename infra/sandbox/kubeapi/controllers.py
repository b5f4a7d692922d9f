"""Simulated control plane: deployment controller, scheduler, kubelet, node lifecycle and events.

One background thread reconciles everything while holding the store lock, woken by any write
(or by the next kubelet readiness deadline), so an idle sandbox costs no CPU. Durations are
sandbox seconds divided by the time scale.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import threading
import time
import uuid
from collections import Counter
from typing import Any

import yaml

from infra.sandbox.config import PROFILES_CONFIGMAP, SANDBOX_NAMESPACE
from workflows.naming import GPU_RESOURCE, LABEL_MODEL, LABEL_VERSION

from .api import pod_ready
from .quantity import parse_quantity
from .resources import BY_KEY
from .store import Store, now_iso
from .validation import prepare, random_suffix, reset_status_on_create

log = logging.getLogger(__name__)

PODS, NODES, EVENTS = BY_KEY["pods"], BY_KEY["nodes"], BY_KEY["events"]
DEPLOYMENTS, CONFIGMAPS = BY_KEY["deployments.apps"], BY_KEY["configmaps"]
NAMESPACES = BY_KEY["namespaces"]
DEFAULT_LOAD_SECONDS = 30.0
MAX_EVENTS = 2000
HASH_LABEL = "pod-template-hash"
NAMESPACE_SYNC_SECONDS = 0.5  # real seconds a Terminating namespace lasts at least


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def node_ready(node: dict[str, Any]) -> bool:
    cond = condition(node, "Ready")
    return bool(cond and cond.get("status") == "True")


def set_condition(conditions: list[dict[str, Any]], kind: str, status: str, reason: str | None = None,
                  message: str | None = None) -> None:
    """Set a condition in place, keeping lastTransitionTime unless the status changes."""
    old = next((c for c in conditions if c.get("type") == kind), None)
    new: dict[str, Any] = {"type": kind, "status": status}
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    if old and old.get("status") == status:
        for k in ("lastProbeTime", "lastUpdateTime", "lastTransitionTime"):
            if k in old:
                new[k] = old[k]
        if "lastUpdateTime" in old and (old.get("reason"), old.get("message")) != (reason, message):
            new["lastUpdateTime"] = now_iso()
    else:
        ts = now_iso()
        if kind in ("Available", "Progressing"):
            new["lastUpdateTime"] = ts
        else:
            new["lastProbeTime"] = None
        new["lastTransitionTime"] = ts
    if old:
        conditions[conditions.index(old)] = new
    else:
        conditions.append(new)


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


def template_hash(template: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return "".join("bcdfghjklmnpqrstvwxz2456789"[int(digest[i:i + 2], 16) % 27] for i in range(0, 20, 2))


def _int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        exact = total * int(value[:-1]) / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value or 0)


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

    def stop(self) -> None:
        self.stopping.set()
        self.store.dirty.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            now = time.monotonic()
            upcoming = [t - now for t in [*self.ready_at.values(), *self.namespace_due.values()] if t > now]
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
        for dep in self.store.list(DEPLOYMENTS):
            self.sync_deployment(dep)
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

    # -- deployment controller ----------------------------------------------------------------
    def sync_deployment(self, dep: dict[str, Any]) -> None:
        spec, meta = dep["spec"], dep["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        pods = [p for p in self.store.list(PODS, ns)
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]
        current = template_hash(spec["template"])
        desired = spec.get("replicas", 1)
        strategy = spec.get("strategy") or {}
        rolling = strategy.get("rollingUpdate") or {}
        surge = _int_or_percent(rolling.get("maxSurge", "25%"), desired, True)
        unavailable = _int_or_percent(rolling.get("maxUnavailable", "25%"), desired, False)
        if surge == 0 and unavailable == 0:
            unavailable = 1
        if strategy.get("type") == "Recreate":
            surge, unavailable = 0, 0  # Available only when every replica is ready
        if not spec.get("paused"):
            new = [p for p in pods if p["metadata"].get("labels", {}).get(HASH_LABEL) == current]
            old = [p for p in pods if p not in new]
            if not old:
                self._scale_pods(dep, new, desired, current)
            elif strategy.get("type") == "Recreate":
                for p in old:
                    self._delete_pod(dep, p)
            else:
                self._roll(dep, new, old, desired, surge, unavailable, current)
            pods = [p for p in self.store.list(PODS, ns)
                    if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]
        self._deployment_status(dep, pods, current, desired, unavailable)

    def _roll(self, dep, new, old, desired, surge, unavailable, current) -> None:
        room = desired + surge - len(new) - len(old)
        want_new = min(desired, len(new) + max(room, 0))
        self._scale_pods(dep, new, want_new if want_new > len(new) else min(len(new), desired), current)
        ready = sum(1 for p in new + old if pod_ready(p))
        can_remove = ready - (desired - unavailable)
        for p in sorted(old, key=pod_ready):
            if not pod_ready(p):
                self._delete_pod(dep, p)
            elif can_remove > 0:
                can_remove -= 1
                self._delete_pod(dep, p)

    def _scale_pods(self, dep: dict[str, Any], pods: list[dict[str, Any]], want: int, current: str) -> None:
        for _ in range(want - len(pods)):
            self._create_pod(dep, current)
        if len(pods) > want:
            # Remove unscheduled, then not-ready, then the newest pods first.
            newest = sorted(pods, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]),
                            reverse=True)
            victims = sorted(newest, key=lambda p: (bool(p["spec"].get("nodeName")), pod_ready(p)))
            for p in victims[: len(pods) - want]:
                self._delete_pod(dep, p)

    def _create_pod(self, dep: dict[str, Any], current: str) -> None:
        meta = dep["metadata"]
        template = copy.deepcopy(dep["spec"]["template"])
        tmeta = template.get("metadata") or {}
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{current}-{random_suffix()}", "namespace": meta["namespace"],
                "labels": {**(tmeta.get("labels") or {}), HASH_LABEL: current},
                "annotations": tmeta.get("annotations") or {},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": template.get("spec") or {},
        }
        pod = prepare(PODS, pod, creating=True)
        reset_status_on_create(PODS, pod)
        created = self.store.create(PODS, pod)
        self.record(dep, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}",
                    "deployment-controller")

    def _delete_pod(self, dep: dict[str, Any], pod: dict[str, Any]) -> None:
        self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        self.record(dep, "Normal", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}",
                    "deployment-controller")

    def _deployment_status(self, dep, pods, current, desired, unavailable) -> None:
        updated = sum(1 for p in pods if p["metadata"].get("labels", {}).get(HASH_LABEL) == current)
        ready = sum(1 for p in pods if pod_ready(p))
        old_status = dep.get("status") or {}
        status: dict[str, Any] = {"observedGeneration": dep["metadata"].get("generation", 1)}
        for key, value in (("replicas", len(pods)), ("updatedReplicas", updated), ("readyReplicas", ready),
                           ("availableReplicas", ready), ("unavailableReplicas", max(len(pods), desired) - ready)):
            if value > 0:
                status[key] = value
        conditions = copy.deepcopy(old_status.get("conditions") or [])
        name = dep["metadata"]["name"]
        if ready >= desired - unavailable:
            set_condition(conditions, "Available", "True", "MinimumReplicasAvailable",
                          "Deployment has minimum availability.")
        else:
            set_condition(conditions, "Available", "False", "MinimumReplicasUnavailable",
                          "Deployment does not have minimum availability.")
        if updated == desired == len(pods) and ready >= desired:
            set_condition(conditions, "Progressing", "True", "NewReplicaSetAvailable",
                          f'ReplicaSet "{name}-{current}" has successfully progressed.')
        else:
            set_condition(conditions, "Progressing", "True", "ReplicaSetUpdated",
                          f'ReplicaSet "{name}-{current}" is progressing.')
        status["conditions"] = conditions
        if status != old_status:
            new = copy.deepcopy(dep)
            new["status"] = status
            self.store.update(DEPLOYMENTS, new)

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
