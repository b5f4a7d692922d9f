"""The shadow comparison's mirror on the HTTPRoute: a Gateway API ``RequestMirror`` filter on the
route's first rule sending a share of its requests to the canary's Service (the gateway drops the
mirrored answers)."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from workflows.rollout.contract import RouteWeightsInput


MIRROR_FILTER = "RequestMirror"


def mirror_filter(req: RouteWeightsInput) -> dict | None:
    """The Gateway API RequestMirror filter for ``req.mirror`` (percent needs Gateway API >= 1.2)."""
    if req.mirror is None:
        return None
    if req.mirror.version not in req.weights:
        raise ApplicationError(
            f"mirror.version: {req.mirror.version} is not one of the route's versions {sorted(req.weights)}",
            non_retryable=True,
        )
    service = req.deployment.versioned(req.mirror.version)
    return {
        "type": MIRROR_FILTER,
        "requestMirror": {
            "backendRef": {"group": "", "kind": "Service", "name": service, "port": req.port},
            "percent": req.mirror.percent,
        },
    }


def with_mirror(filters: list[dict], mirror: dict | None, services: set[str]) -> list[dict]:
    """The rule's filters with tideplane's mirror set (or removed): a mirror to one of ``services``
    (the deployment's versions) is tideplane's; other filters are kept as they are."""

    def ours(item: dict) -> bool:
        target = ((item.get("requestMirror") or {}).get("backendRef") or {}).get("name")
        return item.get("type") == MIRROR_FILTER and target in services

    kept = [f for f in filters if not ours(f)]
    return [*kept, mirror] if mirror else kept
