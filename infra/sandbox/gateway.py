"""The sandbox gateway's routing: an HTTPRoute's rule for a request, and the replica of a pool.

What a Gateway API implementation with the Inference Extension does, on plain values: the rule
whose header matches are all met wins over a rule without matches (Gateway API precedence: more
header matches first, then rule order); a backend that is an ``InferencePool`` goes to the pool's
Ready replica with the least queue (waiting + running requests, the endpoint picker's queue
scorer), a Service backend round robin (the fleet picks). Used by the fleet's
``POST /gateway/{namespace}/{route}/v1/completions``.

Model-name routing as the Inference Extension's body-based router does it: the request's ``model``
is copied into the ``X-Gateway-Model-Name`` header, which rules match on; a rule's backends are
drawn by weight, and a backend's ``RequestHeaderModifier`` may set that header to another name
(an adapter version), which the endpoint picker writes back into the body's ``model``.
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


MODEL_HEADER = "X-Gateway-Model-Name"


def backend_for(route: dict, headers: Mapping[str, str], draw: float = 0.0) -> dict | None:
    """The backendRef of the rule that takes a request with ``headers`` (None: no rule does),
    drawn by weight with ``draw`` in [0, 1) (a rule whose weights are all 0 takes its first)."""
    candidates = []
    for order, rule in enumerate((route.get("spec") or {}).get("rules") or []):
        matches = rule.get("matches") or [{}]
        met = [m for m in matches if _matches(m, headers)]
        if met and rule.get("backendRefs"):
            specificity = max(len(m.get("headers") or []) for m in met)
            candidates.append((-specificity, order, rule["backendRefs"]))
    if not candidates:
        return None
    backends = min(candidates, key=lambda c: c[:2])[2]
    total = sum(int(b.get("weight", 1)) for b in backends)
    point = draw * total
    for backend in backends:
        point -= int(backend.get("weight", 1))
        if point < 0:
            return backend
    return backends[0]


def headers_set_by(backend: dict) -> dict[str, str]:
    """The headers a backendRef's ``RequestHeaderModifier`` filters set."""
    return {
        h["name"]: h["value"]
        for f in backend.get("filters") or [] if f.get("type") == "RequestHeaderModifier"
        for h in (f.get("requestHeaderModifier") or {}).get("set") or []
    }


def is_pool(backend: dict) -> bool:
    return backend.get("group") == POOL_GROUP and backend.get("kind") == "InferencePool"
