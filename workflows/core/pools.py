"""Priority classes and the capacity they run on: realtime on on-demand nodes, batch on spot.

A serving pod's nodeSelector and tolerations come from its class (the rollout writes them); the
scaling loops size the pool of the matching capacity type. Pure.
"""

from __future__ import annotations

from typing import Literal

from workflows.core.naming import NODE_CAPACITY_TYPE

PoolClass = Literal["realtime", "batch"]
CAPACITY_FOR_CLASS: dict[str, str] = {"realtime": "on-demand", "batch": "spot"}
CLASS_FOR_CAPACITY: dict[str, PoolClass] = {v: k for k, v in CAPACITY_FOR_CLASS.items()}

# Taint an operator puts on spot nodes to keep everything but batch work off them (Karpenter and
# EKS do not taint spot by default; with the taint, only pods tolerating it land there).
SPOT_TAINT = {"key": NODE_CAPACITY_TYPE, "value": "spot", "effect": "NoSchedule"}


def node_selector(pool_class: PoolClass) -> dict[str, str]:
    """The pod spec nodeSelector that keeps a class on its capacity type (required, like a node affinity).

    A nodeSelector rather than a nodeAffinity term so that whoever moves the pods elsewhere (the
    spot failover's on-demand twin) overrides the one key instead of adding a second, conflicting
    requirement.
    """
    return {NODE_CAPACITY_TYPE: CAPACITY_FOR_CLASS[pool_class]}


def tolerations(pool_class: PoolClass) -> list[dict]:
    """Batch pods tolerate the spot taint; realtime pods never need to (they select on-demand nodes)."""
    return [{**SPOT_TAINT, "operator": "Equal"}] if pool_class == "batch" else []
