"""The rollout's batching sweep at warm-up: what to measure, and the choice among what it measured (pure).

The settings are vLLM's engine arguments (workflows/core/batching_settings.py). More batching
raises throughput until the step time, and with it TPOT, grows past its SLO; less batching keeps
steps short but lets requests wait, and TTFT grows. The rollout's warm-up measures a few
settings against the version's own traffic shape and keeps the highest throughput whose TTFT
and TPOT p99 stay within the SLO (``choose_setting``); the benchmark (``tideplane bench
batching``) scores the same choice in the fleet model.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workflows.core.batching_settings import BatchingSetting, SweepPoint
from workflows.core.bounds import Seconds

# vLLM's own choice for the OpenAI server on a >= 70 GiB GPU (EngineArgs.get_batch_defaults, V1),
# as infra/fleetmodel/calibration.yaml records it: the baseline every sweep includes.
VLLM_DEFAULT = BatchingSetting(max_num_seqs=1024, max_num_batched_tokens=8192, chunked_prefill=True)

DEFAULT_CANDIDATES = (
    VLLM_DEFAULT,
    BatchingSetting(max_num_seqs=256, max_num_batched_tokens=2048),
    BatchingSetting(max_num_seqs=128, max_num_batched_tokens=1024),
    BatchingSetting(max_num_seqs=64, max_num_batched_tokens=512),
)


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


class SweepChoice(BaseModel):
    """The setting to keep, and why."""

    setting: BatchingSetting
    within_slo: list[BatchingSetting] = Field(default_factory=list, description="empty: none met the SLO at the sweep's load")
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
