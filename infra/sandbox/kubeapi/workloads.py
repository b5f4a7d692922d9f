"""Deployment and ReplicaSet controllers: a ReplicaSet per pod template, revisions, rollout conditions.

A Deployment owns one ReplicaSet per template it has had (`<deployment>-<template hash>`, the
revision in the `deployment.kubernetes.io/revision` annotation, `revisionHistoryLimit` old ones
kept), and each ReplicaSet owns its pods, as on a real cluster: `kubectl get rs`, `rollout
history` and `rollout undo` (which copies an old ReplicaSet's template back, reusing that
ReplicaSet under a new revision) work. The rolling update decides pod by pod and the ReplicaSets'
replicas follow. Status: observedGeneration, available replicas counted after `minReadySeconds`,
`Available` and `Progressing` conditions, `ProgressDeadlineExceeded` when no progress was made for
`progressDeadlineSeconds` (sandbox seconds, divided by the time scale like every duration).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from typing import Any

from . import podsecurity
from .api import pod_ready
from .conditions import set_condition
from .control_plane import ControlPlane
from .predicates import node_affinity_matches, tolerates
from .resources import BY_KEY
from .timestamps import now_iso
from .validation import prepare, random_suffix, reset_status_on_create


PODS, REPLICA_SETS, DEPLOYMENTS = BY_KEY["pods"], BY_KEY["replicasets.apps"], BY_KEY["deployments.apps"]
JOBS, DAEMON_SETS, NODES = BY_KEY["jobs.batch"], BY_KEY["daemonsets.apps"], BY_KEY["nodes"]
NAMESPACES = BY_KEY["namespaces"]
HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
DESIRED = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
COMPONENT = "deployment-controller"
HASH_LABEL_DS = "controller-revision-hash"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def deletion_cost(pod: dict[str, Any]) -> int:
    """The pod-deletion-cost annotation (an int32); missing or malformed reads as 0, as in Kubernetes."""
    try:
        cost = int((pod["metadata"].get("annotations") or {}).get(DELETION_COST, 0))
    except (TypeError, ValueError):
        return 0
    return cost if -2**31 <= cost < 2**31 else 0


def _ready_since(pod: dict[str, Any]) -> str:
    return next((c.get("lastTransitionTime") or "" for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == "Ready" and c.get("status") == "True"), "")


def scale_down_order(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods in the order the ReplicaSet controller deletes them (controller_utils ActivePodsWithRanks):
    unscheduled, then Pending < Unknown < Running, not Ready, lower pod-deletion-cost, more of the
    set's pods on the same node (doubled up), Ready for less time, then the newest (times compared
    exactly, not in LogarithmicScaleDown's log2 buckets)."""
    per_node: dict[str, int] = {}
    for p in pods:
        if p["spec"].get("nodeName"):
            per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
    newest = sorted(pods, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]), reverse=True)
    newest = sorted(newest, key=_ready_since, reverse=True)
    return sorted(newest, key=lambda p: (
        bool(p["spec"].get("nodeName")), _PHASE_RANK.get(p["status"].get("phase"), 0), pod_ready(p), deletion_cost(p),
        -per_node.get(p["spec"].get("nodeName") or "", 0)))
