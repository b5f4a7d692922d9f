"""Canary analysis: turn one gate measurement into a verdict, and a step's verdicts into a decision.

Pure code (plain values in, plain values out) so the workflow, the unit tests and a dry run use
the same rules. Semantics follow Argo Rollouts' AnalysisRun: a failed measurement counts against
``failure_limit`` (default 0: the first failure rolls back); too few samples is *inconclusive*
and after ``inconclusive_limit`` of them the rollout pauses for a human; a measurement that could
not be taken (Prometheus down, query error) is an *error* with its own consecutive budget, after
which the rollout pauses too. A gate whose query returns no series at all while the canary serves
requests is *metric missing*: waiting cannot fix a metric nobody exports or a selector no scraped
series carries, so the rollout pauses at once and the reason names the metric
(``metric missing: <name>``). Nothing here ever turns missing data into a pass.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

# Gate query names: keys of the query templates and of GateQueriesResult.values.
REQUEST_COUNT = "request_count"
ERROR_RATE = "error_rate"
# What the gateway answered for the canary's backend: its upstreams' 5xx and its own 503s when it found
# no healthy upstream (a lost or crashed pod, which no pod counts), over every request it routed there.
GATEWAY_ERROR_RATE = "gateway_error_rate"
P99_LATENCY = "p99_latency"
P99_LATENCY_SLO = "p99_latency_slo"  # the canary's p99 against the absolute SLO (a check, not a query)
STABLE_P99_LATENCY = "stable_p99_latency"
TTFT_P99 = "ttft_p99"
TPOT_P99 = "tpot_p99"
GATE_NAMES = (REQUEST_COUNT, ERROR_RATE, GATEWAY_ERROR_RATE, P99_LATENCY, STABLE_P99_LATENCY, TTFT_P99, TPOT_P99)


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"


class Gates(BaseModel):
    """Thresholds a canary must meet in every observation."""

    model_config = ConfigDict(extra="forbid")

    max_error_rate: float = Field(
        0.01, ge=0, le=1, description="5xx share of the canary's requests, as its pods and as the gateway counted them"
    )
    max_latency_degradation: float = Field(
        0.20, ge=0, description="canary p99 may exceed stable p99 in the same window by this fraction"
    )
    p99_latency_slo_seconds: float = Field(
        60.0,
        gt=0,
        description="absolute end-to-end p99 SLO: the canary must meet it, and a stable p99 above it makes the"
        " relative comparison meaningless (the verdict is then inconclusive, never a pass)",
    )
    ttft_p99_slo_seconds: float = Field(2.0, gt=0)
    tpot_p99_slo_seconds: float = Field(0.100, gt=0)
    min_requests: float = Field(
        50, ge=0, description="canary requests per window below which the verdict is inconclusive"
    )


class AnalysisLimits(BaseModel):
    """How many bad observations a step tolerates before it acts (Argo AnalysisRun limits)."""

    model_config = ConfigDict(extra="forbid")

    failure_limit: int = Field(0, ge=0, description="failed observations tolerated per step; one more rolls back")
    inconclusive_limit: int = Field(
        10, ge=0, description="inconclusive observations per step (the step waits longer); one more pauses"
    )
    metric_error_limit: int = Field(
        4, ge=0, description="consecutive observations that could not be measured; one more pauses"
    )


class GateCheck(BaseModel):
    gate: str
    value: float
    threshold: float
    passed: bool


class Evaluation(BaseModel):
    """One observation: the verdict, every gate checked with its numbers, and why."""

    verdict: Verdict
    checks: list[GateCheck] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list, description="gates without data")
    metric_missing: list[str] = Field(
        default_factory=list,
        description="metric names of the gate queries that returned no series at all while requests flowed",
    )
    requests: float | None = None
    reason: str = ""

    @property
    def failed(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.passed]

    @property
    def deciding_gate(self) -> str:
        """The gate behind a non-pass verdict (the first failing, or the first without data)."""
        if self.failed:
            return self.failed[0].gate
        if self.missing:
            return self.missing[0]
        return REQUEST_COUNT if self.verdict is Verdict.INCONCLUSIVE else "none"

    def describe(self) -> str:
        """One line with the numbers, for current details, logs and the result."""
        parts = [f"requests {_num(self.requests)}"] if self.requests is not None else []
        parts += [f"{c.gate} {_num(c.value)} {'≤' if c.passed else '>'} {_num(c.threshold)}" for c in self.checks]
        text = f"{self.verdict.value}"
        if parts:
            text += ": " + ", ".join(parts)
        if self.reason:
            text += f" ({self.reason})"
        return text


def _num(value: float) -> str:
    return f"{value:.4g}"


def evaluate(
    values: Mapping[str, float | None] | None,
    gates: Gates,
    error: str | None = None,
    no_series: Mapping[str, Collection[str]] | None = None,
) -> Evaluation:
    """Judge one measurement. ``values`` is None (with ``error``) when the queries could not run;
    ``no_series``: gate -> the metric names its query reads, for each gate whose query returned no
    series at all (not even a NaN one)."""
    if values is None:
        return Evaluation(verdict=Verdict.ERROR, reason=error or "gate queries failed")
    bad = [name for name, v in values.items() if v is not None and not math.isfinite(v)]
    if bad:
        return Evaluation(verdict=Verdict.ERROR, reason=f"non-finite value for {', '.join(sorted(bad))}")
    requests = values.get(REQUEST_COUNT)
    requests = 0.0 if requests is None else requests  # no series: the canary saw no traffic
    if requests < gates.min_requests:
        return Evaluation(
            verdict=Verdict.INCONCLUSIVE,
            requests=requests,
            reason=f"{_num(requests)} requests < minimum {_num(gates.min_requests)}",
        )
    checks: list[GateCheck] = []
    missing: list[str] = []

    def check(gate: str, value: float | None, threshold: float | None) -> None:
        if value is None or threshold is None:
            missing.append(gate)
        else:
            checks.append(GateCheck(gate=gate, value=value, threshold=threshold, passed=value <= threshold))

    check(ERROR_RATE, values.get(ERROR_RATE), gates.max_error_rate)
    if GATEWAY_ERROR_RATE in values:  # queried (a run from before the gateway's gate never asks it)
        check(GATEWAY_ERROR_RATE, values[GATEWAY_ERROR_RATE], gates.max_error_rate)
    stable = values.get(STABLE_P99_LATENCY)
    # A baseline out of its own SLO (a saturated stable) makes "no worse than stable" pass anything:
    # at 20 req/s on 2 stable replicas the relative threshold was 9,106 s (issue 16).
    saturated = stable is not None and stable > gates.p99_latency_slo_seconds
    if not saturated:
        relative = None if stable is None else stable * (1 + gates.max_latency_degradation)
        check(P99_LATENCY, values.get(P99_LATENCY), relative)
    check(P99_LATENCY_SLO, values.get(P99_LATENCY), gates.p99_latency_slo_seconds)
    check(TTFT_P99, values.get(TTFT_P99), gates.ttft_p99_slo_seconds)
    check(TPOT_P99, values.get(TPOT_P99), gates.tpot_p99_slo_seconds)
    if any(not c.passed for c in checks):
        failed = ", ".join(c.gate for c in checks if not c.passed)
        return Evaluation(verdict=Verdict.FAIL, checks=checks, requests=requests, reason=f"failed: {failed}")
    if saturated:
        return Evaluation(
            verdict=Verdict.INCONCLUSIVE,
            checks=checks,
            missing=[STABLE_P99_LATENCY],
            requests=requests,
            reason=f"baseline out of its SLO: stable p99 {_num(stable)}s > {_num(gates.p99_latency_slo_seconds)}s,"
            " no comparison possible",
        )
    absent = {gate: sorted(no_series[gate]) for gate in missing if no_series and gate in no_series}
    if absent:
        names = sorted({name for gate_names in absent.values() for name in gate_names} or set(absent))
        gates_said = "; ".join(f"{gate}: {', '.join(n) or 'its query'}" for gate, n in absent.items())
        return Evaluation(
            verdict=Verdict.INCONCLUSIVE,
            checks=checks,
            missing=missing,
            metric_missing=names,
            requests=requests,
            reason=f"metric missing: {', '.join(names)} (no series at all for {gates_said} while {_num(requests)} requests flowed;"
            " is it exported and scraped with its namespace, deployment and version labels?)",
        )
    if missing:
        return Evaluation(
            verdict=Verdict.INCONCLUSIVE,
            checks=checks,
            missing=missing,
            requests=requests,
            reason=f"no data for {', '.join(missing)}",
        )
    return Evaluation(verdict=Verdict.PASS, checks=checks, requests=requests)


def unread_on_stable(values: Mapping[str, float | None], no_series: Mapping[str, Collection[str]], gates: Gates) -> list[str]:
    """The metrics that the gates' queries, asked about the *stable* version, found no series of while
    the stable served at least ``min_requests``: a gate that cannot read the version already serving
    will not read the canary either, so this is known before any traffic moves. Empty when the stable
    served too little to tell (a quiet hour proves nothing)."""
    if (values.get(REQUEST_COUNT) or 0.0) < gates.min_requests:
        return []
    return sorted({name for gate, names in no_series.items() if gate != REQUEST_COUNT for name in (names or [gate])})


class Decision(str, Enum):
    CONTINUE = "continue"
    ROLLBACK = "rollback"
    PAUSE_INCONCLUSIVE = "pause_inconclusive"
    PAUSE_METRIC_ERRORS = "pause_metric_errors"
    PAUSE_METRIC_MISSING = "pause_metric_missing"


class StepAnalysis(BaseModel):
    """Counts for the current canary step; ``record`` says what the workflow must do next."""

    passes: int = 0
    failures: int = 0
    inconclusives: int = 0
    errors: int = 0
    consecutive_errors: int = 0

    def record(self, evaluation: Evaluation, limits: AnalysisLimits) -> Decision:
        verdict = evaluation.verdict
        self.consecutive_errors = self.consecutive_errors + 1 if verdict is Verdict.ERROR else 0
        if verdict is Verdict.PASS:
            self.passes += 1
        elif verdict is Verdict.FAIL:
            self.failures += 1
            if self.failures > limits.failure_limit:
                return Decision.ROLLBACK
        elif verdict is Verdict.INCONCLUSIVE:
            self.inconclusives += 1
            if self.inconclusives > limits.inconclusive_limit:
                return Decision.PAUSE_INCONCLUSIVE
        else:
            self.errors += 1
            if self.consecutive_errors > limits.metric_error_limit:
                return Decision.PAUSE_METRIC_ERRORS
        return Decision.CONTINUE

    def resumed(self) -> None:
        """A human looked at the pause: give the step a fresh inconclusive and error budget."""
        self.inconclusives = 0
        self.consecutive_errors = 0

    def complete(self, elapsed_seconds: float, window_seconds: float, required_passes: int) -> bool:
        """A step passes once its window has elapsed with enough passing observations."""
        return elapsed_seconds >= window_seconds and self.passes >= required_passes


def required_passes(window_seconds: float, interval_seconds: float) -> int:
    """Passing observations a window must collect: one per interval it spans (at least one)."""
    return max(1, math.floor(window_seconds / interval_seconds + 1e-9))


def canary_replicas(stable_replicas: int, weight: int) -> int:
    """Replicas the canary needs to carry ``weight`` percent of a fleet of ``stable_replicas``."""
    return max(1, math.ceil(stable_replicas * weight / 100))
