"""The simulated kubelet: containers start, load, become Ready, crash, run out of memory, terminate.

What a container does comes from its model version's fleet profile (ConfigMap
`tideplane-sandbox/fleet-profiles`, keys `<model>@<version>`, `<model>`, `default`):

- `load_seconds`: Running at once, Ready after it (at least the readiness probe's initial delay);
  a run-to-completion container (restartPolicy Never/OnFailure, a Job's) exits 0 after it;
- `crash_on_start: true`: the container exits with code 1 a moment after each start; the kubelet
  restarts it with the real back-off (10 s doubling to 300 s): CrashLoopBackOff, restartCount;
- `never_ready: true`: Running, the readiness probe never passes (an `Unhealthy` event);
- `oom_after_requests: N`: the fleet simulator reports (POST /sandbox/oom) when a container has
  served N requests; it is OOMKilled (exit 137, lastState.terminated.reason OOMKilled), restarted
  with back-off and loads again;
- a node-cache staging pod (its container runs `node-cache stage`, a staging Job's) is run
  by the sandbox's node agent on its node (infra/sandbox/node_agents.py), the real staging code:
  Running until the agent reports its exit (POST /sandbox/exit), then Succeeded or Failed with the
  report as its termination message;
- `shutdown_seconds` (default 5): how long the server drains after SIGTERM. A deleted pod is
  Terminating (deletionTimestamp) for its containers' preStop sleep and that long, at most its
  grace period, then removed.

A start is measured by its parts, as a replica's cold start is: `image_pull_seconds` when the image
is not in the node's `status.images` (then it is), `load_seconds` for the weights from S3 — or, for
a pod that reads its node's weight cache (its init container runs `node-cache stage`) on a node
that meets its preferred node affinity (the label saying the node holds the version), `node_cache_load_seconds` from the
local disk (default: `load_seconds` scaled by the cited local-over-S3 figures), `compile_seconds`
(vLLM's torch.compile and CUDA-graph capture) unless the engine cache the container's
`VLLM_CACHE_ROOT` points at is already there: through a writable hostPath, on the node (then it
is: the node's `sandbox.tideplane.io/engine-caches` annotation); through a writable
PersistentVolumeClaim mount (its `subPath`), on that claim, whatever the node (the kubelet keeps
what claims hold: the emulator has no volumes); and `warmup_seconds`; plus, for a pod that waited
for its node to join, the node's start (annotation `sandbox.tideplane.io/node-start`, written by
the sandbox's cloud). When the pod turns Ready each part is a `ColdStart` Event on it, message
`<part> <seconds>s: <detail>` (part: node, image, weights, compile, warmup).

Durations are sandbox seconds, divided by the time scale.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
import uuid
from typing import Any

import yaml

from infra.fleetmodel.coldstart import load_cold_start
from infra.sandbox.config import (
    ENGINE_CACHES_ANNOTATION,
    IMAGE_SIZE_BYTES,
    NODE_START_ANNOTATION,
    PROFILES_CONFIGMAP,
    SANDBOX_NAMESPACE,
)

from .api import pod_ready
from .conditions import node_ready, set_condition
from .control_plane import ControlPlane
from .predicates import term_matches
from .resources import BY_KEY
from .timestamps import now_iso


log = logging.getLogger(__name__)

PODS, CONFIGMAPS, NODES = BY_KEY["pods"], BY_KEY["configmaps"], BY_KEY["nodes"]
DEFAULT_LOAD_SECONDS = 30.0
DEFAULT_SHUTDOWN_SECONDS = 5.0
CRASH_AFTER_SECONDS = 1.0  # a crash_on_start container runs this long before it exits
BACKOFF_SECONDS, MAX_BACKOFF_SECONDS = 10.0, 300.0  # the kubelet's container restart back-off
NOT_READY = ("ContainersNotReady", "containers with unready status")
ENGINE_CACHE_ENV = "VLLM_CACHE_ROOT"
# The fleet-profiles ConfigMap is keyed by these pod labels (`<model>@<version>`): the sandbox's own
# convention, the names the serving pods carry (tests/sandbox/kubeapi/test_kubeapi_pods.py checks
# that the product's pods carry them; the emulator takes no label name from the product).
PROFILE_MODEL_LABEL = "tideplane.io/model"
PROFILE_VERSION_LABEL = "app.kubernetes.io/version"  # Kubernetes' recommended label
NODE_AGENT_COMMAND = ["node-cache", "stage"]  # a container the sandbox's node agent runs (infra/sandbox/node_agents.py)


def engine_cache(pod: dict[str, Any]) -> tuple[str, str] | None:
    """Where a container's VLLM_CACHE_ROOT is kept, through a writable mount: ``("node", directory)``
    for a hostPath (the node's disk), ``("claim", "pvc:<namespace>/<claim>/<path>")`` for a
    PersistentVolumeClaim (one volume, whatever node mounts it; ``subPath`` respected); else None."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    for c in pod["spec"]["containers"]:
        root = next((e.get("value") for e in c.get("env") or [] if e.get("name") == ENGINE_CACHE_ENV), None)
        for m in c.get("volumeMounts") or [] if root else []:
            volume, mount = volumes.get(m["name"]) or {}, m["mountPath"].rstrip("/")
            if m.get("readOnly") or not (root == mount or root.startswith(mount + "/")):
                continue
            inside = "/".join(p for p in ((m.get("subPath") or "").strip("/"), root[len(mount):].strip("/")) if p)
            if "hostPath" in volume:
                return "node", "/".join(p for p in (volume["hostPath"]["path"].rstrip("/"), inside) if p)
            claim = volume.get("persistentVolumeClaim") or {}
            if claim.get("claimName") and not claim.get("readOnly"):
                return "claim", f"pvc:{pod['metadata'].get('namespace', '')}/{claim['claimName']}/{inside}"
    return None


def node_cache_stager(pod: dict[str, Any]) -> str | None:
    """The init container that stages the pod's weights into its node's cache (``node-cache stage``), if any."""
    return next((c["name"] for c in pod["spec"].get("initContainers") or [] if (c.get("args") or [])[:2] == NODE_AGENT_COMMAND), None)


def prefers_node(pod: dict[str, Any], node_meta: dict[str, Any]) -> bool:
    """Whether the node meets one of the pod's preferred node-affinity terms. For a pod that stages
    into its node's cache, that is the sandbox's sign that the node's disk holds its weights: whoever
    verified the cache labelled the node, and the pod prefers nodes so labelled (the emulator knows
    neither the label's name nor how it is made)."""
    preferred = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                 .get("preferredDuringSchedulingIgnoredDuringExecution")) or []
    node = {"metadata": {"name": node_meta.get("name", ""), "labels": node_meta.get("labels") or {}}}
    return any(term_matches(node, p.get("preference") or {}) for p in preferred)