# What the DaemonSet controller adds to its pods' tolerations.
DAEMON_TOLERATIONS = (("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
                      ("node.kubernetes.io/disk-pressure", "NoSchedule"), ("node.kubernetes.io/memory-pressure", "NoSchedule"),
                      ("node.kubernetes.io/pid-pressure", "NoSchedule"), ("node.kubernetes.io/unschedulable", "NoSchedule"))


def template_hash(template: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return "".join("bcdfghjklmnpqrstvwxz2456789"[int(digest[i:i + 2], 16) % 27] for i in range(0, 20, 2))


def _int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        exact = total * int(value[:-1]) / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value or 0)


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def _owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def revision(rs: dict[str, Any]) -> int:
    try:
        return int((rs["metadata"].get("annotations") or {}).get(REVISION, "0"))
    except ValueError:
        return 0


class Workloads:
    """The deployment and replica-set controllers of the simulated control plane."""

    def __init__(self, ctl: ControlPlane):
        self.ctl = ctl
        self.store = ctl.store
        self.ready_since: dict[str, float] = {}  # pod uid -> monotonic time it became Ready
        self.progress: dict[str, tuple[tuple, float]] = {}  # deployment uid -> (progress seen, when)
        self.wake_at: list[float] = []  # when a minReadySeconds or progress deadline falls due
        self.refused: set[tuple[str, str]] = set()  # (owner uid, what was refused): Pod Security said no, told once

    def reconcile(self) -> None:
        self.wake_at = []
        now = time.monotonic()
        live = set()
        for pod in self.store.list(PODS):
            uid = pod["metadata"]["uid"]
            live.add(uid)
            if pod_ready(pod):
                self.ready_since.setdefault(uid, now)
            else:
                self.ready_since.pop(uid, None)
        self.ready_since = {u: t for u, t in self.ready_since.items() if u in live}
        deployments = self.store.list(DEPLOYMENTS)
        for dep in deployments:
            self.sync_deployment(dep)
        self.progress = {u: p for u, p in self.progress.items()
                         if u in {d["metadata"]["uid"] for d in deployments}}
        for job in self.store.list(JOBS):
            self.sync_job(job)
        for ds in self.store.list(DAEMON_SETS):
            self.sync_daemon_set(ds)
        controlled = {d["metadata"]["uid"] for d in self.store.list(DEPLOYMENTS)}
        for rs in self.store.list(REPLICA_SETS):
            if not any(r.get("uid") in controlled for r in rs["metadata"].get("ownerReferences") or []):
                self.sync_replica_set(rs)

    # -- availability ---------------------------------------------------------------------------
    def available(self, pod: dict[str, Any], min_ready_seconds: int) -> bool:
        """Ready for at least minReadySeconds (sandbox seconds)."""
        since = self.ready_since.get(pod["metadata"]["uid"])
        if since is None:
            return False
        due = since + min_ready_seconds / self.ctl.time_scale
        if due > time.monotonic():
            self.wake_at.append(due)
            return False
        return True

    # -- replica sets ---------------------------------------------------------------------------
    def _pods_of(self, rs: dict[str, Any]) -> list[dict[str, Any]]:
        """The ReplicaSet's active pods: Terminating ones no longer count (FilterActivePods)."""
        return [p for p in self.store.list(PODS, rs["metadata"]["namespace"])
                if owned_by(p, rs["metadata"]["uid"]) and not p["metadata"].get("deletionTimestamp")]

    def sync_replica_set(self, rs: dict[str, Any]) -> None:
        """A ReplicaSet of its own (no Deployment): keep spec.replicas pods."""
        pods = self._pods_of(rs)
        self._scale_pods(rs, pods, rs["spec"].get("replicas", 1))
        self._rs_status(rs, self._pods_of(rs))

    def _new_replica_set(self, dep: dict[str, Any], current: str, rss: list[dict[str, Any]]) -> dict[str, Any]:
        meta = dep["metadata"]
        template = copy.deepcopy(dep["spec"]["template"])
        template.setdefault("metadata", {}).setdefault("labels", {})[HASH_LABEL] = current
        selector = copy.deepcopy(dep["spec"]["selector"])
        selector.setdefault("matchLabels", {})[HASH_LABEL] = current
        rs = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{meta['name']}-{current}", "namespace": meta["namespace"],
                         "labels": dict(template["metadata"]["labels"]),
                         "annotations": {REVISION: str(max([0, *map(revision, rss)]) + 1),
                                         DESIRED: str(dep["spec"].get("replicas", 1)),
                                         MAX_REPLICAS: str(dep["spec"].get("replicas", 1))},
                         "ownerReferences": [_owner_ref(dep)]},
            "spec": {"replicas": 0, "minReadySeconds": dep["spec"].get("minReadySeconds", 0),
                     "selector": selector, "template": template},
        }
        change_cause = (meta.get("annotations") or {}).get("kubernetes.io/change-cause")
        if change_cause:
            rs["metadata"]["annotations"]["kubernetes.io/change-cause"] = change_cause
        rs = prepare(REPLICA_SETS, rs, creating=True)
        reset_status_on_create(REPLICA_SETS, rs)
        created = self.store.create(REPLICA_SETS, rs)
        self.ctl.record(dep, "Normal", "ScalingReplicaSet", f"Created new replica set \"{rs['metadata']['name']}\"",
                        COMPONENT)
        return created

    def _set_rs(self, dep: dict[str, Any] | None, rs: dict[str, Any], replicas: int,
                annotations: dict[str, str] | None = None) -> dict[str, Any]:
        new = copy.deepcopy(rs)
        new["spec"]["replicas"] = replicas
        new["metadata"].setdefault("annotations", {}).update(annotations or {})
        if new == rs:
            return rs
        old_replicas = rs["spec"].get("replicas", 0)
        if dep is not None and replicas != old_replicas:
            verb = "up" if replicas > old_replicas else "down"
            self.ctl.record(dep, "Normal", "ScalingReplicaSet",
                            f"Scaled {verb} replica set {rs['metadata']['name']} from {old_replicas} to {replicas}",
                            COMPONENT)
        return self.store.update(REPLICA_SETS, new)

    def _rs_status(self, rs: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        min_ready = rs["spec"].get("minReadySeconds", 0)
        status = {"replicas": len(pods), "fullyLabeledReplicas": len(pods),
                  "readyReplicas": sum(1 for p in pods if pod_ready(p)),
                  "availableReplicas": sum(1 for p in pods if self.available(p, min_ready)),
                  "observedGeneration": rs["metadata"].get("generation", 1)}
        status = {k: v for k, v in status.items() if v or k in ("replicas", "observedGeneration")}
        if status != rs.get("status"):
            new = copy.deepcopy(rs)
            new["status"] = status
            self.store.update(REPLICA_SETS, new)

    # -- pods -----------------------------------------------------------------------------------
    def _scale_pods(self, rs: dict[str, Any], pods: list[dict[str, Any]], want: int) -> None:
        for _ in range(want - len(pods)):
            if not self._create_pod(rs):
                break
        if len(pods) > want:
            for p in scale_down_order(pods)[: len(pods) - want]:
                self._delete_pod(rs, p)

    def _create_pod(self, owner: dict[str, Any], component: str = "replicaset-controller",
                    labels: dict[str, str] | None = None, spec: dict[str, Any] | None = None) -> bool:
        """A pod from the owner's template (labels and spec fields added by its controller); False
        when the namespace's Pod Security enforce level refuses it."""
        template = copy.deepcopy(owner["spec"]["template"])
        tmeta = template.get("metadata") or {}
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{owner['metadata']['name']}-{random_suffix()}",
                         "namespace": owner["metadata"]["namespace"],
                         "labels": {**(tmeta.get("labels") or {}), **(labels or {})},
                         "annotations": tmeta.get("annotations") or {}, "ownerReferences": [_owner_ref(owner)]},
            "spec": {**(template.get("spec") or {}), **(spec or {})},
        }
        pod = prepare(PODS, pod, creating=True)
        reset_status_on_create(PODS, pod)
        namespace = self.store.try_get(NAMESPACES, "", pod["metadata"]["namespace"])
        why = podsecurity.enforce(namespace, pod)
        if why:  # as the API server answers the controller: FailedCreate, retried when the template or namespace changes
            key = (owner["metadata"]["uid"], json.dumps([pod["spec"], (namespace or {}).get("metadata", {}).get("labels")], sort_keys=True))
            if key not in self.refused:
                self.refused.add(key)
                self.ctl.record(owner, "Warning", "FailedCreate",
                                f'Error creating: pods "{pod["metadata"]["name"]}" is forbidden: {why}', component)
            return False
        created = self.store.create(PODS, pod)
        self.ctl.record(owner, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}", component)
        return True

    def _delete_pod(self, rs: dict[str, Any], pod: dict[str, Any]) -> None:
        self.ctl.delete_pod(pod)
        self.ctl.record(rs, "Normal", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}",
                        "replicaset-controller")

    # -- deployments ----------------------------------------------------------------------------
    def sync_deployment(self, dep: dict[str, Any]) -> None:
        spec, meta = dep["spec"], dep["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        rss = [rs for rs in self.store.list(REPLICA_SETS, ns) if owned_by(rs, uid)]
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
        new_rs = next((rs for rs in rss if rs["metadata"].get("labels", {}).get(HASH_LABEL) == current), None)
        if not spec.get("paused"):
            top = max([0, *map(revision, rss)])
            if new_rs is None:
                new_rs = self._new_replica_set(dep, current, rss)
                rss.append(new_rs)
            elif revision(new_rs) < top:  # rolled back to an old template: that ReplicaSet comes back
                new_rs = self._set_rs(None, new_rs, new_rs["spec"].get("replicas", 0), {REVISION: str(top + 1)})
                rss = [new_rs if r["metadata"]["uid"] == new_rs["metadata"]["uid"] else r for r in rss]
            pods_by_rs = {rs["metadata"]["uid"]: self._pods_of(rs) for rs in rss}
            new = pods_by_rs[new_rs["metadata"]["uid"]]
            old = [p for rs in rss if rs is not new_rs for p in pods_by_rs[rs["metadata"]["uid"]]]
            if not old:
                self._scale_pods(new_rs, new, desired)
            elif strategy.get("type") == "Recreate":
                for p in old:
                    self._delete_pod(self._owner_rs(p, rss), p)
            else:
                self._roll(dep, new_rs, new, old, rss, desired, surge, unavailable)
            for rs in rss:
                pods = self._pods_of(rs)
                rs = self._set_rs(dep, rs, len(pods), {DESIRED: str(desired), MAX_REPLICAS: str(desired + surge)}
                                  if rs is new_rs else None)
                self._rs_status(rs, pods)
            self._clean_up(dep, [rs for rs in rss if rs is not new_rs])
            dep = self._annotate_revision(dep, revision(new_rs))
        pods = [p for rs in rss for p in self._pods_of(rs)]
        self._deployment_status(dep, pods, new_rs, current, desired, unavailable)

    def _annotate_revision(self, dep: dict[str, Any], rev: int) -> dict[str, Any]:
        """The Deployment carries its current revision, as `kubectl rollout undo` expects."""
        if (dep["metadata"].get("annotations") or {}).get(REVISION) == str(rev):
            return dep
        new = copy.deepcopy(dep)
        new["metadata"].setdefault("annotations", {})[REVISION] = str(rev)
        return self.store.update(DEPLOYMENTS, new)

    @staticmethod
    def _owner_rs(pod: dict[str, Any], rss: list[dict[str, Any]]) -> dict[str, Any]:
        return next(rs for rs in rss if owned_by(pod, rs["metadata"]["uid"]))

    def _roll(self, dep, new_rs, new, old, rss, desired, surge, unavailable) -> None:
        room = desired + surge - len(new) - len(old)
        want_new = min(desired, len(new) + max(room, 0))
        self._scale_pods(new_rs, new, want_new if want_new > len(new) else min(len(new), desired))
        ready = sum(1 for p in new + old if pod_ready(p))
        can_remove = ready - (desired - unavailable)
        for p in sorted(old, key=pod_ready):
            if not pod_ready(p):
                self._delete_pod(self._owner_rs(p, rss), p)
            elif can_remove > 0:
                can_remove -= 1
                self._delete_pod(self._owner_rs(p, rss), p)

    def _clean_up(self, dep: dict[str, Any], old: list[dict[str, Any]]) -> None:
        """Keep revisionHistoryLimit scaled-down old ReplicaSets, the newest revisions."""
        limit = dep["spec"].get("revisionHistoryLimit", 10)
        idle = sorted((rs for rs in old if rs["spec"].get("replicas", 0) == 0 and not self._pods_of(rs)), key=revision)
        for rs in idle[: max(0, len(idle) - limit)]:
            self.store.delete(REPLICA_SETS, rs["metadata"]["namespace"], rs["metadata"]["name"])

    def _deployment_status(self, dep, pods, new_rs, current, desired, unavailable) -> None:
        spec = dep["spec"]
        min_ready = spec.get("minReadySeconds", 0)
        updated = sum(1 for p in pods if p["metadata"].get("labels", {}).get(HASH_LABEL) == current)
        ready = sum(1 for p in pods if pod_ready(p))
        available = sum(1 for p in pods if self.available(p, min_ready))
        old_status = dep.get("status") or {}
        status: dict[str, Any] = {"observedGeneration": dep["metadata"].get("generation", 1)}
        for key, value in (("replicas", len(pods)), ("updatedReplicas", updated), ("readyReplicas", ready),
                           ("availableReplicas", available),
                           ("unavailableReplicas", max(len(pods), desired) - available)):
            if value > 0:
                status[key] = value
        conditions = copy.deepcopy(old_status.get("conditions") or [])
        rs_name = new_rs["metadata"]["name"] if new_rs else f"{dep['metadata']['name']}-{current}"
        if available >= desired - unavailable:
            set_condition(conditions, "Available", "True", "MinimumReplicasAvailable",
                                   "Deployment has minimum availability.")
        else:
            set_condition(conditions, "Available", "False", "MinimumReplicasUnavailable",
                                   "Deployment does not have minimum availability.")
        complete = updated == desired == len(pods) and available >= desired
        seen = (current, updated, ready, available, len(pods))
        last_seen, since = self.progress.get(dep["metadata"]["uid"], (None, time.monotonic()))
        if seen != last_seen:
            since = time.monotonic()
        self.progress[dep["metadata"]["uid"]] = (seen, since)
        deadline = since + spec.get("progressDeadlineSeconds", 600) / self.ctl.time_scale
        if spec.get("paused"):
            set_condition(conditions, "Progressing", "Unknown", "DeploymentPaused", "Deployment is paused")
        elif complete:
            set_condition(conditions, "Progressing", "True", "NewReplicaSetAvailable",
                                   f'ReplicaSet "{rs_name}" has successfully progressed.')
        elif time.monotonic() >= deadline:
            set_condition(conditions, "Progressing", "False", "ProgressDeadlineExceeded",
                                   f'ReplicaSet "{rs_name}" has timed out progressing.')
        else:
            self.wake_at.append(deadline)
            set_condition(conditions, "Progressing", "True", "ReplicaSetUpdated",
                                   f'ReplicaSet "{rs_name}" is progressing.')
        status["conditions"] = conditions
        if status != old_status:
            new = copy.deepcopy(dep)
            new["status"] = status
            self.store.update(DEPLOYMENTS, new)

    # -- jobs -----------------------------------------------------------------------------------
    def sync_job(self, job: dict[str, Any]) -> None:
        """Run pods to completion: `parallelism` at a time until `completions` succeeded, or fail
        the Job after `backoffLimit` failed pods (BackoffLimitExceeded)."""
        spec, meta = job["spec"], job["metadata"]
        status = copy.deepcopy(job.get("status") or {})
        pods = [p for p in self.store.list(PODS, meta["namespace"]) if owned_by(p, meta["uid"])]
        succeeded = sum(1 for p in pods if p["status"].get("phase") == "Succeeded")
        failed = sum(1 for p in pods if p["status"].get("phase") == "Failed")
        active = [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")
                  and not p["metadata"].get("deletionTimestamp")]
        completions, parallelism = spec.get("completions", 1), spec.get("parallelism", 1)
        finished = next((c["type"] for c in status.get("conditions") or [] if c["status"] == "True"
                         and c["type"] in ("Complete", "Failed")), None)
        conditions = status.get("conditions") or []
        if not finished and failed > spec.get("backoffLimit", 6):
            for p in active:
                self._delete_pod(job, p)
            active, finished = [], "Failed"
            set_condition(conditions, "Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            self.ctl.record(job, "Warning", "BackoffLimitExceeded", "Job has reached the specified backoff limit",
                            "job-controller")
        elif not finished and succeeded >= completions:
            finished = "Complete"
            status["completionTime"] = now_iso()
            set_condition(conditions, "SuccessCriteriaMet", "True", "CompletionsReached", "Reached expected number of succeeded pods")
            set_condition(conditions, "Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods")
            self.ctl.record(job, "Normal", "Completed", "Job completed", "job-controller")
        elif not finished and not spec.get("suspend"):
            for _ in range(min(parallelism, completions - succeeded) - len(active)):
                self._create_pod(job, "job-controller", {"job-name": meta["name"],
                                                         "batch.kubernetes.io/job-name": meta["name"],
                                                         "controller-uid": meta["uid"],
                                                         "batch.kubernetes.io/controller-uid": meta["uid"]})
            active = [p for p in self.store.list(PODS, meta["namespace"]) if owned_by(p, meta["uid"])
                      and p["status"].get("phase") not in ("Succeeded", "Failed")]
        status.setdefault("startTime", now_iso())
        status.update(active=len(active), succeeded=succeeded, failed=failed, ready=sum(1 for p in active if pod_ready(p)))
        status = {k: v for k, v in status.items() if v or k == "ready"}
        if conditions:
            status["conditions"] = conditions
        if status != job.get("status"):
            new = copy.deepcopy(job)
            new["status"] = status
            self.store.update(JOBS, new)

    # -- daemon sets ----------------------------------------------------------------------------
    def sync_daemon_set(self, ds: dict[str, Any]) -> None:
        """One pod per node the template fits (nodeSelector, taints), pinned by node affinity as the
        DaemonSet controller does; a template change replaces them one node at a time."""
        meta, template = ds["metadata"], ds["spec"]["template"]
        current = template_hash(template)
        tolerations = [*(template.get("spec") or {}).get("tolerations", []),
                       *({"key": k, "operator": "Exists", "effect": e} for k, e in DAEMON_TOLERATIONS)]
        pods = [p for p in self.store.list(PODS, meta["namespace"]) if owned_by(p, meta["uid"])
                and not p["metadata"].get("deletionTimestamp")]
        by_node: dict[str, list[dict[str, Any]]] = {}
        for p in pods:
            by_node.setdefault(self._pinned_node(p), []).append(p)
        eligible = [n["metadata"]["name"] for n in self.store.list(NODES)
                    if node_affinity_matches(template.get("spec") or {}, n)
                    and all(tolerates(tolerations, t) for t in (n.get("spec") or {}).get("taints") or []
                            if t.get("effect") in ("NoSchedule", "NoExecute"))]
        replacing = False
        for node in eligible:
            mine = by_node.pop(node, [])
            if not mine:
                affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
                self._create_pod(ds, "daemonset-controller", {HASH_LABEL_DS: current},
                                 {"affinity": affinity, "tolerations": tolerations})
            elif not replacing and any(p["metadata"].get("labels", {}).get(HASH_LABEL_DS) != current for p in mine):
                replacing = True
                for p in mine:
                    self._delete_pod(ds, p)
        for leftover in by_node.values():
            for p in leftover:
                self._delete_pod(ds, p)
        pods = [p for p in self.store.list(PODS, meta["namespace"]) if owned_by(p, meta["uid"])
                and not p["metadata"].get("deletionTimestamp")]
        scheduled = [p for p in pods if p["spec"].get("nodeName")]
        status = {"desiredNumberScheduled": len(eligible), "currentNumberScheduled": len(scheduled),
                  "numberMisscheduled": 0, "numberReady": sum(1 for p in pods if pod_ready(p)),
                  "numberAvailable": sum(1 for p in pods if self.available(p, ds["spec"].get("minReadySeconds", 0))),
                  "updatedNumberScheduled": sum(1 for p in scheduled
                                                if p["metadata"].get("labels", {}).get(HASH_LABEL_DS) == current),
                  "observedGeneration": meta.get("generation", 1)}
        if status != ds.get("status"):
            new = copy.deepcopy(ds)
            new["status"] = status
            self.store.update(DAEMON_SETS, new)

    @staticmethod
    def _pinned_node(pod: dict[str, Any]) -> str:
        terms = ((((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                  .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [{}])
        fields = terms[0].get("matchFields") or [{}]
        return pod["spec"].get("nodeName") or (fields[0].get("values") or [""])[0]
