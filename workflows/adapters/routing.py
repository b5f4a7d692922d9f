"""An adapter's traffic split as Gateway API objects: pure values, shared by activities and tests.

Requests carry the adapter's name in the body's ``model``; the Inference Extension's body-based
router copies it into ``X-Gateway-Model-Name``, and one HTTPRoute rule matching that header takes
them. Each adapter version is a backendRef to the base version's Service with its weight and a
``RequestHeaderModifier`` setting the header to the version's served name, which the endpoint
picker writes back into the body: the replicas, which hold every loaded version, answer with it.
"""

from __future__ import annotations

import json
import re

MODEL_HEADER = "X-Gateway-Model-Name"


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
        "matches": [{"headers": [{"type": "Exact", "name": MODEL_HEADER, "value": adapter}]}],
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


def _adapter_name(rule: dict) -> str | None:
    return next((h.get("value") for m in rule.get("matches") or [] for h in m.get("headers") or []
                 if h.get("name", "").lower() == MODEL_HEADER.lower()), None)


def adapters_on(rules: list[dict], service: str) -> list[str]:
    """The adapters whose rule sends requests to ``service`` (a base version's Service)."""
    return sorted({name for r in rules if (name := _adapter_name(r)) is not None
                   and any(b.get("name") == service for b in r.get("backendRefs") or [])})


def moved_adapter_rules(rules: list[dict], old_service: str, new_service: str | None) -> list[dict]:
    """``rules`` with every adapter rule's backends on ``old_service`` moved to ``new_service``
    (None: those rules removed, their base gone); the default rule and the others kept."""
    on_old = set(adapters_on(rules, old_service))
    moved = []
    for rule in rules:
        if _adapter_name(rule) not in on_old:
            moved.append(rule)
        elif new_service is not None:
            moved.append({**rule, "backendRefs": [{**b, "name": new_service} if b.get("name") == old_service else b
                                                  for b in rule.get("backendRefs") or []]})
    return moved


# ---- vLLM's --lora-modules: the adapters a base replica holds from its start --------------------

LORA_MODULES_ARG = "--lora-modules"


def _module(item: str) -> tuple[str, str]:
    """One ``--lora-modules`` item: vLLM's ``name=path`` or its JSON form ``{"name", "path", ...}``
    (what vLLM's LoRAParserAction accepts)."""
    if "=" in item and "," not in item:
        name, path = item.split("=", 1)
        return name, path
    parsed = json.loads(item)
    return str(parsed["name"]), str(parsed["path"])


def lora_modules(args: list[str]) -> dict[str, str]:
    """The adapters (served name -> path) a server started with ``args`` loads at start. vLLM's
    flag takes every following item up to the next flag; a repeated flag replaces the earlier one."""
    modules: dict[str, str] = {}
    for at, arg in enumerate(args):
        if arg == LORA_MODULES_ARG:
            modules = {}
            for item in args[at + 1:]:
                if item.startswith("--"):
                    break
                if item:
                    name, path = _module(item)
                    modules[name] = path
    return modules


def with_lora_modules(args: list[str], modules: dict[str, str]) -> list[str]:
    """``args`` with exactly one ``--lora-modules name=path ...`` holding ``modules`` (none: no flag)."""
    kept, skipping = [], False
    for arg in args:
        if arg == LORA_MODULES_ARG:
            skipping = True
            continue
        if skipping and not arg.startswith("--"):
            continue
        skipping = False
        kept.append(arg)
    if not modules:
        return kept
    return [*kept, LORA_MODULES_ARG, *(f"{name}={path}" for name, path in sorted(modules.items()))]


def is_version_of(name: str, adapter: str) -> bool:
    """Whether a served name is one of ``adapter``'s versions (``sql-lora-1.0.0``, not ``sql-lora-v2-1.0.0``)."""
    rest = name[len(adapter) + 1:] if name.startswith(f"{adapter}-") else ""
    return bool(re.fullmatch(r"\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.+-]*)?", rest))


def with_adapter_module(modules: dict[str, str], adapter: str, version: str, path: str) -> dict[str, str]:
    """``modules`` holding ``adapter`` at ``version`` only: a promotion replaces the old version."""
    return {**{n: p for n, p in modules.items() if not is_version_of(n, adapter)}, served_name(adapter, version): path}
