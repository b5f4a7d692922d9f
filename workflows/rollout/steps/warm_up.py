"""Warm-up: wait until the new version's first replicas are Ready and warm them up with requests
(their benchmark), tune vLLM's batching on them when asked (workflows/rollout/batching.py), record
both in the registry, then run the model's golden set against the new version and stable: all before
any user request reaches the new version. Composes quality (the golden set) and the registry."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.core.batching_settings import SweepRecord
from workflows.core.failures import cause
from workflows.quality.contract import GoldenRunInput, GoldenSetInput, QualityActivities
from workflows.quality.golden_set import golden_verdict
from workflows.rollout import registry_records
from workflows.rollout.actions import LOOKUP, RollBack, act, set_stage, show
from workflows.rollout.batching import choose_setting
from workflows.rollout.contract import (
    BatchingActivities,
    Benchmark,
    EngineArgsInput,
    RolloutActivities,
    SweepBatchingInput,
    WaitReadyInput,
    WarmUpInput,
)
from workflows.rollout.patches import BATCHING_PATCH, GOLDEN_PATCH
from workflows.rollout.run_state import RunState
from workflows.rollout.types import Stage


async def run(state: RunState, replicas: int) -> Benchmark:
    """Warm up ``replicas`` replicas, tune batching, record, run the golden set; the warm-up's benchmark."""
    set_stage(state, Stage.WARMING_UP)
    await _warm_up(state, replicas)
    await _tune_batching(state)
    await registry_records.record_warm_up(state)
    await _golden_set(state)
    return state.benchmark


async def _warm_up(state: RunState, replicas: int) -> None:
    """Wait for Ready and send warm-up requests, both inside the warm-up deadline."""
    inp = state.input
    deadline = workflow.now() + timedelta(seconds=inp.warm_up.deadline_seconds)
    try:
        ready = await act(
            state,
            RolloutActivities.wait_ready,
            WaitReadyInput(deployment=state.ref, version=inp.version, replicas=replicas),
            summary=f"wait for {replicas} replica(s) of {inp.version} to be Ready (cold start)",
            schedule_to_close=(deadline - workflow.now()).total_seconds(),
            heartbeat=30,
        )
        state.cold_start = ready.seconds
        state.benchmark = await act(
            state,
            RolloutActivities.warm_up,
            WarmUpInput(
                deployment=state.ref,
                version=inp.version,
                model=inp.model,
                requests=inp.warm_up.requests,
                max_tokens=inp.warm_up.max_tokens,
                prompt=inp.warm_up.prompt,
                max_error_rate=inp.warm_up.max_error_rate,
            ),
            summary=f"warm up {inp.version} with {inp.warm_up.requests} requests and benchmark it",
            schedule_to_close=max(1.0, (deadline - workflow.now()).total_seconds()),
            heartbeat=30,
        )
    except ActivityError as err:
        raise RollBack(f"warm-up did not finish within {inp.warm_up.deadline_seconds:.0f}s: {cause(err)}") from err
    if state.benchmark.errors >= state.benchmark.requests:
        raise RollBack(f"warm-up: all {state.benchmark.requests} requests to {inp.version} failed")


async def _tune_batching(state: RunState) -> None:
    """Measure each batching setting on the new replicas before they see users, keep the
    highest throughput within the TTFT/TPOT SLO in the Deployment's engine args; the sweep goes to
    the registry with the warm-up benchmark."""
    inp = state.input
    sweep_in = inp.batching
    if sweep_in is None or not workflow.patched(BATCHING_PATCH):
        return
    try:
        sweep = await act(
            state,
            BatchingActivities.sweep_batching,
            SweepBatchingInput(
                deployment=state.ref,
                version=inp.version,
                model=inp.model,
                candidates=sweep_in.candidates,
                requests=sweep_in.requests,
                concurrency=sweep_in.concurrency,
                prompt_tokens=sweep_in.prompt_tokens,
                output_tokens=sweep_in.output_tokens,
            ),
            summary=f"batching sweep of {inp.version}: {len(sweep_in.candidates)} settings, {sweep_in.requests} requests each",
            schedule_to_close=sweep_in.deadline_seconds,
            heartbeat=120,
        )
        choice = choose_setting(sweep.points, sweep_in.ttft_slo_seconds, sweep_in.tpot_slo_seconds)
        await act(
            state,
            BatchingActivities.set_engine_args,
            EngineArgsInput(deployment=state.ref, version=inp.version, setting=choice.setting),
            summary=f"keep {choice.setting.label()} in {inp.version}'s engine args",
            schedule_to_close=inp.deadlines.step_ready_seconds,
            heartbeat=60,
        )
    except ActivityError as err:
        raise RollBack(f"batching sweep failed: {cause(err)}") from err
    state.batching = choice
    state.sweep = SweepRecord(
        ttft_slo_seconds=sweep_in.ttft_slo_seconds,
        tpot_slo_seconds=sweep_in.tpot_slo_seconds,
        prompt_tokens=sweep.prompt_tokens,
        output_tokens=sweep.output_tokens,
        points=sweep.points,
        chosen=choice.setting,
        reason=choice.reason,
    )
    show(state, f"batching: {choice.reason}")


async def _golden_set(state: RunState) -> None:
    """The model's golden set against the new version and stable (recorded in the registry with the
    warm-up benchmark); a failure rolls back before any traffic moves and deprecates the version."""
    inp = state.input
    if not workflow.patched(GOLDEN_PATCH):
        return
    found = await act(
        state,
        QualityActivities.read_golden_set,
        GoldenSetInput(model=inp.model),
        summary=f"look up the golden set of {inp.model} in the registry",
        retry=LOOKUP,
        read_only=True,
    )
    if found.current is None:
        return
    golden = found.current.golden
    stable = state.stable.version if state.stable else None
    run = await act(
        state,
        QualityActivities.run_golden_set,
        GoldenRunInput(deployment=state.ref, model=inp.model, version=inp.version, stable_version=stable, golden=golden),
        summary=f"golden set r{found.current.revision} ({len(golden.cases)} cases) against {inp.version}"
        + (f" and {stable}" if stable else ""),
        schedule_to_close=max(60.0, inp.warm_up.deadline_seconds),
        heartbeat=60,
    )
    state.golden = golden_verdict(golden, run.new, run.stable, found.current.revision)
    show(state)
    errors = sum(1 for r in run.new if any(f.startswith("request failed") for f in r.failures))
    await registry_records.record_golden(state, found.current.revision, len(golden.cases), errors, state.golden)
    if not state.golden.passed:
        raise RollBack(f"golden set failed at warm-up: {'; '.join(state.golden.reasons)}", quality=True)
