"""Status conditions as the controllers set them: lastTransitionTime kept unless the status changes."""

from __future__ import annotations

from typing import Any

from .timestamps import now_iso


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


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


def node_ready(node: dict[str, Any]) -> bool:
    cond = condition(node, "Ready")
    return bool(cond and cond.get("status") == "True")
