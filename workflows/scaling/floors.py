"""Floors of a ReactiveScaling loop: time-of-day profiles and the ScheduleFloor workflow that sets them.

A profile says "from 09:00 on weekdays keep at least 8 replicas"; `tideplane schedules apply`
turns each entry into a Temporal Schedule whose action starts ScheduleFloor, which sends the loop
a ``set_floor`` signal. `floor_at` is the same rule evaluated in pure code (for `schedules list`,
tests and the scaling benchmark). A loop keeps one floor per source (schedule, prewarm, manual)
and holds the highest.

API (stable): workflow type ScheduleFloor; signal ``set_floor`` of ReactiveScaling.
"""

from __future__ import annotations

import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from temporalio import workflow

from workflows.core.bounds import Replicas, Seconds, SecondsOrZero
from workflows.core.naming import DeploymentName, scaling_workflow_id

SET_FLOOR_SIGNAL = "set_floor"  # ReactiveScaling's signal; ScheduleFloor and PredictivePrewarm send it

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")  # index = datetime.weekday()
DAY_ALIASES = {"weekdays": WEEKDAYS[:5], "weekends": WEEKDAYS[5:], "daily": WEEKDAYS}
_WEEK_MINUTES = 7 * 1440


def check_time_zone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}") from None
    return name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FloorEntry(_Strict):
    at: str = Field(description="local HH:MM")
    replicas: Replicas
    days: list[str] = Field(default_factory=lambda: list(WEEKDAYS), description="mon..sun, weekdays, weekends, daily")
    name: str | None = Field(None, pattern=r"^[a-z0-9][-a-z0-9]*$")

    @field_validator("at")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        m = re.fullmatch(r"(\d{1,2}):(\d{2})", value)
        if not m or int(m[1]) > 23 or int(m[2]) > 59:
            raise ValueError(f"expected HH:MM, got {value!r}")
        return f"{int(m[1]):02d}:{m[2]}"

    @field_validator("days")
    @classmethod
    def _days(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for day in value:
            day = day.lower()
            expanded = DAY_ALIASES.get(day, (day,))
            for d in expanded:
                if d not in WEEKDAYS:
                    raise ValueError(f"unknown day {day!r} (use {', '.join(WEEKDAYS)}, weekdays, weekends, daily)")
                if d not in out:
                    out.append(d)
        return sorted(out, key=WEEKDAYS.index)

    @property
    def hour(self) -> int:
        return int(self.at[:2])

    @property
    def minute(self) -> int:
        return int(self.at[3:])

    @property
    def weekdays(self) -> list[int]:
        return [WEEKDAYS.index(d) for d in self.days]

    @property
    def key(self) -> str:
        """Stable per-entry part of the schedule ID."""
        if self.name:
            return self.name
        days = "" if len(self.days) == 7 else "-" + "-".join(self.days)
        return self.at.replace(":", "") + days


class PrewarmSpec(_Strict):
    """Run predictive pre-warm every ``every_minutes`` from the deployment's past weeks."""

    every_minutes: int = Field(10, ge=1, le=60)
    weeks: int = Field(4, ge=1, le=12)
    startup_seconds: SecondsOrZero = 600
    quantile: float = Field(0.75, ge=0, le=1)
    replica_capacity_rps: float | None = Field(
        None, gt=0, description="requests/s one replica serves, as in the loop's policy: sizes the arrival-rate history"
    )


class DeploymentFloors(_Strict):
    deployment: DeploymentName
    time_zone: str | None = None
    floors: list[FloorEntry] = Field(default_factory=list)
    prewarm: PrewarmSpec | None = None


    @field_validator("time_zone")
    @classmethod
    def _tz(cls, value: str | None) -> str | None:
        return check_time_zone(value) if value is not None else None

    @model_validator(mode="after")
    def _unique(self) -> DeploymentFloors:
        keys = [f.key for f in self.floors]
        dup = {k for k in keys if keys.count(k) > 1}
        if dup:
            raise ValueError(f"two floors of {self.deployment} share the name {sorted(dup)[0]!r}: give one a 'name'")
        return self


class ScheduleFile(_Strict):
    time_zone: str = "UTC"
    # Every floor and pre-warm schedule tideplane keeps: `tideplane schedules apply` removes the ones
    # not declared, so an entry without floors or prewarm, or `schedules: []`, removes schedules.
    schedules: list[DeploymentFloors]

    @field_validator("time_zone")
    @classmethod
    def _tz(cls, value: str) -> str:
        return check_time_zone(value)

    def zone_of(self, item: DeploymentFloors) -> str:
        return item.time_zone or self.time_zone


def floor_at(floors: list[FloorEntry], when: datetime, time_zone: str) -> FloorEntry | None:
    """The entry in force at ``when`` (aware): the latest one at or before it in local time."""
    local = when.astimezone(ZoneInfo(time_zone))
    now = local.weekday() * 1440 + local.hour * 60 + local.minute
    best: tuple[int, FloorEntry] | None = None
    for entry in floors:
        for day in entry.weekdays:
            back = (now - (day * 1440 + entry.hour * 60 + entry.minute)) % _WEEK_MINUTES
            if best is None or back < best[0]:
                best = (back, entry)
    return best[1] if best else None


class SetFloor(BaseModel):
    """The ``set_floor`` signal: the floor ``source`` claims, until ``ttl_seconds`` pass (None: until replaced)."""

    replicas: Replicas
    source: str = Field("manual", min_length=1, max_length=63, description="schedule | prewarm | manual: one floor per source")
    ttl_seconds: Seconds | None = Field(None, description="the floor lapses after this long (at most 30 days)")
    reason: str = Field("", max_length=200, description="why, shown in the scaling decisions it raises")


class FloorClaim(BaseModel):
    """A floor as the loop holds it (carried across continue-as-new)."""

    replicas: int = Field(ge=0)
    expires_at: datetime | None = None
    reason: str = ""  # the set_floor signal's, shown with its source in the decisions


def floor_label(source: str, claim: FloorClaim) -> str:
    """Who holds a floor, as the scaling decisions name it: ``schedule``, ``prewarm``, ``manual (reason)``."""
    return f"{source} ({claim.reason})" if claim.reason else source


class ScheduleFloorInput(BaseModel):
    """What a Temporal Schedule's action passes: the floor a profile sets at its time."""

    deployment: DeploymentName
    replicas: Replicas
    source: str = "schedule"
    ttl_seconds: Seconds | None = None


@workflow.defn(name="ScheduleFloor")
class ScheduleFloor:
    """Sets the floor of a deployment's loop (started by `tideplane schedules apply` schedules)."""

    @workflow.run
    async def run(self, input: ScheduleFloorInput) -> str:
        loop = workflow.get_external_workflow_handle(scaling_workflow_id(input.deployment))
        await loop.signal(SET_FLOOR_SIGNAL, SetFloor(replicas=input.replicas, source=input.source, ttl_seconds=input.ttl_seconds))
        return f"floor of {input.deployment} from {input.source}: {input.replicas}"
