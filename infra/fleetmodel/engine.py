"""One vLLM engine's costs: KV-cache size and the time of one scheduler step, from calibration.yaml.

The formulas are in calibration.yaml's header; this module only reads the table and applies them,
so a new GPU or model is a new entry in the data file, not new code.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
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
    frontend_s: float = 0.0  # arrival -> schedulable: API server, tokenizer, network (holds no GPU)
    chunked_prefill: bool = True  # False: a prompt is prefilled in one step (vLLM's --no-enable-chunked-prefill)

    def with_batching(self, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                      enable_chunked_prefill: bool | None = None) -> Engine:
        """The same engine under other batching arguments (``vllm serve --max-num-seqs`` ...); None keeps one."""
        return replace(
            self,
            max_num_seqs=self.max_num_seqs if max_num_seqs is None else max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens,
            chunked_prefill=self.chunked_prefill if enable_chunked_prefill is None else enable_chunked_prefill,
        )

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


SERVICE_HEADROOM = 1.5  # a profile's replica saturates this much above the capacity it serves within its SLO
# (as Prometheus reads the SLO: histogram_quantile puts any tail over 1 s in the 1-2.5 s bucket)


def engine_for_service(ttft_s: float, tpot_s: float, prompt_tokens: int, output_tokens: int, capacity_rps: float, memory_gib: float) -> Engine:
    """An uncalibrated engine with given service figures, for sandbox profiles that state them.

    Idle, a prompt of ``prompt_tokens`` gets its first token after ``ttft_s`` and each further
    token takes ``tpot_s`` (one decode step). The prompt's compute is the default engine's per
    token; the rest of ``ttft_s`` is front-end time that holds no GPU. ``capacity_rps`` is what the
    replica serves within its SLO, so ``max_num_seqs`` is set for it to saturate ``SERVICE_HEADROOM``
    above: each second spends ``rate * prefill`` on prompts, the rest in steps of ``tpot_s``, and
    Little's law gives the batch that keeps up.
    """
    per_token = load_engine().flop_s_per_token
    prefill_s = min(max(0.0, ttft_s - tpot_s), per_token * prompt_tokens)
    capacity_rps *= SERVICE_HEADROOM
    # N in flight keep up when capacity * output = steps/s * N, with steps of tpot + N * per_token
    # sharing the second with capacity * prefill_s of prompts: N = k tpot / (1 - k per_token)
    k = capacity_rps * output_tokens / max(0.05, 1 - capacity_rps * prefill_s)
    in_flight = k * tpot_s / max(0.05, 1 - k * per_token)
    return Engine(
        name=f"service(ttft={ttft_s:g}s, tpot={tpot_s:g}s, {capacity_rps:g} req/s)",
        gpus=1,
        max_num_seqs=max(1, math.ceil(in_flight)),
        max_num_batched_tokens=8192,
        block_size=16,
        kv_capacity_tokens=10**8,
        kv_bytes_per_token=0,
        weight_bytes=memory_gib * GIB,
        overhead_s=tpot_s,
        flop_s_per_token=per_token,
        weight_read_s=0.0,
        kv_read_s_per_token=0.0,
        busy_duty=float(_table()["engine_defaults"]["busy_duty"]),
        frontend_s=max(0.0, ttft_s - tpot_s - prefill_s),
    )
