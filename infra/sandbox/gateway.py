"""The sandbox gateway's routing: an HTTPRoute's rule for a request, and the replica of a pool.

What a Gateway API implementation with the Inference Extension does, on plain values: the rule
whose header matches are all met wins over a rule without matches (Gateway API precedence: more
header matches first, then rule order); a backend that is an ``InferencePool`` goes to the pool's
Ready replica with the least queue (waiting + running requests, the endpoint picker's queue
scorer), a Service backend round robin (the fleet picks). Used by the fleet's
``POST /gateway/{namespace}/{route}/v1/completions``.
"""

from __future__ import annotations

from collections.abc import Mapping

from workflows.classes.manifests import POOL_GROUP


def _matches(match: dict, headers: Mapping[str, str]) -> bool:
    lowered = {k.lower(): v for k, v in headers.items()}
    for h in match.get("headers") or []:
        if h.get("type", "Exact") != "Exact" or lowered.get(h["name"].lower()) != h.get("value"):
            return False
    return True


def backend_for(route: dict, headers: Mapping[str, str]) -> dict | None:
    """The first backendRef of the rule that takes a request with ``headers`` (None: no rule does)."""
    candidates = []
    for order, rule in enumerate((route.get("spec") or {}).get("rules") or []):
        matches = rule.get("matches") or [{}]
        met = [m for m in matches if _matches(m, headers)]
        if met and rule.get("backendRefs"):
            specificity = max(len(m.get("headers") or []) for m in met)
            candidates.append((-specificity, order, rule["backendRefs"][0]))
    return min(candidates, key=lambda c: c[:2])[2] if candidates else None


def is_pool(backend: dict) -> bool:
    return backend.get("group") == POOL_GROUP and backend.get("kind") == "InferencePool"


def least_queue(queues: Mapping[tuple[str, str], int]) -> tuple[str, str] | None:
    """The replica with the fewest waiting + running requests; ties by name, so the choice is stable."""
    return min(queues, key=lambda key: (queues[key], key)) if queues else None
