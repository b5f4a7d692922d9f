"""vLLM's batching settings as engine arguments, and what a sweep measured of them (pure).

vLLM batches continuously; how much it batches is set by ``--max-num-seqs`` (requests in the
running batch), ``--max-num-batched-tokens`` (tokens one scheduler step computes: the prefill
chunk budget) and ``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``. The rollout's
warm-up measures settings and chooses one (workflows/rollout/batching.py); the registry keeps the
sweep (``SweepRecord``, in ``BenchmarkResult.batching``); the sandbox's fleet simulator reads the
settings from a replica's arguments (``engine_overrides``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


MAX_NUM_SEQS = "--max-num-seqs"
MAX_NUM_BATCHED_TOKENS = "--max-num-batched-tokens"
CHUNKED_PREFILL = "--enable-chunked-prefill"
NO_CHUNKED_PREFILL = "--no-enable-chunked-prefill"
_VALUED = (MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS)
_FLAGS = (CHUNKED_PREFILL, NO_CHUNKED_PREFILL)


class BatchingSetting(BaseModel):
    """One point of the sweep, as vLLM's engine arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: int = Field(ge=1, le=65_536)
    max_num_batched_tokens: int = Field(ge=16, le=1_048_576)
    chunked_prefill: bool = True

    def label(self) -> str:
        chunk = "chunked" if self.chunked_prefill else "whole prefill"
        return f"seqs {self.max_num_seqs}, tokens {self.max_num_batched_tokens}, {chunk}"

    def engine_args(self) -> list[str]:
        """The arguments as ``vllm serve`` spells them."""
        return [
            MAX_NUM_SEQS, str(self.max_num_seqs),
            MAX_NUM_BATCHED_TOKENS, str(self.max_num_batched_tokens),
            CHUNKED_PREFILL if self.chunked_prefill else NO_CHUNKED_PREFILL,
        ]


def with_engine_args(args: list[str], setting: BatchingSetting) -> list[str]:
    """``args`` with their batching arguments (``--x N``, ``--x=N``, the prefill flags) replaced by ``setting``'s."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _FLAGS:
            continue
        if name in _VALUED:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept + setting.engine_args()


def engine_overrides(args: list[str]) -> dict[str, int | bool]:
    """The batching settings ``args`` give (``max_num_seqs``, ``max_num_batched_tokens``,
    ``enable_chunked_prefill``); the ones not given are absent (the engine's defaults hold)."""
    out: dict[str, int | bool] = {}
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in _VALUED:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            if value.isdigit() and int(value) > 0:
                out[name.lstrip("-").replace("-", "_")] = int(value)
        elif name in _FLAGS:
            out["enable_chunked_prefill"] = name == CHUNKED_PREFILL
    return out


class SweepPoint(BaseModel):
    """What one setting gave under the sweep's load."""

    setting: BatchingSetting
    tokens_per_second: float = Field(ge=0, description="generated tokens per second of the run")
    ttft_p99_seconds: float | None = Field(None, description="vLLM's histogram over the run (None: no data)")
    tpot_p99_seconds: float | None = None
    requests: int = Field(ge=0)
    errors: int = Field(ge=0)


class SweepRecord(BaseModel):
    """A sweep as the registry keeps it (``BenchmarkResult.batching``)."""

    ttft_slo_seconds: float
    tpot_slo_seconds: float
    prompt_tokens: int
    output_tokens: int
    points: list[SweepPoint]
    chosen: BatchingSetting
    reason: str
