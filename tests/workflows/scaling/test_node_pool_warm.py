"""NodePoolScaling's warm pool on Temporal's time-skipping server, with stub activities under the
real names: the warm pool holds the nodes the demand forecast's peak needs, is set once per change
(not every cycle) within its bounds and the group's MaxSize, and a failed call (or forecast) is
reported and tried again."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from workflows.scaling import contract as acts
from workflows.scaling.decide import ScalingPolicy, slo_replicas
from workflows.scaling.forecast import WEEK_S, DemandForecast
from workflows.scaling.node_pools import ForecastedDeployment, NodePoolInput, NodePoolScaling, NodePoolStatus, WarmPoolSettings
from workflows.scaling.placement import Node, PoolSizing
from workflows.scaling.warm_pool import NodeCosts, break_even_seconds


class FakeGroup:
    """An Auto Scaling group with no pending pods; set_warm_pool fails the first ``failures`` calls."""

    def __init__(self, max_size: int = 3, failures: int = 0, forecast_rps: float | None = None) -> None:
        self.max_size = max_size
        self.failures = failures
        self.forecast_rps = forecast_rps  # None: Prometheus is down
        self.warm_calls: list[acts.SetWarmPoolInput] = []
        self.forecasts: list[acts.DemandForecastInput] = []

    def activities(self):
        @activity.defn(name=acts.OBSERVE_NODE_POOL)
        async def observe(req: acts.PoolRef) -> acts.PoolObservation:
            return acts.PoolObservation(desired_capacity=0, max_size=self.max_size)

        @activity.defn(name=acts.SET_POOL_CAPACITY)
        async def set_capacity(req: acts.SetCapacityInput) -> None:
            raise AssertionError("nothing is pending: the pool is not resized")

        @activity.defn(name=acts.REMOVE_POOL_NODE)
        async def remove(req: acts.RemoveNodeInput) -> acts.RemoveNodeResult:
            raise AssertionError("no node to remove")

        @activity.defn(name=acts.SET_WARM_POOL)
        async def set_warm_pool(req: acts.SetWarmPoolInput) -> acts.WarmPoolState:
            self.warm_calls.append(req)
            if len(self.warm_calls) <= self.failures:
                raise ApplicationError("throttled", non_retryable=True)
            return acts.WarmPoolState(size=req.size, changed=True)

        @activity.defn(name=acts.FORECAST_DEMAND)
        async def forecast(req: acts.DemandForecastInput) -> DemandForecast:
            self.forecasts.append(req)
            if self.forecast_rps is None:
                raise ApplicationError("prometheus unreachable", non_retryable=True)
            rps = self.forecast_rps
            return DemandForecast(expected=rps, upper=rps, level=rps / 2, basis="daily", error_ratio=1, checked=0, reason="stub")

        return [observe, set_capacity, remove, set_warm_pool, forecast]


async def run_pool(env, group: FakeGroup, warm_pool: WarmPoolSettings, iterations: int = 4) -> NodePoolStatus:
    queue = f"q-{uuid.uuid4()}"
    async with Worker(env.client, task_queue=queue, workflows=[NodePoolScaling], activities=group.activities(),
                      activity_executor=ThreadPoolExecutor(2)):
        handle = await env.client.start_workflow(
            NodePoolScaling.run,
            NodePoolInput(pool=acts.PoolRef(pool="gpu-on-demand"), sizing=PoolSizing(min_nodes=0, warm_standby=0, gpus_per_node=4),
                          interval_seconds=15, iterations_per_run=iterations, warm_pool=warm_pool),
            id=f"nodepool/{uuid.uuid4().hex[:6]}", task_queue=queue,
        )
        while len((await handle.query(NodePoolScaling.status)).records) < iterations:
            await env.sleep(15)
        status = await handle.query(NodePoolScaling.status)
        await handle.terminate()
    return status


async def test_warm_pool_is_set_once_within_the_groups_max_size(time_skipping_env):
    group = FakeGroup(max_size=3)
    status = await run_pool(time_skipping_env, group, WarmPoolSettings(min_size=5, max_size=8))
    assert [c.size for c in group.warm_calls] == [3], "clamped to the group's MaxSize, set once"
    assert group.warm_calls[0].reuse_on_scale_in is True
    assert status.warm_pool_size == 3 and all(r.warm_pool == 3 for r in status.records)
    assert "warm pool 3" in status.records[0].reason


async def test_a_failed_warm_pool_call_is_reported_and_tried_again(time_skipping_env):
    group = FakeGroup(failures=1)
    status = await run_pool(time_skipping_env, group, WarmPoolSettings(min_size=2))
    assert [c.size for c in group.warm_calls] == [2, 2]
    assert "cannot size the warm pool: throttled" in status.records[0].reason
    assert status.records[0].warm_pool is None and status.warm_pool_size == 2


def test_a_warm_pool_on_a_spot_pool_or_of_a_malformed_deployment_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="warm_pool: EC2 Auto Scaling has no warm pools for Spot"):
        NodePoolInput(pool=acts.PoolRef(pool="gpu-spot", capacity_type="spot"), warm_pool=WarmPoolSettings(min_size=1))
    with pytest.raises(ValidationError, match="deployment must be NAMESPACE/NAME"):
        ForecastedDeployment(deployment="chat")


async def test_the_warm_pool_holds_the_nodes_the_forecast_peak_needs(time_skipping_env):
    """Two replicas of 2 GPUs fit a 4-GPU node: the forecast's peak in replicas, in whole nodes,
    forecast once per forecast_every_seconds for the pool's horizon."""
    policy = ScalingPolicy(gpus_per_replica=2)
    rps = 30.0
    replicas = slo_replicas(rps, policy)
    assert replicas >= 3  # so the peak needs more than one node
    group = FakeGroup(max_size=10, forecast_rps=rps)
    settings = WarmPoolSettings(max_size=8, horizon_seconds=480, forecast_every_seconds=300,
                                demand=[ForecastedDeployment(deployment="llm-serving/chat", policy=policy)])
    status = await run_pool(time_skipping_env, group, settings)
    assert [c.size for c in group.warm_calls] == [-(-replicas // 2)], "nodes for the peak, none running"
    assert len(group.forecasts) == 1 and group.forecasts[0].horizon_seconds == 480
    assert (group.forecasts[0].namespace, group.forecasts[0].deployment) == ("llm-serving", "chat")
    assert "forecast peak" in status.records[0].reason


async def test_without_a_forecast_the_pool_keeps_its_floor_and_says_why(time_skipping_env):
    group = FakeGroup(forecast_rps=None)
    settings = WarmPoolSettings(min_size=1, demand=[ForecastedDeployment(deployment="llm-serving/chat")])
    status = await run_pool(time_skipping_env, group, settings, iterations=2)
    assert [c.size for c in group.warm_calls] == [1]
    assert "demand forecast failed: prometheus unreachable" in status.records[0].reason


class ShrinkingGroup:
    """A group of idle nodes that NodePoolScaling drains one per cycle, with Auto Scaling's
    ReuseOnScaleIn: a scaled-in instance goes back to the warm pool while the pool is below the
    size last set, and is terminated otherwise. The demand forecast sees a peak ``peak_in_seconds``
    ahead: within a longer horizon, not within a shorter one."""

    def __init__(self, nodes: int, peak_rps: float, peak_in_seconds: float) -> None:
        self.nodes = [f"n{i}" for i in range(nodes)]
        self.peak_rps = peak_rps
        self.peak_in_seconds = peak_in_seconds
        self.warm_size = 0
        self.kept: list[str] = []
        self.terminated: list[str] = []
        self.horizons: list[float] = []

    def activities(self):
        @activity.defn(name=acts.OBSERVE_NODE_POOL)
        async def observe(req: acts.PoolRef) -> acts.PoolObservation:
            return acts.PoolObservation(nodes=[Node(name=n, pool=req.pool) for n in self.nodes],
                                        desired_capacity=len(self.nodes), max_size=10)

        @activity.defn(name=acts.SET_POOL_CAPACITY)
        async def set_capacity(req: acts.SetCapacityInput) -> None:
            raise AssertionError("the pool only drains")

        @activity.defn(name=acts.REMOVE_POOL_NODE)
        async def remove(req: acts.RemoveNodeInput) -> acts.RemoveNodeResult:
            self.nodes.remove(req.node)
            (self.kept if len(self.kept) < self.warm_size else self.terminated).append(req.node)
            return acts.RemoveNodeResult(removed=True, reason=f"node {req.node} drained")

        @activity.defn(name=acts.SET_WARM_POOL)
        async def set_warm_pool(req: acts.SetWarmPoolInput) -> acts.WarmPoolState:
            self.warm_size = req.size
            self.kept = self.kept[: req.size]
            return acts.WarmPoolState(size=req.size, changed=True)

        @activity.defn(name=acts.FORECAST_DEMAND)
        async def forecast(req: acts.DemandForecastInput) -> DemandForecast:
            self.horizons.append(req.horizon_seconds)
            rps = self.peak_rps if req.horizon_seconds >= self.peak_in_seconds else 0.0
            return DemandForecast(expected=rps, upper=rps, level=rps, basis="daily", error_ratio=1, checked=0, reason="stub")

        return [observe, set_capacity, remove, set_warm_pool, forecast]


@pytest.mark.parametrize("stopped_per_hour, kept", [(0.1, ["n1", "n2"]), (10.0, [])])
async def test_scale_in_keeps_freed_nodes_warm_only_for_a_peak_within_break_even(time_skipping_env, stopped_per_hour, kept):
    """Three idle nodes drain one per cycle; tomorrow morning's peak (5 h ahead) needs two nodes of
    one replica each. Cheap disks (break-even 53 h): the first freed node still leaves two running and
    is terminated, the next two go back to the warm pool. Dear disks (break-even 32 min): the peak is
    beyond it, so all three are terminated."""
    policy = ScalingPolicy(gpus_per_replica=4)
    rps = next(r for r in range(1, 1000) if slo_replicas(r, policy) == 2)
    group = ShrinkingGroup(nodes=3, peak_rps=rps, peak_in_seconds=5 * 3600)
    costs = NodeCosts(running_per_hour=80.0, stopped_per_hour=stopped_per_hour, fresh_start_seconds=300, warm_start_seconds=60)
    settings = WarmPoolSettings(max_size=4, demand=[ForecastedDeployment(deployment="llm-serving/chat", policy=policy)],
                                node_costs=costs)
    status = await run_pool(time_skipping_env, group, settings)
    assert group.horizons == [600, min(WEEK_S, break_even_seconds(costs))], "the cold start, then the break-even time"
    assert group.kept == kept and group.terminated == [n for n in ("n0", "n1", "n2") if n not in kept]
    assert status.warm_pool_size == len(kept)
    assert "scale-in: forecast peak within break-even" in status.records[0].reason
    assert "0 of 1 freed node(s) back to the warm pool" in status.records[0].reason
    if kept:
        assert "1 of 1 freed node(s) back to the warm pool" in status.records[1].reason
        assert status.records[-1].warm_pool == 2, "the kept nodes stay while the peak within break-even needs them"
