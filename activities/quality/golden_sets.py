"""A model's golden sets in the registry: ``registry/<model>/golden.json``, every revision kept.

Stored in the registry's bucket beside the model's manifests, through the registry store's
compare-and-swap (activities/registry/): setting the same set again is unchanged, and a set for a
model the registry does not hold is refused. ``tideplane registry golden set|show`` and the
rollout's ``read_golden_set`` read and write them here.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone

from activities.registry.store import PREFIX, NotFound, Registry
from workflows.quality.golden_set import GoldenHistory, GoldenRevision, GoldenSet


def golden_key(model: str) -> str:
    return f"{PREFIX}/{model}/golden.json"


def golden_history(registry: Registry, model: str) -> GoldenHistory | None:
    """Every revision of the model's golden set, or None when it has none."""
    return registry.read_document(golden_key(model), GoldenHistory)[0]


def set_golden_set(registry: Registry, model: str, golden: GoldenSet, at: datetime | None = None) -> tuple[GoldenRevision, bool]:
    """Store ``golden`` as the model's next revision (compare-and-swap); the same set again is
    unchanged (False). Refused for a model that is not in the registry."""
    if model not in registry.list_models():
        raise NotFound(f"model {model!r} is not in the registry (register a version first)")
    digest = hashlib.sha256(golden.model_dump_json().encode()).hexdigest()
    changed = [False]

    def add(history: GoldenHistory | None) -> GoldenHistory | None:
        history = history or GoldenHistory(model=model)
        changed[0] = history.current is None or history.current.sha256 != digest
        if not changed[0]:
            return None
        number = history.current.revision + 1 if history.current else 1
        history.revisions.append(GoldenRevision(revision=number, sha256=digest, set_at=at or datetime.now(timezone.utc), golden=golden))
        return history

    history = registry.update_document(golden_key(model), GoldenHistory, add)
    assert history is not None and history.current is not None
    return history.current, changed[0]
