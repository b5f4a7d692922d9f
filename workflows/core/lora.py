"""LoRA adapters as a base version carries them: vLLM's ``--lora-modules`` (the adapters a replica
loads at start) and the HTTPRoute rules that send an adapter's model name to the base version's
Service (matched on the ``X-Gateway-Model-Name`` header).

Shared by the model rollout, which carries a stable version's adapters to the version it promotes
(their ``--lora-modules``, then their rules), and the adapter rollout (workflows/adapters/), which
canaries one adapter on a base. Pure values.
"""

from __future__ import annotations

import json


MODEL_HEADER = "X-Gateway-Model-Name"


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
