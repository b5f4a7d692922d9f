"""The spot mix a batch scaling loop runs: its replica target split by ``plan_mix`` over failure domains.

``ReactiveScaling`` owns the total (``decide``); with ``ScalingPolicy.spot_mix`` its apply step
places that total as the benchmark does (``benchmarks/spot.py``'s ``policy_mix``): every
interval it reads each domain's spot pool (available, room), appends to a bounded per-domain
history of availability, rates each domain with ``preemption_rate`` over the last
``window_samples`` samples and plans with ``plan_mix``. The plan is written as one spot
Deployment per domain (pods pinned to the domain's node pool) plus the on-demand base as a claim
on the version's on-demand fallback Deployment (the one SpotReclaim claims on), by the
``apply_spot_mix`` activity. Pure: plain values in and out, no I/O.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from workflows.core import naming
from workflows.spot.policy import MixPlan, ZoneMarket, failure_domain, plan_mix, preemption_rate

# The claimant under which the mix's on-demand base sits on the fallback Deployment
# (SpotReclaim's claimants are instance IDs; ReturnToSpot leaves this one alone).
MIX_CLAIMANT = naming.SPOT_MIX_CLAIMANT
# On the versioned Deployment under a mix: the loop's total (its own replicas are 0), read back as
# its replicas by every reader (activities/core/deployments.py's version_replicas).
MIX_TARGET_ANNOTATION = naming.ANNOTATION_SPOT_MIX_TARGET


class SpotDomain(BaseModel):
    """One failure domain the mix may place spot replicas in: a spot node pool of one instance type in one zone."""

    pool: str = Field(description="the spot node pool (its Auto Scaling group and karpenter.sh/nodepool label)")
    zone: str
    instance_type: str
    spot_price: float = Field(gt=0, description="per replica-hour")
    region: str | None = Field(None, description="domains that fail together (None: its own)")
    replicas_per_node: int = Field(1, ge=1)

    @property
    def key(self) -> str:
        return failure_domain(self.instance_type, self.zone)


class SpotMixPolicy(BaseModel):
    """How a batch deployment's replicas are split between spot domains and an on-demand base."""

    domains: list[SpotDomain] = Field(min_length=1)
    on_demand_price: float = Field(gt=0, description="per replica-hour")
    availability: float = Field(0.98, ge=0, le=1, description="P(Ready >= target) the plan must reach under the model")
    max_overprovision: int | None = Field(8, ge=0, description="spot replicas beyond the target at most (None: the target)")
    window_samples: int = Field(720, ge=1, description="samples of the preemption-rate history (720 x 30 s = 6 h)")
    survive_region_loss: bool = True
    on_demand_pool: str | None = Field(
        None, description="the on-demand node pool whose NodePoolScaling warm pool holds warm_pool_needed (None: only recorded)"
    )


class DomainNow(BaseModel):
    """A domain's spot pool as read now: obtainable, and how many more replicas it holds."""

    pool: str
    available: bool
    capacity: int | None = Field(None, description="replicas the pool holds at most (None: no limit known)")


def observe(history: dict[str, list[int]], now: list[DomainNow], window: int) -> dict[str, list[int]]:
    """Append this sample (1 = preempted/unavailable) to each pool's history, keeping the last ``window``."""
    out = {pool: list(samples) for pool, samples in history.items()}
    for d in now:
        out[d.pool] = [*out.get(d.pool, []), 0 if d.available else 1][-window:]
    return out


def markets(policy: SpotMixPolicy, now: list[DomainNow], history: dict[str, list[int]]) -> list[ZoneMarket]:
    """What ``plan_mix`` knows of each domain: its recent preemption rate, price, availability and room."""
    seen = {d.pool: d for d in now}
    out = []
    for dom in policy.domains:
        d = seen.get(dom.pool, DomainNow(pool=dom.pool, available=False))
        out.append(ZoneMarket(
            dom.key, preemption_rate(history.get(dom.pool, []), policy.window_samples), dom.spot_price,
            d.available, d.capacity, dom.region,
        ))
    return out


def plan_spot_mix(total: int, policy: SpotMixPolicy, now: list[DomainNow], history: dict[str, list[int]]) -> MixPlan:
    """``plan_mix`` for the loop's target over the policy's domains, as the benchmark calls it."""
    return plan_mix(
        total, policy.availability, markets(policy, now, history), policy.on_demand_price,
        max_overprovision=policy.max_overprovision, survive_group_loss=policy.survive_region_loss,
    )


def replicas_per_pool(plan: MixPlan, policy: SpotMixPolicy) -> dict[str, int]:
    """The plan's spot replicas by node pool, every domain named (0 scales a domain's Deployment down)."""
    return {d.pool: plan.spot_per_zone.get(d.key, 0) for d in policy.domains}
