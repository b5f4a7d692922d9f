"""NodePoolScaling's warm pool on Temporal's time-skipping server, with stub activities under the
real names: the pool's group is sized once per change (not every cycle), within its bounds and the
group's MaxSize, and a failed call is reported and tried again next cycle."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from workflows.scaling import activities as acts
from workflows.scaling.node_pools import NodePoolInput, NodePoolScaling, NodePoolStatus, WarmPoolSettings
from workflows.scaling.placement import PoolSizing


class FakeGroup:
    """An Auto Scaling group with no pending pods; set_warm_pool fails the first ``failures`` calls."""

    def __init__(self, max_size: int = 3, failures: int = 0) -> None:
        self.max_size = max_size
        self.failures = failures
        self.warm_calls: list[acts.SetWarmPoolInput] = []

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

        return [observe, set_capacity, remove, set_warm_pool]


async def run_pool(env, group: FakeGroup, warm_pool: WarmPoolSettings, iterations: int = 4) -> NodePoolStatus:
    queue = f"q-{uuid.uuid4()}"
    async with Worker(env.client, task_queue=queue, workflows=[NodePoolScaling], activities=group.activities(),
                      activity_executor=ThreadPoolExecutor(2)):
        handle = await env.client.start_workflow(
            NodePoolScaling.run,
            NodePoolInput(pool=acts.PoolRef(pool="gpu-on-demand"), sizing=PoolSizing(min_nodes=0, warm_standby=0),
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


def test_a_warm_pool_on_a_spot_pool_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="warm_pool: EC2 Auto Scaling has no warm pools for Spot"):
        NodePoolInput(pool=acts.PoolRef(pool="gpu-spot", capacity_type="spot"), warm_pool=WarmPoolSettings(min_size=1))
