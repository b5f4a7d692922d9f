"""Predictive pre-warm: the floor to hold now so that the next hours' usual peak finds replicas ready.

Demand is tidal and repeats by weekday and hour, and a replica needs minutes to become Ready, so
the floor for "now" is the expected peak of every hour slot between now and now + start-up time,
where the expected peak of a slot is a quantile of that slot's peaks over past weeks.
The history is demand: by default the hourly peak arrival rate, turned into replicas by the
loop's own SLO sizing (``workflows.scaling.decide.slo_replicas``), never the replicas the fleet
had (those include the floors pre-warm itself raised, which would carry one week's floor into the
next for ever) nor DCGM utilisation (under vLLM ~100 % whenever a batch runs).
``prewarm_floor`` is pure (the history arrives keyed by local ``"<weekday>:<hour>"``, Monday = 0)
and reused by the scaling benchmark; the PredictivePrewarm workflow, which a Temporal Schedule
starts every few minutes, reads the history and sets the result as the loop's ``prewarm`` floor.

API (stable): workflow type PredictivePrewarm.
"""

from __future__ import annotations

import math
from datetime import timedelta

from typing import Literal

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    import workflows.core.naming as naming
    from workflows.core.bounds import Seconds, SecondsOrZero
    from workflows.scaling.contract import (
        DEFAULT_DEMAND_HISTORY_QUERY,
        ReplicaHistoryInput,
        ScalingActivities,
    )
    from workflows.scaling.decide import ScalingPolicy, slo_replicas
    from workflows.scaling.floors import SET_FLOOR_SIGNAL, SetFloor


def slot_key(weekday: int, hour: int) -> str:
    return f"{weekday}:{hour}"


def expected_peak(samples: list[float], quantile: float = 0.75) -> float | None:
    """Linear-interpolated quantile of a slot's weekly peaks (None: no history)."""
    if not samples:
        return None
    ordered = sorted(samples)
    pos = quantile * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class Prewarm(BaseModel):
    floor: int = Field(ge=0)
    slots: dict[str, float | None] = Field(description="slot -> expected peak, for the slots looked at")
    reason: str


def prewarm_floor(
    samples: dict[str, list[float]],
    weekday: int,
    minute_of_day: int,
    startup_seconds: float,
    quantile: float = 0.75,
) -> Prewarm:
    """Floor for now: max expected peak over the slots from now to now + start-up time."""
    start = weekday * 1440 + minute_of_day
    end = start + math.ceil(startup_seconds / 60)
    slots: dict[str, float | None] = {}
    for minute in range(start - start % 60, end + 1, 60):
        wrapped = minute % (7 * 1440)
        key = slot_key(wrapped // 1440, (wrapped % 1440) // 60)
        slots[key] = expected_peak(samples.get(key, []), quantile)
    known = [v for v in slots.values() if v is not None]
    floor = math.ceil(max(known)) if known else 0
    reason = (
        f"expected peak {floor} over slots {', '.join(slots)} (q{quantile:g} of past weeks, start-up {startup_seconds:.0f}s)"
        if known
        else "no history for the coming slots: floor 0"
    )
    return Prewarm(floor=floor, slots=slots, reason=reason)


class PrewarmInput(BaseModel):
    deployment: naming.DeploymentName
    time_zone: str = "UTC"
    weeks: int = Field(4, ge=1, le=12)
    startup_seconds: SecondsOrZero = Field(600, description="node boot + image pull + weight load + warm-up")
    quantile: float = Field(0.75, ge=0, le=1)
    ttl_seconds: Seconds = Field(3600, description="how long the predicted floor holds if not renewed")
    query: str = Field(DEFAULT_DEMAND_HISTORY_QUERY, description="hourly peaks of the demand")
    history: Literal["arrival_rate", "replicas"] = Field(
        "arrival_rate", description="what the query returns: requests/s (sized with `sizing`) or replicas needed"
    )
    sizing: ScalingPolicy = Field(
        default_factory=ScalingPolicy, description="the loop's policy: its SLO sizing turns arrival rates into replicas"
    )


def demand_replicas(samples: dict[str, list[float]], sizing: ScalingPolicy) -> dict[str, list[float]]:
    """Hourly peak arrival rates as the replicas the loop's SLO sizing wants for them."""
    return {slot: [float(slo_replicas(rate, sizing)) for rate in rates] for slot, rates in samples.items()}


@workflow.defn(name="PredictivePrewarm")
class PredictivePrewarm:
    """Raises the loop's floor ahead of the usual peak of this weekday and hour."""

    @workflow.run
    async def run(self, input: PrewarmInput) -> str:
        namespace, name = naming.split_deployment(input.deployment)
        history = await workflow.execute_activity_method(
            ScalingActivities.read_replica_history,
            ReplicaHistoryInput(
                namespace=namespace,
                deployment=name,
                time_zone=input.time_zone,
                weeks=input.weeks,
                at=workflow.now().timestamp(),
                query=input.query,
            ),
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=1)),
            summary=f"replica history, {input.weeks} weeks",
        )
        samples = demand_replicas(history.samples, input.sizing) if input.history == "arrival_rate" else history.samples
        plan = prewarm_floor(samples, history.weekday, history.minute_of_day, input.startup_seconds, input.quantile)
        loop = workflow.get_external_workflow_handle(naming.scaling_workflow_id(input.deployment))
        await loop.signal(SET_FLOOR_SIGNAL, SetFloor(replicas=plan.floor, source="prewarm", ttl_seconds=input.ttl_seconds))
        workflow.set_current_details(plan.reason)
        return plan.reason
