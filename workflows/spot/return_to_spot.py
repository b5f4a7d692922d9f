"""``ReturnToSpot`` (id ``return-to-spot/<namespace>/<name>``): give the on-demand replacements back.

Once the spot Deployment is back at its desired Ready count and has stayed there for the
stabilisation delay (doubling with each flap): ``workflows.spot.policy.on_demand_target``, the
benchmark's rule too), removes the on-demand fallback replicas and gives the on-demand pool its nodes back. One per Deployment serves every
reclaim that claimed replacements for it; continues as new to keep its history bounded.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.spot.contract import (
        CALL_TIMEOUT,
        QUICK_RETRY,
        CountsInput,
        PoolInput,
        ReleaseFallbackInput,
        ReturnToSpotInput,
        SpotActivities,
    )
    from workflows.spot.policy import on_demand_needed, on_demand_target, stabilisation_delay


class ReturnToSpotStatus(BaseModel):
    """What ``status`` answers: where the Deployment stands and how long spot must stay healthy."""

    phase: str = Field("starting", description="waiting for spot | stabilising | released | nothing to release")
    spot_ready: int = 0
    spot_desired: int = 0
    on_demand_ready: int = 0
    on_demand_desired: int = 0
    healthy_since: datetime | None = None
    stabilisation_seconds: float = 0.0
    flaps: int = 0
    released_replicas: int = 0


class ReturnToSpotResult(BaseModel):
    released_replicas: int
    flaps: int
    stabilisation_seconds: float


@workflow.defn(name="ReturnToSpot")
class ReturnToSpot:
    """Remove a Deployment's on-demand replacements once its spot replicas are back and stable."""

    def __init__(self) -> None:
        self._status = ReturnToSpotStatus()

    @workflow.query(name="status")
    def status(self) -> ReturnToSpotStatus:
        return self._status

    @workflow.run
    async def run(self, input: ReturnToSpotInput) -> ReturnToSpotResult:
        policy = input.policy
        healthy_since, flaps = input.healthy_since, input.flaps
        while True:
            counts = await workflow.execute_activity_method(
                SpotActivities.spot_replica_counts, CountsInput(deployments=[input.deployment]),
                start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
            )
            c = counts.counts[0]
            now = workflow.now()
            delay = stabilisation_delay(policy.stabilisation_seconds, flaps, policy.max_stabilisation_seconds)
            self._status = ReturnToSpotStatus(
                phase="stabilising" if c.ready >= c.desired else "waiting for spot",
                spot_ready=c.ready, spot_desired=c.desired, on_demand_ready=c.fallback_ready,
                on_demand_desired=c.fallback_desired, healthy_since=healthy_since, stabilisation_seconds=delay, flaps=flaps,
            )
            if c.fallback_desired == 0:
                self._status.phase = "nothing to release"
                return ReturnToSpotResult(released_replicas=0, flaps=flaps, stabilisation_seconds=delay)
            healthy = c.ready >= c.desired
            if healthy and healthy_since is None:
                healthy_since = now
            elif not healthy and healthy_since is not None:
                flaps += 1
                healthy_since = None
            self._status.healthy_since, self._status.flaps = healthy_since, flaps
            since = healthy_since.timestamp() if healthy_since else None
            keep = on_demand_target(
                c.fallback_desired, on_demand_needed(c.desired, c.ready), since, now.timestamp(),
                policy.stabilisation_seconds, flaps, policy.max_stabilisation_seconds,
            )
            if keep < c.fallback_desired:
                released = await workflow.execute_activity_method(
                    SpotActivities.release_spot_fallback, ReleaseFallbackInput(deployment=input.deployment),
                    start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
                    summary=f"{input.deployment.name}: on-demand replacements down",
                )
                if policy.on_demand_pool_asg:
                    await workflow.execute_activity_method(
                        SpotActivities.sync_on_demand_pool, PoolInput(asg=policy.on_demand_pool_asg),
                        start_to_close_timeout=CALL_TIMEOUT, retry_policy=QUICK_RETRY,
                    )
                self._status.phase, self._status.released_replicas = "released", released.replicas
                workflow.set_current_details(f"back on spot: released {released.replicas} on-demand replicas")
                return ReturnToSpotResult(released_replicas=released.replicas, flaps=flaps, stabilisation_seconds=delay)
            state = f"healthy for {(now - healthy_since).total_seconds():.0f}/{delay:.0f} s" if healthy_since else "waiting for spot capacity"
            workflow.set_current_details(
                f"**{input.deployment.namespace}/{input.deployment.name}**: spot Ready {c.ready}/{c.desired},"
                f" on-demand {c.fallback_ready}/{c.fallback_desired} · {state} · flaps {flaps}"
            )
            if workflow.info().is_continue_as_new_suggested():
                workflow.continue_as_new(input.model_copy(update={"healthy_since": healthy_since, "flaps": flaps}))
            await workflow.sleep(policy.poll_seconds)
