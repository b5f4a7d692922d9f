"""An adapter's traffic split as Gateway API objects: pure values, shared by activities and tests.

Requests carry the adapter's name in the body's ``model``; the Inference Extension's body-based
router copies it into ``X-Gateway-Model-Name``, and one HTTPRoute rule matching that header takes
them. Each adapter version is a backendRef to the base version's Service with its weight and a
``RequestHeaderModifier`` setting the header to the version's served name, which the endpoint
picker writes back into the body: the replicas, which hold every loaded version, answer with it.
What the model rollout shares of these rules and of ``--lora-modules`` is workflows/core/lora.py.
"""

from __future__ import annotations

import re

from workflows.core.lora import MODEL_HEADER
from workflows.core.routes import inference_matches


def served_name(adapter: str, version: str) -> str:
    """The lora_name one adapter version is loaded under (two versions live in one process)."""
    return f"{adapter}-{version}"


def matches_adapter(rule: dict, adapter: str) -> bool:
    return any(
        h.get("name", "").lower() == MODEL_HEADER.lower() and h.get("value") == adapter
        for m in rule.get("matches") or [] for h in m.get("headers") or []
    )


def adapter_rule(adapter: str, service: str, port: int, weights: dict[str, int]) -> dict:
    """The rule for ``adapter``: one weighted backend per served name, all to ``service``."""
    return {
        "matches": inference_matches([{"type": "Exact", "name": MODEL_HEADER, "value": adapter}]),
        "backendRefs": [
            {
                "group": "", "kind": "Service", "name": service, "port": port, "weight": weight,
                "filters": [{"type": "RequestHeaderModifier",
                             "requestHeaderModifier": {"set": [{"name": MODEL_HEADER, "value": name}]}}],
            }
            for name, weight in sorted(weights.items())
        ],
    }


def with_adapter_rule(rules: list[dict], adapter: str, rule: dict) -> list[dict]:
    """``rules`` with the adapter's rule replaced (or appended after the others: the default rule
    stays first, where the model rollout sets its weights)."""
    kept = [r for r in rules if not matches_adapter(r, adapter)]
    return [*kept, rule]


def is_version_of(name: str, adapter: str) -> bool:
    """Whether a served name is one of ``adapter``'s versions (``sql-lora-1.0.0``, not ``sql-lora-v2-1.0.0``)."""
    rest = name[len(adapter) + 1:] if name.startswith(f"{adapter}-") else ""
    return bool(re.fullmatch(r"\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.+-]*)?", rest))


def with_adapter_module(modules: dict[str, str], adapter: str, version: str, path: str) -> dict[str, str]:
    """``modules`` holding ``adapter`` at ``version`` only: a promotion replaces the old version."""
    return {**{n: p for n, p in modules.items() if not is_version_of(n, adapter)}, served_name(adapter, version): path}
