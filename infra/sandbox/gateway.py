"""The sandbox gateway's routing: an HTTPRoute's rule for a request, and the replica of a pool.

What a Gateway API implementation with the Inference Extension does, on plain values: a rule takes
a request whose path one of its matches meets (none: every path) with all that match's headers; an
Exact path wins over a prefix, then more header matches, then rule order (Gateway API precedence);
a request no rule takes is answered 404; a backend that is an ``InferencePool`` goes to the pool's
Ready replica with the least queue (waiting + running requests, the endpoint picker's queue
scorer), a Service backend round robin (the fleet picks). Used by the fleet's
``POST /gateway/{namespace}/{route}/v1/completions``.

What it answered is counted as Envoy counts it, per backend (``UpstreamStats``).

Model-name routing as the Inference Extension's body-based router does it: the request's ``model``
is copied into the ``X-Gateway-Model-Name`` header, which rules match on; a rule's backends are
drawn by weight, and a backend's ``RequestHeaderModifier`` may set that header to another name
(an adapter version), which the endpoint picker writes back into the body's ``model``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

POOL_GROUP = "inference.networking.k8s.io"  # the Gateway API Inference Extension's InferencePool

# The gateway's own exposition on the fleet simulator (its Envoy, endpoint picker and AI gateway
# series), scraped as a job of its own: a gateway is a separate process from the engines and DCGM.
GATEWAY_METRICS_PATH = "/gateway/metrics"


def _path_matches(match: dict, path: str) -> bool:
    """Gateway API path matching: none is ``PathPrefix /``; ``Exact``; ``PathPrefix`` by whole segments."""
    want = match.get("path") or {"type": "PathPrefix", "value": "/"}
    value = want.get("value", "/")
    if want.get("type", "PathPrefix") == "Exact":
        return path == value
    return value == "/" or path == value.rstrip("/") or path.startswith(value.rstrip("/") + "/")


def _matches(match: dict, headers: Mapping[str, str], path: str = "/v1/completions") -> bool:
    if not _path_matches(match, path):
        return False
    lowered = {k.lower(): v for k, v in headers.items()}
    for h in match.get("headers") or []:
        if h.get("type", "Exact") != "Exact" or lowered.get(h["name"].lower()) != h.get("value"):
            return False
    return True


MODEL_HEADER = "X-Gateway-Model-Name"


def backend_for(route: dict, headers: Mapping[str, str], draw: float = 0.0, path: str = "/v1/completions") -> dict | None:
    """The backendRef of the rule that takes a request for ``path`` with ``headers`` (None: no rule
    does), drawn by weight with ``draw`` in [0, 1) (a rule whose weights are all 0 takes its first)."""
    candidates = []
    for order, rule in enumerate((route.get("spec") or {}).get("rules") or []):
        matches = rule.get("matches") or [{}]
        met = [m for m in matches if _matches(m, headers, path)]
        if met and rule.get("backendRefs"):
            specificity = max(((m.get("path") or {}).get("type") == "Exact", len(m.get("headers") or [])) for m in met)
            candidates.append(((-specificity[0], -specificity[1]), order, rule["backendRefs"]))
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


Backend = tuple[str, str, str]  # (namespace, route, version): the labels a relabelled envoy_cluster_name gives


class UpstreamStats:
    """Envoy's cluster statistics, per backend, with the names and labels Prometheus scrapes from a
    real Envoy (``namespace``, ``deployment``, ``version`` by relabelling): requests sent upstream
    (``envoy_cluster_upstream_rq_total``), their answers by class (``envoy_cluster_upstream_rq_xx``,
    ``envoy_response_code_class``) and requests the gateway answered 503 itself because the backend
    had no healthy host (``envoy_cluster_upstream_cx_none_healthy``; never an upstream request)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[Backend, float] = {}
        self.answers: dict[tuple[Backend, str], float] = {}  # (backend, "2" | "5") -> answers
        self.none_healthy: dict[Backend, float] = {}

    def answered(self, backend: Backend, ok: float = 0.0, failed: float = 0.0) -> None:
        """Upstream answers: ``ok`` 2xx, ``failed`` 5xx (an engine's error, a reset, a timeout)."""
        with self._lock:
            self.requests[backend] = self.requests.get(backend, 0.0) + ok + failed
            for code_class, count in (("2", ok), ("5", failed)):
                self.answers[(backend, code_class)] = self.answers.get((backend, code_class), 0.0) + count

    def found_none_healthy(self, backend: Backend, count: float = 1.0) -> None:
        with self._lock:
            self.none_healthy[backend] = self.none_healthy.get(backend, 0.0) + count

    def samples(self) -> list[tuple[str, str, dict[str, str], float]]:
        """(family, help, labels, value) of every counter, for the fleet's exposition."""
        def labels(backend: Backend) -> dict[str, str]:
            return {"namespace": backend[0], "deployment": backend[1], "version": backend[2]}

        with self._lock:
            return [
                *(("envoy_cluster_upstream_rq_total", "Total requests.", labels(b), n) for b, n in self.requests.items()),
                *(("envoy_cluster_upstream_rq_xx", "Upstream answers by response code class.",
                   {**labels(b), "envoy_response_code_class": code_class}, n) for (b, code_class), n in self.answers.items()),
                *(("envoy_cluster_upstream_cx_none_healthy", "Requests the gateway found no healthy upstream for (answered 503).",
                   labels(b), n) for b, n in self.none_healthy.items()),
            ]
