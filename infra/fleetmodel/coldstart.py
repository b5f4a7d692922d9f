"""A replica's cold start by its parts (coldstart.yaml) and what the levers of issue 14 take off it.

A fresh GPU node pays every part: node launch, image pull, weights from S3, weights into the GPU,
torch.compile, CUDA-graph capture, engine init, warm-up. A node started from an EC2 warm pool
joins faster and has the serving image on its volume already; with the node-local weight cache it
skips S3; with the engine caches (``VLLM_CACHE_ROOT`` kept per model version on the node) it loads
the compiled graphs instead of compiling. The data file cites every figure; this module adds them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

COLDSTART = Path(__file__).with_name("coldstart.yaml")


@dataclass(frozen=True)
class Levers:
    """Which of the cold-start levers a warm-pool node has (a fresh node has none)."""

    warm_pool: bool = False
    local_weights: bool = False  # the registry's current version staged on the node's volume
    engine_caches: bool = False  # torch.compile cache (VLLM_CACHE_ROOT) on the node's volume


@dataclass(frozen=True)
class ColdStart:
    parts_s: dict[str, float]
    node_gpus: int
    stopped_node_usd_per_hour: float  # a warm-pool node's EBS volumes

    def fresh(self) -> dict[str, float]:
        """The parts a replica on a freshly launched node pays."""
        p = self.parts_s
        names = ("node_fresh", "image_pull", "weights_s3", "weights_load", "compile", "graph_capture", "engine_init", "warmup")
        return {name: p[name] for name in names}

    def warm(self, levers: Levers) -> dict[str, float]:
        """The parts a replica on a node drawn from the warm pool pays, with ``levers``."""
        p = self.parts_s
        parts = {"node_warm": p["node_warm"], "image_cached": p["image_cached"]}
        if not levers.local_weights:
            parts["weights_s3"] = p["weights_s3"]
        parts["weights_load"] = p["weights_load"]
        parts["compile_cached" if levers.engine_caches else "compile"] = p["compile_cached" if levers.engine_caches else "compile"]
        for name in ("graph_capture", "engine_init", "warmup"):
            parts[name] = p[name]
        return parts

    @property
    def fresh_s(self) -> float:
        return sum(self.fresh().values())

    def warm_s(self, levers: Levers) -> float:
        return sum(self.warm(levers).values())

    @property
    def refill_s(self) -> float:
        """A new instance launched into the warm pool until it can be drawn: launch, image pull, and
        (the pool's lifecycle hook) the node cache staged before it stops."""
        p = self.parts_s
        return p["node_fresh"] + p["image_pull"] + p["weights_s3"]


@functools.cache
def load_cold_start(path: Path = COLDSTART) -> ColdStart:
    table = yaml.safe_load(path.read_text())
    node = table["node"]
    stopped = node["volume_gib"] * node["gp3_usd_per_gib_month"] / node["hours_per_month"]
    return ColdStart(parts_s={k: float(v) for k, v in table["parts_s"].items()}, node_gpus=int(node["gpus"]), stopped_node_usd_per_hour=stopped)
