"""A canary step: scale the canary up to carry its share and wait until it is Ready, *then* move
the route weight (traffic never lands on capacity that is not there yet), and gate the step until
its window passes: every gate interval a verdict from Prometheus (workflows/rollout/gates.py); a
failure rolls back, too many inconclusive or unmeasurable observations pause for a human (never
promoting blind), and an operator's promote ends the step early."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.core.engine_metrics import metric_names
from workflows.core.failures import cause
from workflows.core.versions import Canary
from workflows.rollout import registry_records
from workflows.rollout.actions import GATES, RollBack, act, checkpoint, next_gate_interval, read_live_total, record_verdict, route, scale_canary, show
from workflows.rollout.contract import GateQueriesInput, RolloutActivities
from workflows.rollout.patches import DIAGNOSIS_PATCH, GATEWAY_ERRORS_PATCH, LIVE_TOTAL_PATCH, METRIC_MISSING_PATCH
from workflows.rollout.gates import REQUEST_COUNT, Decision, StepAnalysis, Verdict, evaluate, required_passes, unread_on_stable
from workflows.rollout.run_state import RunState
from workflows.rollout import cause_actions
from workflows.rollout.types import VerdictRecord

VERDICT_HISTORY = 50  # kept in memory for the status query, not in history


async def shift(state: RunState, weight: int) -> None:
    """Scale the canary to carry ``weight`` % of the stable's live total, wait until Ready, then
    move the route."""
    inp, stable = state.input, state.stable
    assert stable is not None
    if workflow.patched(LIVE_TOTAL_PATCH):
        await read_live_total(state, f"for {weight} %")
    replicas = state.share(weight)
    if replicas != state.canary_replicas:
        await scale_canary(state, replicas, f"for {weight} %")
    await route(state, {stable.version: 100 - weight, inp.version: weight}, f"route {weight} % to {inp.version}")
    state.canary_since = state.canary_since or workflow.now()
    await registry_records.set_status(state, Canary(percent=weight, since=state.canary_since), f"canary at {weight} %")


async def observe(
    state: RunState, weight: int, window_seconds: float, each_window: Callable[[RunState, int], Awaitable[None]]
) -> None:
    """Gate the current step until its window passes (or a human or a verdict ends it);
    ``each_window`` runs after every gate measurement (the shadow comparison's)."""
    inp = state.input
    state.analysis, state.resizes = StepAnalysis(), 0
    started = workflow.now()
    need = required_passes(window_seconds, inp.gate_interval_seconds)
    while True:
        await next_gate_interval(state, f"next gate check at {weight} %")
        if state.promote is not None:
            if not state.promote.full:
                state.promote = None
            return
        record = await _measure(state, weight)
        await each_window(state, weight)
        if workflow.patched(DIAGNOSIS_PATCH):
            held_from = workflow.now()
            next_step = await cause_actions.act_on_cause(state, weight, record)
            if next_step is cause_actions.Next.RESTART:
                state.analysis, started = StepAnalysis(), workflow.now()
                show(state)
                continue
            if next_step is cause_actions.Next.HELD:
                started += workflow.now() - held_from  # the clock did not run while capacity was lost
                show(state)
                continue
        decision = state.analysis.record(record.evaluation, inp.analysis)
        if record.evaluation.metric_missing and decision is Decision.CONTINUE and workflow.patched(METRIC_MISSING_PATCH):
            decision = Decision.PAUSE_METRIC_MISSING  # waiting cannot bring a metric nobody exports
        show(state)  # every verdict, with its numbers and counts, in the UI's current details
        if record.evaluation.verdict is not Verdict.ERROR:  # errors are counted by the query activity
            record_verdict(state, record.evaluation.verdict.value, record.evaluation.deciding_gate)
        if decision is Decision.ROLLBACK:
            raise RollBack(f"gate failed at {weight} %: {record.evaluation.describe()}", record)
        if decision is not Decision.CONTINUE:
            state.paused = True
            if decision is Decision.PAUSE_METRIC_MISSING:
                state.pause_reason = (
                    f"metric missing: {', '.join(record.evaluation.metric_missing)} at {weight} % (never promoting blind):"
                    f" {record.evaluation.describe()}"
                )
            else:
                why = "too few samples" if decision is Decision.PAUSE_INCONCLUSIVE else "metrics unavailable"
                state.pause_reason = f"{why} at {weight} % (never promoting blind): {record.evaluation.describe()}"
            await checkpoint(state)
            state.analysis.resumed()
            continue
        elapsed = (workflow.now() - started).total_seconds()
        if state.analysis.complete(elapsed, window_seconds, need):
            return


async def gates_read_the_stable(state: RunState) -> None:
    """Before the first shift: ask every gate about the stable version, which serves all traffic now.
    A gate whose query finds no series of it while it serves (an unscraped metric, a label the
    relabelling does not write, a gateway without per-backend counters) pauses here, naming the
    metric, with no traffic on the canary; a resume asks again."""
    assert state.stable is not None
    while True:
        variables = {**state.query_variables(), "version": state.stable.version}
        try:
            values, no_series = await _query(state, variables, f"gate queries on the stable {state.stable.version}")
        except ActivityError as err:
            workflow.logger.warning("gates not checked on the stable: %s", cause(err))
            return  # Prometheus unreachable: the first observation's error budget handles it
        unread = unread_on_stable(values, no_series, state.input.gates)
        if not unread:
            return
        state.paused = True
        state.pause_reason = (
            f"metric missing: {', '.join(unread)} on the stable {state.stable.version} before any traffic moved"
            f" (no series while it served {values.get(REQUEST_COUNT):.4g} requests; is it exported and scraped"
            " with its namespace, deployment and version labels? fix it and resume, or give the gate's query in queries)"
        )
        await checkpoint(state)


async def _query(state: RunState, variables: dict[str, str], summary: str) -> tuple[dict[str, float | None], dict[str, list[str]]]:
    """Every gate's query rendered with ``variables``: the values, and gate -> the metric names
    of each gate whose query returned no series at all."""
    queries = state.input.queries.by_gate(gateway=workflow.patched(GATEWAY_ERRORS_PATCH))
    result = await act(
        state,
        RolloutActivities.query_gates,
        GateQueriesInput(queries=queries, variables=variables),
        summary=summary,
        start_to_close=30,
        retry=GATES,
        read_only=True,
    )
    return result.values, {gate: metric_names(queries[gate]) for gate in result.no_series if gate in queries}


async def _measure(state: RunState, weight: int) -> VerdictRecord:
    assert state.stable is not None
    try:
        values, no_series = await _query(state, state.query_variables(), f"gate queries at {weight} %")
        evaluation = evaluate(values, state.input.gates, no_series=no_series)
    except ActivityError as err:
        evaluation = evaluate(None, state.input.gates, error=f"gate queries failed: {cause(err)}")
    record = VerdictRecord(at=workflow.now(), weight=weight, evaluation=evaluation)
    state.verdicts = [*state.verdicts[-(VERDICT_HISTORY - 1) :], record]
    state.verdict_count += 1
    return record
