"""ReactiveScaling with a spot mix, on the time-skipping server with stub activities under the real names.

The loop owns the total and places it as ``plan_mix`` says; the stubs play the spot pools (the
test withdraws one's capacity) and record every split written.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.worker import Worker

from tests.workflows.scaling.test_node_pool_warm import FakeGroup
from tests.workflows.scaling.test_scaling import FakeDeployment, start_loop, status
from workflows.core import naming
from workflows.scaling import contract as acts
from workflows.scaling.decide import ScalingPolicy
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.loop_state import ScalingInput
from workflows.scaling.node_pools import NodePoolInput, NodePoolScaling, WarmPoolSettings
from workflows.scaling.placement import PoolSizing
from workflows.scaling.warm_pool import WARM_POOL_FLOOR_SIGNAL, nodes_for
from workflows.spot.contract import AppliedSpotMix, ApplySpotMixInput, SpotDomainsInput, SpotDomainsNow
from workflows.spot.mix import DomainNow, SpotDomain, SpotMixPolicy, observe, plan_spot_mix, replicas_per_pool
from workflows.spot.policy import ZoneMarket, plan_mix

MIX = SpotMixPolicy(
    domains=[
        SpotDomain(pool="spot-a", zone="us-central1-a", instance_type="a3-highgpu-8g", spot_price=30.0),
        SpotDomain(pool="spot-b", zone="us-central1-b", instance_type="a3-highgpu-8g", spot_price=32.0),
        SpotDomain(pool="spot-c", zone="us-central1-c", instance_type="a3-highgpu-8g", spot_price=35.0),
    ],
    on_demand_price=88.0,
    availability=0.98,
    max_overprovision=8,
    window_samples=10,
)


class FakeSpotPools(FakeDeployment):
    """The deployment plus its spot pools: room per pool, and whether each may grow now."""

    def __init__(self) -> None:
        super().__init__(replicas=0)
        self.pools = {"spot-a": DomainNow(pool="spot-a", available=True, capacity=6),
                      "spot-b": DomainNow(pool="spot-b", available=True, capacity=6),
                      "spot-c": DomainNow(pool="spot-c", available=True, capacity=6)}
        self.applied: list[ApplySpotMixInput] = []
        self.version = "1.0.0"
        self.own_left: list[int] = []  # what each write leaves on the versioned Deployment (its pools not Ready yet)

    def activities(self):
        @activity.defn(name=acts.GET_SCALE)
        async def get_scale(target: acts.ScaleTarget) -> acts.ScaleStatus:
            return acts.ScaleStatus(version=self.version, replicas=self.replicas, ready_replicas=self.replicas)

        @activity.defn(name="read_spot_domains")
        async def read_spot_domains(req: SpotDomainsInput) -> SpotDomainsNow:
            return SpotDomainsNow(domains=[self.pools[d.pool] for d in req.domains])

        @activity.defn(name="apply_spot_mix")
        async def apply_spot_mix(req: ApplySpotMixInput) -> AppliedSpotMix:
            self.applied.append(req)
            self.replicas = req.total
            return AppliedSpotMix(deployments=req.spot, own=self.own_left.pop(0) if self.own_left else 0)

        stubs = [a for a in super().activities() if a.__name__ != "get_scale"]
        return [*stubs, get_scale, read_spot_domains, apply_spot_mix]


@asynccontextmanager
async def mix_claiming_on_a_pool(env, interval_seconds: float, pool_iterations: int):
    """A batch loop (2-GPU replicas) whose mix names gpu-on-demand, and that pool's NodePoolScaling
    (4-GPU nodes, a warm pool of at most 8), both running: (spot pools, group, input, loop, pool)."""
    fake = FakeSpotPools()
    group = FakeGroup(max_size=10)
    mix = MIX.model_copy(update={"survive_region_loss": False, "max_overprovision": 0, "on_demand_pool": "gpu-on-demand"})
    policy = ScalingPolicy(priority_class="batch", min_replicas=8, max_replicas=8, gpus_per_replica=2, spot_mix=mix)
    inp = ScalingInput(deployment=f"llm-serving/d{uuid.uuid4().hex[:8]}", policy=policy, interval_seconds=interval_seconds)
    queue = f"q-{uuid.uuid4()}"
    pool_activities = [a for a in group.activities() if a.__name__ != "forecast"]
    async with Worker(env.client, task_queue=queue, workflows=[ReactiveScaling, NodePoolScaling],
                      activities=[*fake.activities(), *pool_activities], activity_executor=ThreadPoolExecutor(4)):
        pool = await env.client.start_workflow(
            NodePoolScaling.run,
            NodePoolInput(pool=acts.PoolRef(pool="gpu-on-demand"), sizing=PoolSizing(min_nodes=0, warm_standby=0, gpus_per_node=4),
                          interval_seconds=15, iterations_per_run=pool_iterations, warm_pool=WarmPoolSettings(max_size=8)),
            id=naming.node_pool_workflow_id("gpu-on-demand"), task_queue=queue,
        )
        loop = await env.client.start_workflow(ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue)
        yield fake, group, inp, loop, pool


async def test_the_loop_places_its_total_as_plan_mix_says_and_leaves_a_lost_pool(time_skipping_env):
    env = time_skipping_env
    fake = FakeSpotPools()
    policy = ScalingPolicy(priority_class="batch", min_replicas=8, max_replicas=8, spot_mix=MIX)
    worker, queue, inp = await start_loop(env, fake, policy=policy, interval_seconds=30)
    async with worker:
        handle = await env.client.start_workflow(ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue)
        await env.sleep(95)  # four decisions, the split unchanged: written once
        assert len(fake.applied) == 1 and fake.scale_calls == []
        first = fake.applied[0]
        now = list(fake.pools.values())
        expected = plan_spot_mix(8, MIX, now, observe({}, now, MIX.window_samples))
        assert (first.total, first.spot, first.on_demand) == (8, replicas_per_pool(expected, MIX), expected.on_demand)
        # the same call as the benchmark's: plan_mix over ZoneMarkets of the domains' rates
        direct = plan_mix(8, 0.98, [ZoneMarket(d.key, 0.0, d.spot_price, True, 6, None) for d in MIX.domains], 88.0,
                          max_overprovision=8, survive_group_loss=True)
        assert direct.spot_per_zone == expected.spot_per_zone and direct.on_demand == expected.on_demand
        assert sum(first.spot.values()) + first.on_demand >= 8 and first.spot["spot-a"] > 0

        fake.pools["spot-a"] = DomainNow(pool="spot-a", available=False, capacity=0)  # the zone's capacity is withdrawn
        await env.sleep(30)
        moved = fake.applied[-1]
        assert moved.spot["spot-a"] == 0 and sum(moved.spot.values()) + moved.on_demand >= 8, moved
        s = await status(handle)
        assert s.decisions[-1].spot_mix.unavailable == ["spot-a"] and s.decisions[-1].applied
        # one region's pools (no region given: each its own group): the warm pool covers the pool holding the most
        assert s.decisions[-1].spot_mix.warm_pool == max(0, max(moved.spot.values()) - (sum(moved.spot.values()) + moved.on_demand - 8))

        fake.version = "1.1.0"  # a rollout promoted a new version: the same split is written for it
        await env.sleep(30)
        assert (fake.applied[-1].version, fake.applied[-1].spot) == ("1.1.0", moved.spot)
        await handle.terminate()


async def test_a_split_is_written_again_until_the_versions_own_replicas_are_handed_over(time_skipping_env):
    """Issue 32: a version placed into a mix (one just promoted) keeps its own replicas until its
    pools hold them Ready; the loop writes the unchanged split again each decision until the
    versioned Deployment is down to 0, then no more."""
    env = time_skipping_env
    fake = FakeSpotPools()
    fake.own_left = [8, 3]  # nothing Ready in the pools at first, then 5 of 8, then all
    policy = ScalingPolicy(priority_class="batch", min_replicas=8, max_replicas=8, spot_mix=MIX)
    worker, queue, inp = await start_loop(env, fake, policy=policy, interval_seconds=30)
    async with worker:
        handle = await env.client.start_workflow(ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue)
        await env.sleep(155)  # six decisions
        assert len(fake.applied) == 3 and len({(a.version, tuple(a.spot.items()), a.on_demand) for a in fake.applied}) == 1
        s = await status(handle)
        assert "8 replica(s) stay on 1.0.0's own Deployment" in s.decisions[0].reason
        await handle.terminate()


async def test_the_mixs_warm_pool_need_floors_its_on_demand_pools_warm_pool_and_lapses_with_it(time_skipping_env):
    """The loop claims warm_pool_needed on the NodePoolScaling of the pool its mix names; that loop,
    the one writer of the group's warm pool, holds at least those nodes and says why; when the need
    drops to 0 (every spot pool withdrawn: all on-demand) the floor lapses to the forecast's size."""
    env = time_skipping_env
    # the pool continues as new every 3 cycles: the claim outlives it
    async with mix_claiming_on_a_pool(env, interval_seconds=30, pool_iterations=3) as (fake, group, inp, loop, pool):
        await env.sleep(65)
        need = (await status(loop)).decisions[-1].spot_mix.warm_pool
        assert need > 0
        floored = nodes_for(need, 4 // 2)  # two 2-GPU replicas per 4-GPU node
        assert [c.size for c in group.warm_calls] == [0, floored], "the forecast's 0 (nothing forecast), then the floor"
        s = await pool.query(NodePoolScaling.status)
        assert s.warm_pool_size == floored and [(f.source, f.replicas) for f in s.warm_pool_floors] == [(inp.deployment, need)]
        assert any(f"warm pool {floored} (spot mix floor for {inp.deployment}" in r.reason for r in s.records)
        meta = await pool.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert f"warm pool {floored} = spot mix floor for {inp.deployment}" in meta.current_details
        assert "claimed on nodepool/gpu-on-demand" in (await loop.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)).current_details

        for name in fake.pools:  # every spot pool withdrawn: the mix goes all on-demand and needs no warm instance
            fake.pools[name] = DomainNow(pool=name, available=False, capacity=0)
        await env.sleep(60)
        assert (await status(loop)).decisions[-1].spot_mix.warm_pool == 0
        assert group.warm_calls[-1].size == 0 and (await pool.query(NodePoolScaling.status)).warm_pool_floors == []
        await loop.terminate()
        await pool.terminate()


