"""What ModelRollout reads from and writes to the model registry: the weights of a version named by
model and version only, the version's status as it moves (testing -> canary -> stable, or back), and
its warm-up benchmark and golden-set verdict. Composes the registry capability (its contract).

Bookkeeping must not decide a rollout: a failed write is logged and the rollout goes on. Status is
kept only for weights that came from the registry (``RunState.in_registry``).
"""

from __future__ import annotations

from typing import Any, Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.core.failures import cause
from workflows.core.verdicts import GoldenVerdict
from workflows.core.versions import Canary, Deprecated, Stable, Testing, WeightFile
from workflows.registry.contract import (
    RecordRegistryBenchmarkInput,
    RegistryActivities,
    RegistryWeightsInput,
    SetRegistryStatusInput,
)
from workflows.registry.schema import BenchmarkResult
from workflows.rollout.actions import LOOKUP, act
from workflows.rollout.run_state import RunState


async def weight_files(state: RunState) -> list[WeightFile]:
    """The version's weight files: from the input, or resolved in the registry by model and version."""
    inp = state.input
    if inp.weights_uri is not None and inp.sha256 is not None:
        return [WeightFile(uri=inp.weights_uri, sha256=inp.sha256)]
    resolved = await act(
        state,
        RegistryActivities.resolve_registry_weights,
        RegistryWeightsInput(model=inp.model, version=inp.version),
        summary=f"look up {inp.model} {inp.version} in the model registry",
        # NotFoundError: no worker implements the registry lookup; say so instead of retrying
        retry=LOOKUP,
        read_only=True,
    )
    return resolved.files


async def set_status(state: RunState, status: Testing | Canary | Stable | Deprecated, reason: str) -> None:
    """The version's status on this deployment, when its weights came from the registry."""
    if state.in_registry:
        inp = state.input
        await _write(
            state,
            RegistryActivities.set_registry_status,
            SetRegistryStatusInput(
                model=inp.model, version=inp.version, status=status, reason=reason, at=workflow.now(), deployment=inp.deployment
            ),
            f"registry: {inp.model} {inp.version} -> {status.state}",
        )


async def record_warm_up(state: RunState) -> None:
    """The warm-up benchmark (and the batching sweep, when one ran), with the version."""
    if not state.in_registry or state.benchmark is None:
        return
    inp, b = state.input, state.benchmark
    await _write(
        state,
        RegistryActivities.record_registry_benchmark,
        RecordRegistryBenchmarkInput(
            model=inp.model,
            version=inp.version,
            benchmark=BenchmarkResult(
                tokens_per_second=b.tokens_per_second,
                p50_latency_seconds=b.p50_latency_seconds,
                p99_latency_seconds=b.p99_latency_seconds,
                dataset="warm-up",
                measured_at=workflow.now(),
                requests=b.requests,
                errors=b.errors,
                image=inp.image,
                deployment=inp.deployment,
                batching=state.sweep,
            ),
        ),
        "record the warm-up benchmark in the registry",
    )


async def record_golden(state: RunState, revision: int, cases: int, errors: int, verdict: GoldenVerdict) -> None:
    """The golden set's verdict, as a benchmark of the version on that revision of the set."""
    if not state.in_registry or state.benchmark is None:
        return
    inp, b = state.input, state.benchmark
    await _write(
        state,
        RegistryActivities.record_registry_benchmark,
        RecordRegistryBenchmarkInput(
            model=inp.model,
            version=inp.version,
            benchmark=BenchmarkResult(
                tokens_per_second=b.tokens_per_second,
                p50_latency_seconds=b.p50_latency_seconds,
                p99_latency_seconds=b.p99_latency_seconds,
                dataset=f"golden set r{revision}",
                measured_at=workflow.now(),
                requests=cases,
                errors=errors,
                image=inp.image,
                deployment=inp.deployment,
                golden=verdict,
            ),
        ),
        "record the golden-set verdict in the registry",
    )


async def _write(state: RunState, method: Callable, arg: Any, summary: str) -> None:
    try:
        await act(state, method, arg, summary=summary, interruptible=False)
    except ActivityError as err:
        workflow.logger.warning("%s failed: %s", method.__name__, cause(err))
