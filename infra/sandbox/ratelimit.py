"""The sandbox gateway's token rate limits and token counters: what Envoy Gateway with AI Gateway does.

- Rate limits: the ``rateLimit`` of the ``BackendTrafficPolicy`` the gateway enforces on an HTTPRoute
  (the oldest that targets it; Envoy Gateway's global rate limit; its queue limit is the fleet simulator's, infra/sandbox/fleet_simulator/). A rule applies to a request whose headers meet one of its client selectors
  (``Exact`` header matches; other match types select nothing here). Each rule counts in fixed
  windows of its unit; a request adds the rule's request cost (default 1) and is refused (429)
  when that would pass the limit, or when a request that costs nothing finds the limit already
  reached; an answer adds its tokens to rules whose response cost is the token metadata.
- Counters: every answer's prompt and completion tokens in Envoy AI Gateway's
  ``gen_ai_client_token_usage`` (histogram; ``_sum`` is the token counter), labelled with the
  tenant header, the model, the version that answered and the request class.

Windows run on the fleet's clock (sandbox seconds), like everything else in the sandbox.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from workflows.classes.manifests import CLASS_HEADER
from workflows.quotas.policy import MONTHLY_QUOTAS_ANNOTATION, OVER_QUOTA_ANNOTATION, TENANT_HEADER

UNIT_SECONDS = {"Second": 1, "Minute": 60, "Hour": 3600, "Day": 86400, "Month": 30 * 86400, "Year": 365 * 86400}
TOKEN_FAMILY = "gen_ai_client_token_usage"


def _header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def _header_met(h: dict, headers: Mapping[str, str]) -> bool:
    """An ``Exact`` header match, ``invert`` as Envoy's ``invert_match`` (a missing header meets an inverted one)."""
    if h.get("type", "Exact") != "Exact":
        return False
    equal = _header(headers, h["name"]) == h.get("value")
    return not equal if h.get("invert") else equal


def _selected(rule: dict, headers: Mapping[str, str]) -> bool:
    selectors = rule.get("clientSelectors") or [{}]
    return any(all(_header_met(h, headers) for h in s.get("headers") or []) for s in selectors)


def _refusal(policy: dict, rule: dict) -> str:
    """Why a rule refused: the monthly quota when tideplane cut the tenant off, else the rate limit."""
    meta = policy["metadata"]
    where = f"BackendTrafficPolicy {meta.get('namespace')}/{meta['name']}"
    header = next((h for s in rule.get("clientSelectors") or [] for h in s.get("headers") or []), {})
    if header.get("invert"):
        limit = rule["limit"]
        return f"rate limit reached: {limit['requests']} tokens per {limit['unit']} for callers without a known {header.get('name')} ({where})"
    tenant = header.get("value", "")
    annotations = meta.get("annotations") or {}
    if tenant and tenant in (annotations.get(OVER_QUOTA_ANNOTATION) or "").split(","):
        quota = json.loads(annotations.get(MONTHLY_QUOTAS_ANNOTATION) or "{}").get(tenant)
        return f"tenant {tenant} is over its monthly token quota ({quota} tokens); refused until the month turns ({where})"
    limit = rule["limit"]
    return f"rate limit reached: {limit['requests']} tokens per {limit['unit']} for {header.get('name')}={tenant} ({where})"


@dataclass
class Admission:
    """A request let through: the rule windows its answer's tokens count against."""

    token_windows: list[tuple[tuple[str, str, int], int]]


class TokenGate:
    """Rate-limit state and token counters of the sandbox gateway; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: dict[tuple[str, str, int], tuple[int, float]] = {}  # (ns, policy, rule) -> (window, used)
        self._tokens: dict[tuple[tuple[str, str], ...], list[float]] = {}  # labels -> [tokens, answers]

    def admit(self, policies: list[dict], namespace: str, headers: Mapping[str, str], now: float) -> Admission | str:
        """Let a request through the ``policies`` that target its route (charging their request
        costs), or say which limit refuses it."""
        with self._lock:
            charges, token_windows = [], []
            for policy in policies:
                rate = ((policy.get("spec") or {}).get("rateLimit") or {})
                for index, rule in enumerate((rate.get("global") or {}).get("rules") or []):
                    if not _selected(rule, headers):
                        continue
                    key = (namespace, policy["metadata"]["name"], index)
                    window = int(now // UNIT_SECONDS.get(rule["limit"]["unit"], 60))
                    seen, used = self._used.get(key, (window, 0.0))
                    used = used if seen == window else 0.0
                    cost = rule.get("cost") or {}
                    request_cost = (cost.get("request") or {"number": 1}).get("number", 0)
                    limit = rule["limit"]["requests"]
                    if used + request_cost > limit or (request_cost == 0 and used >= limit):
                        return _refusal(policy, rule)
                    charges.append((key, window, used + request_cost))
                    if (cost.get("response") or {}).get("from") == "Metadata":
                        token_windows.append((key, window))
            for key, window, used in charges:
                self._used[key] = (window, used)
            return Admission(token_windows)

    def answered(self, admission: Admission, labels: dict[str, str], headers: Mapping[str, str],
                 prompt_tokens: int, completion_tokens: int) -> None:
        """Count an answer's tokens: in the rules it passed and in the token counters."""
        with self._lock:
            for key, window in admission.token_windows:
                seen, used = self._used.get(key, (window, 0.0))
                self._used[key] = (window, (used if seen == window else 0.0) + prompt_tokens + completion_tokens)
            base = {**labels, "tenant": _header(headers, TENANT_HEADER) or "anonymous",
                    "request_class": _header(headers, CLASS_HEADER) or "default"}
            for kind, tokens in (("input", prompt_tokens), ("output", completion_tokens)):
                entry = self._tokens.setdefault(tuple(sorted({**base, "gen_ai_token_type": kind}.items())), [0.0, 0])
                entry[0] += tokens
                entry[1] += 1

    def series(self) -> list[tuple[dict[str, str], float, int]]:
        """(labels, tokens, answers) of every token counter."""
        with self._lock:
            return [(dict(key), tokens, count) for key, (tokens, count) in self._tokens.items()]
