"""The in-memory object store: one lock, a global resourceVersion counter and a change log for watches.

Stored objects are treated as immutable snapshots (every write stores a fresh dict), so the change
log and list results can share them without copying; callers deep-copy before they modify.
"""

from __future__ import annotations

import bisect
import copy
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from . import crds, errors
from .resources import BY_KEY, RESOURCES, Resource
from .timestamps import now_iso


@dataclass(order=True)
class Change:
    rv: int
    key: str = field(compare=False)
    type: str = field(compare=False)  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any] = field(compare=False)
    old: dict[str, Any] | None = field(compare=False, default=None)


class Store:
    """Objects by resource key and (namespace, name); every write appends to the change log."""

    def __init__(self, history: int = 20000):
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.dirty = threading.Event()  # set on every write: wakes the controllers
        self.rv = 0
        self.history = history
        self.log: list[Change] = []
        self.first_replayable = 0  # a watch from rv >= this can be replayed from the log
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {r.key: {} for r in RESOURCES}

    # -- reads ------------------------------------------------------------------------------
    def try_get(self, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects[res.key].get((namespace if res.namespaced else "", name))

    def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self.try_get(res, namespace, name)
        if obj is None:
            raise errors.not_found(res.plural, name, res.group)
        return obj

    def list(self, res: Resource, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            items = self.objects[res.key].values()
            if namespace:
                items = [o for o in items if o["metadata"].get("namespace") == namespace]
            return sorted(items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def changes_since(self, rv: int) -> list[Change] | None:
        """Changes after rv, or None when the log no longer reaches back that far."""
        with self.lock:
            if rv < self.first_replayable:
                return None
            return self.log[bisect.bisect_right(self.log, Change(rv, "", "", {})):]

    # -- writes -----------------------------------------------------------------------------
    def _record(self, res: Resource, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self.log.append(Change(self.rv, res.key, kind, obj, old))
        if res.key == crds.CRD_KEY:
            crds.sync(self.objects)
        if len(self.log) > 2 * self.history:
            self.first_replayable = self.log[self.history].rv - 1
            del self.log[: self.history]
        self.changed.notify_all()
        self.dirty.set()

    def create(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            meta = obj["metadata"]
            ns = meta.get("namespace", "") if res.namespaced else ""
            if res.namespaced and ("", ns) not in self.objects["namespaces"]:
                raise errors.not_found("namespaces", ns)
            if (ns, meta["name"]) in self.objects[res.key]:
                raise errors.already_exists(res.plural, meta["name"], res.group)
            self.rv += 1
            # The uid is the server's: one prepare() already chose (a Job's generated selector) or a new one.
            meta.update(uid=meta.get("uid") or str(uuid.uuid4()), resourceVersion=str(self.rv), creationTimestamp=now_iso())
            if "spec" in obj:
                meta["generation"] = 1
            for stale in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(stale, None)
            self.objects[res.key][(ns, meta["name"])] = obj
            self._record(res, "ADDED", obj, None)
            return obj

    def update(self, res: Resource, obj: dict[str, Any], expect_rv: str | None = None) -> dict[str, Any]:
        """Store a new version; a stale expect_rv is a 409 Conflict; a no-op write changes nothing."""
        with self.lock:
            meta = obj["metadata"]
            ns = meta.get("namespace", "") if res.namespaced else ""
            old = self.objects[res.key].get((ns, meta["name"]))
            if old is None:
                raise errors.not_found(res.plural, meta["name"], res.group)
            if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
                raise errors.conflict(res.plural, meta["name"], res.group)
            for fixed in ("uid", "creationTimestamp", "namespace", "name"):
                if fixed in old["metadata"]:
                    meta[fixed] = old["metadata"][fixed]
                else:
                    meta.pop(fixed, None)
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if "generation" in old["metadata"]:
                meta["generation"] = old["metadata"]["generation"] + (obj.get("spec") != old.get("spec"))
            if obj == old:
                return old
            self.rv += 1
            meta["resourceVersion"] = str(self.rv)
            self.objects[res.key][(ns, meta["name"])] = obj
            self._record(res, "MODIFIED", obj, old)
            return obj

    def delete(self, res: Resource, namespace: str, name: str, orphan: bool = False) -> dict[str, Any]:
        """Remove an object; its namespace's objects and (unless orphan) its dependents go too."""
        with self.lock:
            ns = namespace if res.namespaced else ""
            old = self.objects[res.key].pop((ns, name), None)
            if old is None:
                raise errors.not_found(res.plural, name, res.group)
            self.rv += 1
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(self.rv)
            self._record(res, "DELETED", gone, old)
            if res.plural == "namespaces":
                for other in RESOURCES:
                    if other.namespaced:
                        for obj in [o for (o_ns, _), o in self.objects[other.key].items() if o_ns == name]:
                            self.delete(other, name, obj["metadata"]["name"])
            if not orphan:
                uid = old["metadata"]["uid"]
                for key, objects in self.objects.items():
                    for obj in [o for o in objects.values()
                                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]:
                        if key == "pods":  # the garbage collector deletes dependents through the API: gracefully
                            self.delete_pod(obj)
                        else:
                            self.delete(BY_KEY[key], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            return gone

    def delete_pod(self, pod: dict[str, Any], grace: Any = None) -> dict[str, Any]:
        """A pod on a node is Terminating for its grace period (the kubelet removes it when its
        containers have stopped); an unscheduled pod, or a grace period of 0, goes at once."""
        meta = pod["metadata"]
        seconds = pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
        try:
            seconds = max(0, int(seconds))
        except (TypeError, ValueError):
            raise errors.bad_request(f"invalid gracePeriodSeconds {grace!r}") from None
        if not pod["spec"].get("nodeName") or seconds == 0:
            return self.delete(BY_KEY["pods"], meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds", 30) <= seconds:
            return pod
        new = copy.deepcopy(pod)
        deadline = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        new["metadata"].update(deletionTimestamp=deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
                               deletionGracePeriodSeconds=seconds)
        return self.update(BY_KEY["pods"], new)
