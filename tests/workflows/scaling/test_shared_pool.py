"""SharedPoolScaling on Temporal's time-skipping server, with stub activities under the real names:
two models share a pool of GPUs; when one gets busy, the idle one gives its GPUs back to it."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.worker import Worker

from workflows.core import naming
from workflows.rollout.contract import SCALE_VERSION, ScaleVersionInput
from workflows.scaling import contract as acts
from workflows.scaling.decide import ScalingPolicy, Signals
from workflows.scaling.shared_pool import PoolMember, SharedPoolInput, SharedPoolScaling, SharedPoolStatus

IDLE = Signals(queue_waiting=0, running=0, request_rate=0, kv_cache_usage=0.0, ttft_p99_seconds=0.2)
STEADY = Signals(queue_waiting=0, running=1, request_rate=1, kv_cache_usage=0.1, ttft_p99_seconds=0.2)


class FakePool:
    """Deployments whose replicas follow scale_version and whose load the test sets; every scale call is logged in order."""

    def __init__(self, replicas: dict[str, int]) -> None:
        self.replicas = dict(replicas)
        self.signals = {name: STEADY for name in replicas}
        self.calls: list[tuple[str, int]] = []

    def activities(self):
        @activity.defn(name=acts.GET_SCALE)
        async def get_scale(target: acts.ScaleTarget) -> acts.ScaleStatus:
            n = self.replicas[target.deployment]
            return acts.ScaleStatus(version="1.0.0", replicas=n, ready_replicas=n)

        @activity.defn(name=acts.READ_SCALING_SIGNALS)
        async def read_signals(request: acts.ReadSignalsInput) -> Signals:
            return self.signals[request.deployment]

        @activity.defn(name=SCALE_VERSION)
        async def scale_version(request: ScaleVersionInput) -> None:
            self.replicas[request.deployment.name] = request.replicas
            self.calls.append((request.deployment.name, request.replicas))

        return [get_scale, read_signals, scale_version]


async def test_a_busy_model_gets_the_gpus_an_idle_one_gives_back(time_skipping_env):
    env = time_skipping_env
    fake = FakePool({"chat": 2, "embed": 2})
    queue = f"q-{uuid.uuid4()}"
    pool = f"shared-{uuid.uuid4().hex[:8]}"
    inp = SharedPoolInput(
        pool=pool, gpus=2, interval_seconds=30,
        members=[PoolMember(deployment=f"llm/{name}", policy=ScalingPolicy(max_replicas=6), gpu_memory_utilization=0.5)
                 for name in ("chat", "embed")],
    )
    async with Worker(env.client, task_queue=queue, workflows=[SharedPoolScaling], activities=fake.activities(),
                      activity_executor=ThreadPoolExecutor(4)):
        handle = await env.client.start_workflow(SharedPoolScaling.run, inp, id=naming.shared_pool_workflow_id(pool), task_queue=queue)
        await env.sleep(45)
        assert fake.calls == []  # the pool is full and nobody wants more: nothing moves
        fake.signals = {"chat": Signals(queue_waiting=160, running=8, request_rate=12), "embed": IDLE}
        await env.sleep(30)
        # chat wants 10 (capped at 6), embed is idle: embed keeps its minimum, chat gets the rest of the 2 GPUs
        assert fake.replicas == {"chat": 3, "embed": 1}
        assert fake.calls == [("embed", 1), ("chat", 3)]  # given back first, then taken
        s: SharedPoolStatus = await handle.query(SharedPoolScaling.status)
        last = {m.deployment: m for m in s.decisions[-1].members}
        assert (last["llm/chat"].desired, last["llm/chat"].granted) == (6, 3)
        assert "grants 3" in last["llm/chat"].reason and last["llm/embed"].granted == 1
        assert s.decisions[-1].used_gpus == pytest.approx(2.0)
        await handle.terminate()


async def test_minimums_the_pool_cannot_hold_are_refused_naming_the_field(time_skipping_env):
    env = time_skipping_env
    queue = f"q-{uuid.uuid4()}"
    bad = {"pool": "small", "gpus": 1, "members": [
        {"deployment": f"llm/m{i}", "policy": {"min_replicas": 2}, "gpu_memory_utilization": 0.4} for i in range(2)]}
    async with Worker(env.client, task_queue=queue, workflows=[SharedPoolScaling], activities=FakePool({}).activities(),
                      activity_executor=ThreadPoolExecutor(2)):
        with pytest.raises(WorkflowFailureError) as err:
            await env.client.execute_workflow("SharedPoolScaling", bad, id=f"sharedpool/{uuid.uuid4()}", task_queue=queue)
    assert "gpus: the members' min_replicas claim 1.6 GPUs, more than the pool's 1" in str(err.value.cause)
