"""The one BackendTrafficPolicy per HTTPRoute that the queue limit and the token quotas share (pure).

Envoy Gateway applies a single ``BackendTrafficPolicy`` per target: it sorts the policies by
creation time and a later one on the same HTTPRoute gets ``Accepted=False`` with reason
``Conflicted`` ("Unable to target HTTPRoute ..., another BackendTrafficPolicy has already attached
to it"; envoyproxy/gateway internal/gatewayapi/backendtrafficpolicy.go). So the scaling loop's
queue limit and ``tideplane quotas apply`` write one object, ``naming.traffic_policy_name(route)``,
each owning its own fields of the spec and leaving the other's as it found them (read, merge,
replace with the resourceVersion read). Objects of the names used before (``<route>-queue-limit``,
``<route>-token-quotas``) are adopted: the fields of the other writer that the shared object lacks
are copied from them, and the writer deletes them once the shared object is written. A writer that
stops (the queue limit turned off) takes its fields out again (``without_writer``), and the object
goes once nothing is left in it but its target.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

QUEUE_LIMIT_FIELDS = ("circuitBreaker", "responseOverride")  # the scaling loop's (workflows/scaling/queue_limit.py)
QUOTA_FIELDS = ("rateLimit",)  # tideplane quotas apply's (workflows/quotas/policy.py)
WRITERS_FIELDS = QUEUE_LIMIT_FIELDS + QUOTA_FIELDS


def legacy_policy_names(route: str) -> tuple[str, str]:
    """The per-writer names of before: the queue limit's and the token quotas'."""
    return f"{route}-queue-limit", f"{route}-token-quotas"


def merged_policy(current: dict | None, wanted: dict, owns: Iterable[str], legacy: Iterable[dict] = ()) -> dict:
    """What to write: ``current`` (None: none yet) with the writer's ``owns`` fields of ``wanted``'s
    spec set (absent in ``wanted``: removed), its target, labels and annotations added, and the other
    writer's fields kept — or, where ``current`` lacks them, taken from the ``legacy`` objects."""
    owns = tuple(owns)
    out = copy.deepcopy(current) if current is not None else {
        "apiVersion": wanted["apiVersion"], "kind": wanted["kind"],
        "metadata": {"name": wanted["metadata"]["name"], "namespace": wanted["metadata"]["namespace"]}, "spec": {}}
    spec, meta = out.setdefault("spec", {}), out["metadata"]
    for old in legacy:
        for field in WRITERS_FIELDS:
            if field not in owns and field not in spec and field in (old.get("spec") or {}):
                spec[field] = copy.deepcopy(old["spec"][field])
        kept = old["metadata"].get("annotations") or {}
        meta["annotations"] = {**kept, **(meta.get("annotations") or {})}
    spec["targetRefs"] = copy.deepcopy(wanted["spec"]["targetRefs"])
    for field in owns:
        if field in wanted["spec"]:
            spec[field] = copy.deepcopy(wanted["spec"][field])
        else:
            spec.pop(field, None)
    for key in ("labels", "annotations"):
        meta[key] = {**(meta.get(key) or {}), **(wanted["metadata"].get(key) or {})}
    return out


def without_writer(current: dict, owns: Iterable[str], annotations: Iterable[str] = ()) -> dict | None:
    """``current`` with the writer's ``owns`` fields of the spec and its ``annotations`` taken out, every
    other field kept as found; None when its spec then holds nothing but the target: delete the object."""
    out = copy.deepcopy(current)
    spec, meta = out.setdefault("spec", {}), out["metadata"]
    for field in owns:
        spec.pop(field, None)
    if meta.get("annotations"):
        drop = set(annotations)
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k not in drop}
    return None if set(spec) <= {"targetRefs"} else out
