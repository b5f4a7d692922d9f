"""One vLLM engine's costs: KV-cache size and the time of one scheduler step, from calibration.yaml.

The formulas are in calibration.yaml's header; this module only reads the table and applies them,
so a new GPU or model is a new entry in the data file, not new code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

CALIBRATION = Path(__file__).with_name("calibration.yaml")
GIB = 2**30


@dataclass(frozen=True)
class Engine:
    """A vLLM replica's shape and cost model (per GPU of its tensor-parallel group)."""

    name: str
    gpus: int  # tensor-parallel size: GPUs one replica holds
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    kv_capacity_tokens: int  # KV-cache slots the replica has, in tokens
    kv_bytes_per_token: int  # whole model (all layers, all heads), before the TP split
    weight_bytes: float
    overhead_s: float
    flop_s_per_token: float  # seconds of compute per batched token (prefill or decode), per step
    weight_read_s: float  # seconds to stream the weights once (per GPU, at the effective bandwidth)
    kv_read_s_per_token: float  # seconds to read one token's KV (per GPU)
    busy_duty: float

    def step_seconds(self, batched_tokens: float, kv_tokens: float) -> float:
        """One step over ``batched_tokens`` (prefill chunks + one per decoding sequence) reading ``kv_tokens``."""
        compute = batched_tokens * self.flop_s_per_token
        memory = self.weight_read_s + kv_tokens * self.kv_read_s_per_token
        return self.overhead_s + (compute if compute > memory else memory)


def _table() -> dict:
    return yaml.safe_load(CALIBRATION.read_text())


@functools.cache
def load_engine(name: str | None = None, **overrides) -> Engine:
    """The engine ``name`` of calibration.yaml (its ``default_engine`` when None); ``overrides``
    replace engine settings (max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, ...)."""
    table = _table()
    name = name or table["default_engine"]
    if name not in table["engines"]:
        raise ValueError(f"no engine {name!r} in {CALIBRATION.name}; known: {sorted(table['engines'])}")
    spec = {**table["engine_defaults"], **table["engines"][name], **overrides}
    model, gpu = table["models"][spec["model"]], table["gpus"][spec["gpu"]]
    tp = int(spec["tensor_parallel"])
    params = model["params_b"] * 1e9
    weight_bytes = params * model["dtype_bytes"]
    kv_per_token = 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * model["dtype_bytes"]
    usable = tp * (gpu["memory_gib"] * GIB * spec["gpu_memory_utilization"] - spec["activation_reserve_gib"] * GIB) - weight_bytes
    if usable <= 0:
        raise ValueError(f"{name}: weights ({weight_bytes / GIB:.0f} GiB) do not fit in {tp} x {spec['gpu']} at {spec['gpu_memory_utilization']}")
    blocks = int(usable // (kv_per_token * spec["block_size"]))
    bandwidth = gpu["hbm_tb_s"] * 1e12 * spec["hbm_efficiency"]
    return Engine(
        name=name,
        gpus=tp,
        max_num_seqs=int(spec["max_num_seqs"]),
        max_num_batched_tokens=int(spec["max_num_batched_tokens"]),
        block_size=int(spec["block_size"]),
        kv_capacity_tokens=blocks * int(spec["block_size"]),
        kv_bytes_per_token=kv_per_token,
        weight_bytes=weight_bytes,
        overhead_s=spec["overhead_ms"] / 1000,
        flop_s_per_token=2 * params / tp / (gpu["bf16_dense_tflops"] * 1e12 * spec["mfu"]),
        weight_read_s=weight_bytes / tp / bandwidth,
        kv_read_s_per_token=kv_per_token / tp / bandwidth,
        busy_duty=float(spec["busy_duty"]),
    )


def measurements(name: str) -> list[dict]:
    """The published figures calibration.yaml fits ``name`` to (each with its source in the file)."""
    return list(_table()["engines"][name].get("measured") or [])


def engine_names() -> list[str]:
    return sorted(_table()["engines"])