def local_weights_fraction() -> float:
    """A load from the node's disk over a load from S3: the cited figures' weights_load over
    weights_s3 + weights_load (infra/fleetmodel/coldstart.yaml: 48 of 76 s for Llama-3-8B)."""
    parts = load_cold_start().parts_s
    return parts["weights_load"] / (parts["weights_s3"] + parts["weights_load"])


def node_images(node: dict[str, Any]) -> set[str]:
    """The image names the node reports it holds (status.images)."""
    return {name for image in (node.get("status") or {}).get("images") or [] for name in image.get("names") or []}


def add_images(node: dict[str, Any], images: list[str]) -> list[str]:
    """List ``images`` in the node's status.images (a pull); the ones it did not hold yet."""
    present = node_images(node)
    missing = [i for i in dict.fromkeys(images) if i not in present]
    if missing:
        node.setdefault("status", {}).setdefault("images", []).extend({"names": [i], "sizeBytes": IMAGE_SIZE_BYTES} for i in missing)
    return missing


def pre_stop_seconds(pod: dict[str, Any]) -> float:
    """The longest preStop sleep of the pod's containers (lifecycle.preStop.sleep.seconds)."""
    return max([float((((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds", 0))
                for c in pod["spec"]["containers"]] or [0.0])


def _number(profile: dict[str, Any], key: str, default: float = 0.0) -> float:
    try:
        return float(profile.get(key, default))
    except (TypeError, ValueError):
        return default


def agent_run(pod: dict[str, Any]) -> bool:
    """A pod whose container the sandbox's node agent runs (a node-cache staging Job's: its
    container's command is ``node-cache stage``)."""
    return any((c.get("args") or [])[:2] == NODE_AGENT_COMMAND for c in pod["spec"].get("containers") or [])


def backoff(restarts: int) -> float:
    """Sandbox seconds before the next restart after `restarts` failures (10 s, 20 s, ... 300 s)."""
    return min(BACKOFF_SECONDS * 2 ** max(restarts - 1, 0), MAX_BACKOFF_SECONDS)


class Kubelet:
    """Every node's kubelet, one pass over the pods at a time (under the store lock)."""

    def __init__(self, ctl: ControlPlane):
        self.ctl = ctl
        self.store = ctl.store
        self.ready_at: dict[str, float] = {}  # pod uid -> when it becomes Ready (inf: never)
        self.crash_at: dict[str, float] = {}  # pod uid -> when its crash_on_start container exits
        self.restart_at: dict[str, float] = {}  # pod uid -> when its crashed container restarts
        self.gone_at: dict[str, float] = {}  # Terminating pod uid -> when its containers have exited
        self.oom: set[str] = set()  # pod uids the fleet reported out of memory
        self.cold_start: dict[str, tuple[list[tuple[str, float, str]], tuple[str, str] | None]] = {}  # uid -> (parts, engine cache)
        self.exited: dict[str, tuple[int, str]] = {}  # agent-run pod uid -> (exit code, termination message)
        self.claim_caches: set[str] = set()  # engine caches written to PersistentVolumeClaims (engine_cache's "claim" places)

    def due(self) -> list[float]:
        return [t for t in (*self.ready_at.values(), *self.crash_at.values(), *self.restart_at.values(),
                            *self.gone_at.values()) if t != math.inf]

    def seconds(self, sandbox_seconds: float) -> float:
        return sandbox_seconds / self.ctl.time_scale

    def profile(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod's model version's profile from the fleet-profiles ConfigMap ({} when none)."""
        labels = pod["metadata"].get("labels") or {}
        model, version = labels.get(PROFILE_MODEL_LABEL), labels.get(PROFILE_VERSION_LABEL)
        cm = self.store.try_get(CONFIGMAPS, SANDBOX_NAMESPACE, PROFILES_CONFIGMAP)
        data = (cm or {}).get("data") or {}
        for key in (f"{model}@{version}", model, "default"):
            if key and key in data:
                try:
                    profile = yaml.safe_load(data[key])
                    if isinstance(profile, dict):
                        return profile
                except yaml.YAMLError:
                    pass
                log.warning("unreadable profile %s in %s/%s", key, SANDBOX_NAMESPACE, PROFILES_CONFIGMAP)
        return {}

    def load_seconds(self, pod: dict[str, Any], profile: dict[str, Any]) -> float:
        """The model's load time, at least the readiness probe's initial delay."""
        seconds = _number(profile, "load_seconds", DEFAULT_LOAD_SECONDS)
        delays = [(c.get("readinessProbe") or {}).get("initialDelaySeconds", 0) for c in pod["spec"]["containers"]]
        return max([seconds, *delays])

    # -- the pass -------------------------------------------------------------------------------
    def reconcile(self, nodes: dict[str, dict[str, Any]]) -> None:
        now = time.monotonic()
        live = set()
        for pod in self.store.list(PODS):
            uid = pod["metadata"]["uid"]
            live.add(uid)
            node = nodes.get(pod["spec"].get("nodeName") or "")
            if node is None:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(pod, now)
                continue
            phase = pod["status"].get("phase")
            if phase == "Pending":
                self._start(pod, node, now)
            elif phase == "Running":
                self._run(pod, node, now)
        for timers in (self.ready_at, self.crash_at, self.restart_at, self.gone_at, self.cold_start):
            for uid in [u for u in timers if u not in live]:
                del timers[uid]
        self.oom &= live
        self.exited = {uid: v for uid, v in self.exited.items() if uid in live}

    def _run(self, pod: dict[str, Any], node: dict[str, Any], now: float) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self.oom:
            self.oom.discard(uid)
            return self._exit(pod, now, "OOMKilled", 137)
        if uid in self.exited:
            code, message = self.exited.pop(uid)
            return self._finish(pod, "Succeeded" if code == 0 else "Failed", "Completed" if code == 0 else "Error", code, message)
        if now >= self.crash_at.get(uid, math.inf):
            return self._exit(pod, now, "Error", 1)
        if now >= self.restart_at.get(uid, math.inf):
            return self._restart(pod, now)
        running = uid not in self.restart_at
        if running and pod["spec"].get("restartPolicy", "Always") != "Always" and now >= self.ready_at.get(uid, 0):
            return self._complete(pod)
        ready = running and node_ready(node) and now >= self.ready_at.get(uid, 0)
        if ready != pod_ready(pod):
            self._set_ready(pod, ready)
            if ready and uid in self.cold_start:
                self._started(pod, node["metadata"]["name"], *self.cold_start.pop(uid))

    # -- container lifecycle --------------------------------------------------------------------
    def _start(self, pod: dict[str, Any], node: dict[str, Any], now: float) -> None:
        self.ctl.ip_counter += 1
        ts = now_iso()
        new = copy.deepcopy(pod)
        addresses = (node.get("status") or {}).get("addresses") or []
        host_ip = next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "10.0.0.1")
        status = new["status"]
        counter = self.ctl.ip_counter
        status.update(phase="Running", startTime=ts, hostIP=host_ip,
                      podIP=f"{self.ctl.pod_network}.{counter // 250 % 250}.{counter % 250 + 1}")
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
        set_condition(conditions, "ContainersReady", "False", *NOT_READY)
        set_condition(conditions, "Ready", "False", *NOT_READY)
        self._schedule_run(pod, now, node)
        self.store.update(PODS, new)
        self._pull_init_images(pod, node["metadata"]["name"])
        present = node_images(node)
        pull = _number(self.profile(pod), "image_pull_seconds")
        for c in pod["spec"]["containers"]:
            if c["image"] in present or not pull:
                self.ctl.record(pod, "Normal", "Pulled", f'Container image "{c["image"]}" already present on machine',
                                "kubelet")
            else:
                self.ctl.record(pod, "Normal", "Pulling", f'Pulling image "{c["image"]}"', "kubelet")
                self.ctl.record(pod, "Normal", "Pulled", f'Successfully pulled image "{c["image"]}" in {pull:g}s'
                                f' ({pull:g}s including waiting)', "kubelet")
            self.ctl.record(pod, "Normal", "Started", f"Started container {c['name']}", "kubelet")

    def _pull_init_images(self, pod: dict[str, Any], node_name: str) -> None:
        """Init containers run before the pod's containers, so their images are pulled first and the
        node lists them from then on (the sandbox does not time these pulls): a staging Job's
        ``pull-serving-image`` leaves the serving image on every node it ran on."""
        node = self.store.try_get(NODES, "", node_name)
        if node is None:
            return
        new = copy.deepcopy(node)
        for image in add_images(new, [c["image"] for c in pod["spec"].get("initContainers") or []]):
            self.ctl.record(pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet")
            self.ctl.record(pod, "Normal", "Pulled", f'Successfully pulled image "{image}"', "kubelet")
        if new != node:
            self.store.update(NODES, new)

    def _schedule_run(self, pod: dict[str, Any], now: float, node: dict[str, Any] | None = None) -> None:
        """Timers of a freshly (re)started container: when it is Ready, or crashes. ``node``: a
        first start there, whose cold-start parts are measured (a restart pulls no image)."""
        uid = pod["metadata"]["uid"]
        profile = self.profile(pod)
        if agent_run(pod):
            self.ready_at[uid] = math.inf  # until its node agent reports the exit
        elif profile.get("crash_on_start"):
            self.crash_at[uid] = now + self.seconds(CRASH_AFTER_SECONDS)
            self.ready_at[uid] = math.inf
        elif profile.get("never_ready"):
            self.ready_at[uid] = math.inf
            self.ctl.record(pod, "Warning", "Unhealthy",
                            "Readiness probe failed: HTTP probe failed with statuscode: 503", "kubelet")
        else:
            parts, cache = self._parts(pod, node, profile)
            self.cold_start[uid] = (parts, cache)
            self.ready_at[uid] = now + self.seconds(sum(seconds for part, seconds, _ in parts if part != "node"))

    def _parts(self, pod: dict[str, Any], node: dict[str, Any] | None,
               profile: dict[str, Any]) -> tuple[list[tuple[str, float, str]], tuple[str, str] | None]:
        """The start's parts (part, sandbox seconds, detail) and the engine cache it fills, if any."""
        parts: list[tuple[str, float, str]] = []
        node_meta = (node or {}).get("metadata") or {}
        started = (node_meta.get("annotations") or {}).get(NODE_START_ANNOTATION)
        if started and pod["metadata"].get("creationTimestamp", "") <= node_meta.get("creationTimestamp", ""):
            seconds, _, how = started.partition(" ")
            parts.append(("node", float(seconds), f"{node_meta['name']} {how}"))
        if node is not None:
            missing = [c["image"] for c in pod["spec"]["containers"] if c["image"] not in node_images(node)]
            parts.append(("image", _number(profile, "image_pull_seconds") if missing else 0.0,
                          f"pulled {', '.join(missing)}" if missing else "present on the node"))
        parts.append(self._weights(pod, node_meta, profile))
        cache = engine_cache(pod)
        on_node = json.loads((node_meta.get("annotations") or {}).get(ENGINE_CACHES_ANNOTATION) or "[]")
        if cache is not None and cache[1] in (on_node if cache[0] == "node" else self.claim_caches):
            parts.append(("compile", 0.0, f"engine cache hit {cache[1]}"))
        else:
            detail = f"compiled, cache written to {cache[1]}" if cache else "compiled (no engine cache)"
            parts.append(("compile", _number(profile, "compile_seconds"), detail))
        parts.append(("warmup", _number(profile, "warmup_seconds"), "warm-up requests"))
        return parts, cache

    def _weights(self, pod: dict[str, Any], node_meta: dict[str, Any], profile: dict[str, Any]) -> tuple[str, float, str]:
        """The weights part: from the node's cache (local disk) when the pod stages into it and the
        node is labelled as holding the version, else from S3 (staged by the pod's init container
        into the node cache, or the shared path's own read)."""
        args = pod["spec"]["containers"][0].get("args") or []
        source = args[args.index("--model") + 1] if "--model" in args[:-1] else "the image"
        seconds = self.load_seconds(pod, profile)
        stager = node_cache_stager(pod)
        if stager is None:
            return "weights", seconds, f"loaded from {source}"
        if prefers_node(pod, node_meta):
            local = _number(profile, "node_cache_load_seconds", seconds * local_weights_fraction())
            return "weights", self.load_seconds(pod, {"load_seconds": local}), f"loaded from the node cache {source} (local disk)"
        return "weights", seconds, f"from S3: {stager} staged the node cache {source}"

    def _started(self, pod: dict[str, Any], node_name: str, parts: list[tuple[str, float, str]],
                 cache: tuple[str, str] | None) -> None:
        """Ready after a start: one ColdStart Event per part; the node now holds the image, and the
        node or the claim the engine cache the server wrote."""
        for part, seconds, detail in parts:
            self.ctl.record(pod, "Normal", "ColdStart", f"{part} {seconds:g}s: {detail}", "kubelet")
        if cache is not None and cache[0] == "claim":
            self.claim_caches.add(cache[1])
        node = self.store.try_get(NODES, "", node_name)
        if node is None:
            return
        new = copy.deepcopy(node)
        annotations = new["metadata"].setdefault("annotations", {})
        add_images(new, [c["image"] for c in pod["spec"]["containers"]])
        caches = json.loads(annotations.get(ENGINE_CACHES_ANNOTATION) or "[]")
        if cache is not None and cache[0] == "node" and cache[1] not in caches:
            annotations[ENGINE_CACHES_ANNOTATION] = json.dumps([*caches, cache[1]])
        if new != node:
            self.store.update(NODES, new)

    def _complete(self, pod: dict[str, Any]) -> None:
        """A run-to-completion container (a Job's) exits 0 after its load_seconds: Succeeded."""
        self.ready_at.pop(pod["metadata"]["uid"], None)
        self._finish(pod, "Succeeded", "Completed", 0)

    def _finish(self, pod: dict[str, Any], phase: str, reason: str, code: int, message: str | None = None) -> None:
        ts = now_iso()
        new = copy.deepcopy(pod)
        new["status"]["phase"] = phase
        for cs in new["status"].get("containerStatuses") or []:
            started = (cs.get("state") or {}).get("running", {}).get("startedAt", ts)
            cs["state"] = {"terminated": {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": ts,
                                          "containerID": cs.get("containerID")}}
            if message:
                cs["state"]["terminated"]["message"] = message
            cs["ready"], cs["started"] = False, False
        conditions = new["status"].setdefault("conditions", [])
        set_condition(conditions, "ContainersReady", "False", "PodCompleted")
        set_condition(conditions, "Ready", "False", "PodCompleted")
        self.store.update(PODS, new)

    def _exit(self, pod: dict[str, Any], now: float, reason: str, code: int) -> None:
        """The container died: lastState terminated, restartCount up, CrashLoopBackOff until it
        restarts; with restartPolicy Never the pod has Failed."""
        uid = pod["metadata"]["uid"]
        self.crash_at.pop(uid, None)
        self.ready_at.pop(uid, None)
        if pod["spec"].get("restartPolicy") == "Never":
            return self._finish(pod, "Failed", reason, code)
        ts = now_iso()
        new = copy.deepcopy(pod)
        meta = pod["metadata"]
        for cs in new["status"].get("containerStatuses") or []:
            started = (cs.get("state") or {}).get("running", {}).get("startedAt", ts)
            cs["restartCount"] = cs.get("restartCount", 0) + 1
            delay = backoff(cs["restartCount"])
            cs["lastState"] = {"terminated": {"exitCode": code, "reason": reason, "startedAt": started,
                                              "finishedAt": ts, "containerID": cs.get("containerID")}}
            cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message":
                           f"back-off {delay:g}s restarting failed container={cs['name']} "
                           f"pod={meta['name']}_{meta['namespace']}({uid})"}}
            cs["ready"], cs["started"] = False, False
            self.restart_at[uid] = now + self.seconds(delay)
        conditions = new["status"].setdefault("conditions", [])
        set_condition(conditions, "ContainersReady", "False", *NOT_READY)
        set_condition(conditions, "Ready", "False", *NOT_READY)
        self.store.update(PODS, new)
        for c in pod["spec"]["containers"]:
            self.ctl.record(pod, "Warning", "BackOff", f"Back-off restarting failed container {c['name']} in pod "
                            f"{meta['name']}_{meta['namespace']}({uid})", "kubelet")

    def _restart(self, pod: dict[str, Any], now: float) -> None:
        uid = pod["metadata"]["uid"]
        del self.restart_at[uid]
        ts = now_iso()
        new = copy.deepcopy(pod)
        for cs in new["status"].get("containerStatuses") or []:
            cs["state"] = {"running": {"startedAt": ts}}
            cs["containerID"] = f"containerd://{uuid.uuid4().hex}"
            cs["started"] = True
        self._schedule_run(pod, now)
        self.store.update(PODS, new)
        for c in pod["spec"]["containers"]:
            self.ctl.record(pod, "Normal", "Started", f"Started container {c['name']}", "kubelet")

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
            set_condition(conditions, "ContainersReady", "False", *NOT_READY)
            set_condition(conditions, "Ready", "False", *NOT_READY)
        self.store.update(PODS, new)

    # -- termination ----------------------------------------------------------------------------
    def _terminate(self, pod: dict[str, Any], now: float) -> None:
        """A Terminating pod: the preStop sleep, SIGTERM, the server drains for shutdown_seconds
        (SIGKILL at the grace period), then the kubelet removes it from the API."""
        uid = pod["metadata"]["uid"]
        if uid not in self.gone_at:
            shutdown = _number(self.profile(pod), "shutdown_seconds", DEFAULT_SHUTDOWN_SECONDS) + pre_stop_seconds(pod)
            grace = pod["metadata"].get("deletionGracePeriodSeconds", 30)
            self.gone_at[uid] = now + self.seconds(min(shutdown, grace))
            for c in pod["spec"]["containers"]:
                self.ctl.record(pod, "Normal", "Killing", f"Stopping container {c['name']}", "kubelet")
        if now >= self.gone_at[uid]:
            del self.gone_at[uid]
            self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])

    def report_exit(self, namespace: str, name: str, code: int, message: str) -> bool:
        """A node agent says this pod's container exited; False when there is no such agent-run running pod."""
        pod = self.store.try_get(PODS, namespace, name)
        if pod is None or not agent_run(pod) or pod["status"].get("phase") != "Running":
            return False
        self.exited[pod["metadata"]["uid"]] = (int(code), message[-4096:])  # the kubelet's message limit
        self.store.dirty.set()
        return True

    def report_oom(self, namespace: str, name: str) -> bool:
        """The fleet says this pod's server ran out of memory; False when there is no such running pod."""
        pod = self.store.try_get(PODS, namespace, name)
        if pod is None or pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            return False
        self.oom.add(pod["metadata"]["uid"])
        self.store.dirty.set()
        return True
