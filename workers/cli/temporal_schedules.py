"""How a ``tideplane`` command applies a Temporal Schedule: created, updated in place (its state kept:
a pause stays) or left alone when what it declares is unchanged (a fingerprint in its action's
memo); the floor and pre-warm schedules (scaling.py) and the token quotas' (quotas.py) are applied so."""

from __future__ import annotations

import dataclasses
import hashlib

from temporalio.client import Client, Schedule, ScheduleAlreadyRunningError, ScheduleUpdate, ScheduleUpdateInput
from temporalio.service import RPCError, RPCStatusCode


# Memo key of a schedule's action: the fingerprint of what the file declared for it.
SPEC_MEMO = "tideplane_spec"


def fingerprinted(schedule: Schedule) -> Schedule:
    """``schedule`` with the digest of its declaration in its action's memo, for "unchanged"."""
    digest = hashlib.sha256(repr(schedule).encode()).hexdigest()[:16]
    schedule.action.memo = {SPEC_MEMO: digest}
    return schedule


async def schedule_fingerprint(client: Client, description) -> str | None:
    """The fingerprint an earlier apply stored on a described schedule (None: made another way)."""
    payload = (getattr(description.schedule.action, "memo", None) or {}).get(SPEC_MEMO)
    if payload is None:
        return None
    (value,) = await client.data_converter.decode([payload], [str])
    return value


async def delete_schedule(client: Client, sid: str) -> bool:
    """Delete one schedule; False when it was already gone (the list lags behind deletes)."""
    try:
        await client.get_schedule_handle(sid).delete()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def apply_schedule(client: Client, sid: str, schedule: Schedule) -> str:
    """Create, update in place (keeping its state: a pause stays) or leave one ``fingerprinted`` schedule:
    created | updated | unchanged."""
    try:
        await client.create_schedule(sid, schedule)
        return "created"
    except ScheduleAlreadyRunningError:
        pass
    handle = client.get_schedule_handle(sid)
    if await schedule_fingerprint(client, await handle.describe()) == schedule.action.memo[SPEC_MEMO]:
        return "unchanged"

    def keep_state(current: ScheduleUpdateInput) -> ScheduleUpdate:
        return ScheduleUpdate(schedule=dataclasses.replace(schedule, state=current.description.schedule.state))

    await handle.update(keep_state)
    return "updated"
