"""Batching settings of a vLLM engine, and the choice among those a sweep measured (pure).

vLLM batches continuously; how much it batches is set by ``--max-num-seqs`` (requests in the
running batch), ``--max-num-batched-tokens`` (tokens one scheduler step computes: the prefill
chunk budget) and ``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``. More batching
raises throughput until the step time, and with it TPOT, grows past its SLO; less batching keeps
steps short but lets requests wait, and TTFT grows. The rollout's warm-up measures a few
settings against the version's own traffic shape and keeps the highest throughput whose TTFT
and TPOT p99 stay within the SLO (``choose_setting``); the benchmark (``tideplane bench
batching``) scores the same choice in the fleet model.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workflows.core.bounds import Seconds

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


# vLLM's own choice for the OpenAI server on a >= 70 GiB GPU (EngineArgs.get_batch_defaults, V1),
# as infra/fleetmodel/calibration.yaml records it: the baseline every sweep includes.
VLLM_DEFAULT = BatchingSetting(max_num_seqs=1024, max_num_batched_tokens=8192, chunked_prefill=True)

DEFAULT_CANDIDATES = (
    VLLM_DEFAULT,
    BatchingSetting(max_num_seqs=256, max_num_batched_tokens=2048),
    BatchingSetting(max_num_seqs=128, max_num_batched_tokens=1024),
    BatchingSetting(max_num_seqs=64, max_num_batched_tokens=512),
)


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


class BatchingSweep(BaseModel):
    """Ask the rollout to tune batching at warm-up (``RolloutInput.batching``)."""

    model_config = ConfigDict(extra="forbid")

    ttft_slo_seconds: Seconds = Field(2.0, description="p99 time to first token each candidate must stay within")
    tpot_slo_seconds: Seconds = Field(0.1, description="p99 time per output token each candidate must stay within")
    candidates: list[BatchingSetting] = Field(
        default_factory=lambda: list(DEFAULT_CANDIDATES), min_length=1, max_length=16,
        description="settings to measure, in this order (the last measured stays on until the choice is applied)",
    )
    requests: int = Field(64, ge=1, le=10_000, description="completions sent per candidate")
    concurrency: int = Field(32, ge=1, le=1024, description="completions in flight at once")
    prompt_tokens: int | None = Field(
        None, ge=1, le=1_000_000, description="request size; None: the deployment's mean over the last hour (Prometheus)"
    )
    output_tokens: int | None = Field(None, ge=1, le=1_000_000, description="max_tokens; None: the deployment's mean")
    deadline_seconds: Seconds = Field(1800, description="the whole sweep: a rollout of the pods and a run per candidate")

    @model_validator(mode="after")
    def _distinct(self) -> BatchingSweep:
        if len(set(self.candidates)) != len(self.candidates):
            raise ValueError("candidates: the same setting is listed twice")
        return self


class SweepPoint(BaseModel):
    """What one setting gave under the sweep's load."""

    setting: BatchingSetting
    tokens_per_second: float = Field(ge=0, description="generated tokens per second of the run")
    ttft_p99_seconds: float | None = Field(None, description="vLLM's histogram over the run (None: no data)")
    tpot_p99_seconds: float | None = None
    requests: int = Field(ge=0)
    errors: int = Field(ge=0)


class SweepChoice(BaseModel):
    """The setting to keep, and why."""

    setting: BatchingSetting
    within_slo: list[BatchingSetting] = Field(default_factory=list, description="empty: none met the SLO at the sweep's load")
    reason: str


class SweepRecord(BaseModel):
    """A sweep as the registry keeps it (``BenchmarkResult.batching``)."""

    ttft_slo_seconds: float
    tpot_slo_seconds: float
    prompt_tokens: int
    output_tokens: int
    points: list[SweepPoint]
    chosen: BatchingSetting
    reason: str


def within_slo(point: SweepPoint, ttft_slo_s: float, tpot_slo_s: float, max_error_rate: float = 0.05) -> bool:
    """Both p99s measured and within their SLOs, and (almost) every request answered."""
    return (
        point.ttft_p99_seconds is not None
        and point.tpot_p99_seconds is not None
        and point.ttft_p99_seconds <= ttft_slo_s
        and point.tpot_p99_seconds <= tpot_slo_s
        and point.errors <= max_error_rate * max(1, point.requests)
    )


def choose_setting(points: list[SweepPoint], ttft_slo_s: float, tpot_slo_s: float) -> SweepChoice:
    """The highest throughput among the points within the SLO (ties: the first measured).

    When none is within, the load of the sweep was more than one replica serves at the SLO
    whatever the batching (the scaling loop's matter): vLLM's defaults are kept when they were
    measured, else the first candidate, and the reason says so.
    """
    if not points:
        raise ValueError("no sweep points to choose from")
    good = [p for p in points if within_slo(p, ttft_slo_s, tpot_slo_s)]
    slo = f"TTFT p99 <= {ttft_slo_s:g}s and TPOT p99 <= {tpot_slo_s:g}s"
    if not good:
        kept = next((p for p in points if p.setting == VLLM_DEFAULT), points[0])
        measured = "; ".join(f"{p.setting.label()}: {_describe(p)}" for p in points)
        return SweepChoice(setting=kept.setting, reason=f"no setting kept {slo} ({measured}); kept {kept.setting.label()}")
    best = max(good, key=lambda p: p.tokens_per_second)  # max keeps the first of equals
    return SweepChoice(
        setting=best.setting,
        within_slo=[p.setting for p in good],
        reason=f"{best.setting.label()}: {_describe(best)}, the highest throughput of {len(good)} of {len(points)} settings with {slo}",
    )


def _describe(p: SweepPoint) -> str:
    return f"{p.tokens_per_second:.1f} tokens/s, TTFT p99 {_fmt(p.ttft_p99_seconds)}, TPOT p99 {_fmt(p.tpot_p99_seconds)}"


def _fmt(seconds: float | None) -> str:
    return "no data" if seconds is None else f"{seconds:.3g}s"