async def test_a_claim_is_renewed_while_its_loop_runs_or_is_paused_and_lapses_after_its_ttl_once_terminated(time_skipping_env):
    """A terminated loop cannot drop its claim: the claim carries a TTL (the loop's 6 s interval x 10,
    at least 60 s) and the loop renews it every quarter of that, paused or not; not renewed, the
    pool drops it and sizes down. A claim of before (no TTL) still holds until dropped."""
    env = time_skipping_env
    async with mix_claiming_on_a_pool(env, interval_seconds=6, pool_iterations=4) as (_, group, inp, loop, pool):
        await pool.signal(WARM_POOL_FLOOR_SIGNAL, {"source": "llm-serving/old-claimant", "replicas": 1, "gpus_per_replica": 4})

        async def claims() -> dict[str, tuple[int, float | None]]:
            return {f.source: (f.replicas, f.ttl_seconds) for f in (await pool.query(NodePoolScaling.status)).warm_pool_floors}

        await env.sleep(20)
        need = (await status(loop)).decisions[-1].spot_mix.warm_pool
        both = {"llm-serving/old-claimant": (1, None), inp.deployment: (need, 60)}
        assert need > 0 and await claims() == both
        await env.sleep(90)  # 1.5 TTLs: renewed by the running loop
        assert await claims() == both
        await loop.signal(ReactiveScaling.pause)
        await env.sleep(90)  # 1.5 TTLs more: renewed while paused (its spot replicas still run)
        assert await claims() == both
        held = group.warm_calls[-1].size
        assert held == nodes_for(need, 4 // 2) + 1

        await loop.terminate()  # renewed at most 18 s ago: its claim lapses 42-60 s from now, dropped by the next cycle
        await env.sleep(30)
        assert inp.deployment in await claims()
        await env.sleep(60)  # past its deadline, and a pool cycle (15 s) more
        assert await claims() == {"llm-serving/old-claimant": (1, None)}, "the old claim has no TTL: held until dropped"
        assert group.warm_calls[-1].size == 1 < held
        s = await pool.query(NodePoolScaling.status)
        assert any(f"warm pool claim(s) of {inp.deployment} lapsed: not renewed in time" in r.reason for r in s.records)
        await pool.terminate()


async def test_a_claim_on_a_pool_with_no_node_pool_loop_is_reported_in_the_decision(time_skipping_env):
    env = time_skipping_env
    fake = FakeSpotPools()
    mix = MIX.model_copy(update={"survive_region_loss": False, "max_overprovision": 0, "on_demand_pool": "gpu-missing"})
    policy = ScalingPolicy(priority_class="batch", min_replicas=8, max_replicas=8, spot_mix=mix)
    worker, queue, inp = await start_loop(env, fake, policy=policy, interval_seconds=30)
    async with worker:
        handle = await env.client.start_workflow(ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue)
        await env.sleep(35)
        decisions = (await status(handle)).decisions
        assert all(f"warm pool floor {d.spot_mix.warm_pool} not claimed on gpu-missing" in d.reason for d in decisions), decisions[-1].reason
        assert len(decisions) == 2 and fake.applied, "the split is written all the same"
        await handle.terminate()
