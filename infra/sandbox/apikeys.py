"""The sandbox gateway's API key authentication: what Envoy Gateway does with a SecurityPolicy's ``apiKeyAuth``.

Envoy Gateway (``gateway.envoyproxy.io/v1alpha1`` SecurityPolicy, Envoy's ``api_key_auth`` filter):
the policy that targets an HTTPRoute (the oldest, when several do) names Secrets whose data keys
are client IDs and whose values are their API keys, and the request headers to take the key from
(``extractFrom``; query parameters and cookies are not read here). The first listed header present
holds the key, a ``Bearer `` prefix stripped. A request with no key, or a key no Secret holds, is
answered 401 before any other filter; one whose Secret is missing gets 500, as a route whose
policy cannot be translated does. An accepted request continues with the key's client ID in
``forwardClientIDHeader``, replacing any value the client sent under that name, and without its
key where ``sanitize`` is set. The rate limits (infra/sandbox/ratelimit.py) run after this, on the
headers it returns, as Envoy Gateway orders its authentication filters before its rate limit.

Pure, on plain values: no product code (the fleet reads the policies and Secrets from the API).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

SECURITY_POLICY_API = ("gateway.envoyproxy.io", "v1alpha1", "securitypolicies")
BEARER = "Bearer "


def targets(policy: dict, namespace: str, route: str) -> bool:
    """Whether ``policy`` targets the HTTPRoute ``namespace/route``."""
    if policy["metadata"].get("namespace") != namespace:
        return False
    return any(ref.get("kind") == "HTTPRoute" and ref.get("name") == route
               for ref in (policy.get("spec") or {}).get("targetRefs") or [])


def enforced(policies: list[dict], namespace: str, route: str) -> dict | None:
    """The SecurityPolicy the gateway applies to the route: the oldest that targets it (then by name)."""
    targeting = [p for p in policies if targets(p, namespace, route)]
    targeting.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
    return targeting[0] if targeting else None


def secret_refs(policy: dict) -> list[tuple[str, str]]:
    """(namespace, name) of the Secrets a policy's ``apiKeyAuth`` reads."""
    auth = (policy.get("spec") or {}).get("apiKeyAuth") or {}
    namespace = policy["metadata"].get("namespace")
    return [(ref.get("namespace") or namespace, ref["name"]) for ref in auth.get("credentialRefs") or []
            if ref.get("kind", "Secret") == "Secret" and not ref.get("group")]


def client_keys(secret: dict) -> dict[str, str]:
    """A Secret's data as client ID -> API key (values base64, as the API serves them)."""
    out = {}
    for client_id, value in (secret.get("data") or {}).items():
        try:
            out[client_id] = base64.b64decode(value, validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
    return out


def _get(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def authenticate(policy: dict | None, secrets: Mapping[tuple[str, str], dict], headers: Mapping[str, str]) -> dict[str, str] | tuple[int, str]:
    """The headers the request goes on with after the route's SecurityPolicy, or (status, why) it is refused.

    ``secrets``: the Secrets the fleet read, by (namespace, name)."""
    out = dict(headers.items())
    auth = ((policy or {}).get("spec") or {}).get("apiKeyAuth")
    if not auth:
        return out
    where = f"SecurityPolicy {policy['metadata'].get('namespace')}/{policy['metadata']['name']}"
    keys: dict[str, str] = {}
    for ref in secret_refs(policy):
        if ref not in secrets:
            return 500, f"{where}: Secret {ref[0]}/{ref[1]} not found"
        keys.update(client_keys(secrets[ref]))
    sources = [h for source in auth.get("extractFrom") or [] for h in source.get("headers") or []]
    presented = next((value for h in sources if (value := _get(out, h)) is not None), None)
    if presented is None:
        return 401, f"Client authentication failed: no API key in {', '.join(sources) or 'the request'} ({where})"
    presented = presented[len(BEARER):] if presented.startswith(BEARER) else presented
    client = next((cid for cid, key in keys.items() if key and key == presented), None)
    if client is None:
        return 401, f"Client authentication failed: the API key is not valid ({where})"
    forward = auth.get("forwardClientIDHeader")
    dropped = {h.lower() for h in sources} if auth.get("sanitize") else set()
    if forward:
        dropped.add(forward.lower())
    out = {k: v for k, v in out.items() if k.lower() not in dropped}
    if forward:
        out[forward] = client
    return out
