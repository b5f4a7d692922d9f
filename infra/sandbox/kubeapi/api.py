"""The verbs of the REST API on top of the store: what a request does, independent of HTTP."""

from __future__ import annotations

import base64
import copy
import json
import math
from typing import Any

import yaml

from . import errors, patch as patches, podsecurity
from .errors import bad_request
from .resources import BY_KEY, Resource
from .selectors import label_selector_matcher, label_selector_string, parse_field_selector, parse_label_selector
from .store import Store
from .timestamps import now_iso
from .validation import check_replicas, check_status, check_update, prepare, reset_status_on_create

PODS = BY_KEY["pods"]
PDBS = BY_KEY["poddisruptionbudgets.policy"]
NAMESPACES = BY_KEY["namespaces"]

PATCH_TYPES = {
    "application/json-patch+json": patches.json_patch,
    "application/merge-patch+json": patches.merge_patch,
    "application/strategic-merge-patch+json": patches.strategic_merge,
    "application/apply-patch+yaml": patches.strategic_merge,
}


def decode_patch(res: Resource, content_type: str, raw: bytes) -> tuple[Any, Any]:
    """(patch function, parsed patch document) for a PATCH request's body.

    Custom resources have no Go struct to carry patch strategies, so, as on a real server, a
    strategic-merge patch of one is 415 Unsupported Media Type.
    """
    fn = PATCH_TYPES.get(content_type)
    accepted = errors.CUSTOM_PATCH_TYPES if res.custom else errors.BUILTIN_PATCH_TYPES
    if fn is None or content_type not in accepted:
        raise errors.unsupported_media_type(content_type, accepted)
    try:
        doc = yaml.safe_load(raw) if content_type == "application/apply-patch+yaml" else json.loads(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise bad_request(f"error decoding patch: {exc}") from None
    if fn is not patches.json_patch and not isinstance(doc, dict):
        raise bad_request("patch body must be a JSON object")
    return fn, doc


class Api:
    def __init__(self, store: Store):
        self.store = store

    # -- reads ------------------------------------------------------------------------------
    def get(self, res: Resource, ns: str, name: str, sub: str | None = None) -> dict[str, Any]:
        obj = self.store.get(res, ns, name)
        return self._scale_of(obj) if sub == "scale" else obj

    def list(self, res: Resource, ns: str | None, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None, cont: str | None = None) -> dict[str, Any]:
        labels, fields = parse_label_selector(label_selector), parse_field_selector(field_selector)
        with self.store.lock:
            rv = self.store.rv
            items = [o for o in self.store.list(res, ns) if labels(o["metadata"].get("labels") or {}) and fields(o)]
        start = int(base64.urlsafe_b64decode(cont.encode()).decode()) if cont else 0
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and start + limit < len(items):
            meta["continue"] = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        items = items[start:start + limit] if limit else items[start:]
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta, "items": items}

    def pod_log(self, ns: str, name: str, container: str | None) -> str:
        """No processes run here: the log tells what the simulated kubelet did with the container."""
        pod = self.store.get(PODS, ns, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        if container and container not in names:
            raise bad_request(f"container {container} is not valid for pod {name}")
        status = pod.get("status") or {}
        lines = [f"{status.get('startTime', '')} [sandbox] {c} in pod {ns}/{name} on node "
                 f"{pod['spec'].get('nodeName', '<none>')}: phase {status.get('phase')}, ready {pod_ready(pod)}"
                 for c in ([container] if container else names[:1])]
        return "\n".join(lines) + "\n"

    # -- writes -----------------------------------------------------------------------------
    def create(self, res: Resource, ns: str, body: Any, dry_run: bool = False) -> dict[str, Any]:
        if isinstance(body, dict) and isinstance(body.get("metadata"), dict):
            body = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "uid"}}  # the server's
        if isinstance(body, dict) and res.namespaced:
            meta = body.setdefault("metadata", {}) if isinstance(body.get("metadata", {}), dict) else None
            if meta is not None:
                if meta.get("namespace") not in (None, "", ns):
                    raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
                meta["namespace"] = ns
        obj = prepare(res, copy.deepcopy(body), creating=True)
        reset_status_on_create(res, obj)
        namespace = self.store.try_get(NAMESPACES, "", ns) if res.namespaced else None
        if namespace and namespace["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(res.plural, obj["metadata"]["name"], res.group,
                                   f"unable to create new content in namespace {ns} because it is being terminated")
        why = podsecurity.admit(namespace, res.plural, obj) if res.namespaced and res.group in podsecurity.GROUPS else None
        if why:
            raise errors.forbidden(res.plural, obj["metadata"]["name"], res.group, why)
        if dry_run:
            return obj
        return self.store.create(res, obj)

    def replace(self, res: Resource, ns: str, name: str, body: Any, sub: str | None = None,
                dry_run: bool = False) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        body_meta = body.get("metadata") or {}
        if body_meta.get("name") not in (None, name):
            raise bad_request(f"the name of the object ({body_meta.get('name')}) does not match the name on the URL ({name})")
        if res.namespaced and body_meta.get("namespace") not in (None, "", ns):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        body = copy.deepcopy(body)
        if res.namespaced and isinstance(body.get("metadata"), dict):
            body["metadata"]["namespace"] = ns
        with self.store.lock:
            old = self.store.get(res, ns, name)
            if sub == "scale":
                return self._set_scale(res, old, body)
            new = self._merge_sub(res, old, body, sub)
            self._admit(res, ns, new, old, sub)
            if dry_run:
                return new
            return self._finish_deletion(res, self.store.update(res, new, expect_rv=body_meta.get("resourceVersion")))

    def patch(self, res: Resource, ns: str, name: str, content_type: str, raw: bytes, sub: str | None = None,
              dry_run: bool = False) -> dict[str, Any]:
        fn, doc = decode_patch(res, content_type, raw)
        with self.store.lock:
            old = self.store.try_get(res, ns, name)
            if old is None:
                if content_type == "application/apply-patch+yaml" and sub is None:
                    return self.create(res, ns, doc, dry_run)
                raise errors.not_found(res.plural, name, res.group)
            base = self._scale_of(old) if sub == "scale" else old
            patched = fn(base, doc)
            if not isinstance(patched, dict):
                raise bad_request("the patch did not produce an object")
            meta = patched.get("metadata") if isinstance(patched.get("metadata"), dict) else {}
            if meta.get("name") != name:
                raise bad_request("the patch may not change metadata.name")
            if sub == "scale":
                return self._set_scale(res, old, patched)
            new = self._merge_sub(res, old, patched, sub)
            self._admit(res, ns, new, old, sub)
            if dry_run:
                return new
            return self._finish_deletion(res, self.store.update(res, new, expect_rv=meta.get("resourceVersion")))

    def _admit(self, res: Resource, ns: str, new: dict[str, Any], old: dict[str, Any], sub: str | None) -> None:
        """Pod Security admission on an update of the main resource (status and other subresources are not checked)."""
        if sub is None and res.namespaced and res.group in podsecurity.GROUPS:
            why = podsecurity.admit(self.store.try_get(NAMESPACES, "", ns), res.plural, new, old)
            if why:
                raise errors.forbidden(res.plural, new["metadata"]["name"], res.group, why)

    def _merge_sub(self, res: Resource, old: dict[str, Any], new: dict[str, Any], sub: str | None) -> dict[str, Any]:
        """Main endpoint writes keep the old status; the status endpoint changes only status."""
        if sub == "status":
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status") or {}
            merged["metadata"]["resourceVersion"] = (new.get("metadata") or {}).get("resourceVersion")
            check_status(res, merged)
            return merged
        if sub is not None:
            raise errors.method_not_allowed()
        new = prepare(res, new, creating=False)
        new["metadata"]["deletionTimestamp"] = old["metadata"].get("deletionTimestamp")
        new["metadata"]["deletionGracePeriodSeconds"] = old["metadata"].get("deletionGracePeriodSeconds")
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if new["metadata"][key] is None:
                del new["metadata"][key]
        check_update(res, old, new)
        if res.has_status:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        return new

    def _scale_of(self, dep: dict[str, Any]) -> dict[str, Any]:
        meta = dep["metadata"]
        return {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")},
            "spec": {"replicas": dep["spec"].get("replicas", 1)},
            "status": {"replicas": (dep.get("status") or {}).get("replicas", 0),
                       "selector": label_selector_string(dep["spec"].get("selector"))},
        }

    def _set_scale(self, res: Resource, dep: dict[str, Any], scale: dict[str, Any]) -> dict[str, Any]:
        name = dep["metadata"]["name"]
        replicas = check_replicas((scale.get("spec") or {}).get("replicas"), "Scale", name)
        new = copy.deepcopy(dep)
        new["spec"]["replicas"] = replicas
        expect = (scale.get("metadata") or {}).get("resourceVersion")
        return self._scale_of(self.store.update(res, new, expect_rv=expect))

    def delete(self, res: Resource, ns: str, name: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        options = options or {}
        with self.store.lock:
            obj = self.store.get(res, ns, name)
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
                raise errors.conflict(res.plural, name, res.group, "Precondition failed: UID in precondition does not match")
            if pre.get("resourceVersion") and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]:
                raise errors.conflict(res.plural, name, res.group, "Precondition failed: resourceVersion does not match")
            if options.get("dryRun"):
                return obj
            if obj["metadata"].get("finalizers") or res is NAMESPACES:
                return self._mark_deleting(res, obj)
            if res is PODS:
                return self.store.delete_pod(obj, options.get("gracePeriodSeconds"))
            orphan = options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents") is True
            return self.store.delete(res, ns, name, orphan=orphan)

    def _mark_deleting(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """An object with finalizers (or a namespace, which the namespace controller empties first)
        gets a deletionTimestamp and stays until its finalizers are removed."""
        if obj["metadata"].get("deletionTimestamp"):
            return obj
        new = copy.deepcopy(obj)
        new["metadata"].update(deletionTimestamp=now_iso(), deletionGracePeriodSeconds=0)
        if res is NAMESPACES:
            new.setdefault("status", {})["phase"] = "Terminating"
        return self.store.update(res, new)

    def _finish_deletion(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """The update that removes the last finalizer of a deleted object removes the object."""
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and res is not NAMESPACES:
            self.store.delete(res, meta.get("namespace", ""), meta["name"])
        return obj

    def delete_collection(self, res: Resource, ns: str | None, label_selector: str | None,
                          field_selector: str | None) -> dict[str, Any]:
        with self.store.lock:
            listed = self.list(res, ns, label_selector, field_selector)
            listed["items"] = [self.store.delete(res, o["metadata"].get("namespace", ""), o["metadata"]["name"])
                               for o in listed["items"]]
        return listed

    def evict(self, ns: str, name: str, body: Any) -> dict[str, Any]:
        """policy/v1 Eviction: deletes the pod unless a PodDisruptionBudget forbids it (429)."""
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            raise bad_request("the body of an eviction must be a policy/v1 Eviction")
        with self.store.lock:
            pod = self.store.get(PODS, ns, name)
            for pdb in self.store.list(PDBS, ns):
                self._check_budget(pdb, pod)
            self.delete(PODS, ns, name, body.get("deleteOptions"))
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _check_budget(self, pdb: dict[str, Any], pod: dict[str, Any]) -> None:
        spec = pdb.get("spec") or {}
        matches = label_selector_matcher(spec.get("selector"))
        if not spec.get("selector") or not matches(pod["metadata"].get("labels") or {}):
            return
        pods = [p for p in self.store.list(PODS, pod["metadata"]["namespace"])
                if matches(p["metadata"].get("labels") or {})]
        healthy = sum(1 for p in pods if pod_ready(p))

        def amount(value: Any) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return math.ceil(len(pods) * int(value[:-1]) / 100)
            return int(value)

        allowed = (healthy - amount(spec["minAvailable"]) if "minAvailable" in spec
                   else amount(spec.get("maxUnavailable", 0)) - (len(pods) - healthy))
        if pod_ready(pod) and allowed < 1:
            raise errors.too_many_requests("Cannot evict pod as it would violate the pod's disruption budget.")


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])
