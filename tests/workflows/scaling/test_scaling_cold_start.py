"""ReactiveScaling shows its last scale-up's cold start by its parts (status and current details),
on Temporal's time-skipping server with the scaling tests' stub deployment."""

from __future__ import annotations

from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata

from tests.workflows.scaling.test_scaling import FakeDeployment, start_loop, status
from workflows.core import naming
from workflows.scaling import contract as acts
from workflows.scaling.decide import ScalingPolicy, Signals
from workflows.scaling.loop import ReactiveScaling

PARTS = {"node": 60.0, "image": 0.0, "weights": 20.0, "compile": 0.0, "warmup": 10.0}


class StartedDeployment(FakeDeployment):
    """Replicas are Ready at once; the newest one's ColdStart events say how it started."""

    def activities(self):
        @activity.defn(name=acts.GET_SCALE)
        async def get_scale(target: acts.ScaleTarget) -> acts.ScaleStatus:
            return acts.ScaleStatus(version="1.0.0", replicas=self.replicas, ready_replicas=self.replicas,
                                    cold_start=acts.ColdStart(pod=f"chat-{self.replicas}", parts=PARTS))

        return [get_scale, *(a for a in super().activities() if a.__name__ != "get_scale")]


async def test_the_last_scale_up_shows_its_cold_start_by_parts(time_skipping_env):
    env = time_skipping_env
    fake = StartedDeployment(replicas=2)
    worker, queue, inp = await start_loop(env, fake, policy=ScalingPolicy(max_replicas=20))
    async with worker:
        handle = await env.client.start_workflow(ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue)
        await env.sleep(30)
        assert (await status(handle)).last_scale_up is None
        calm = fake.signals
        fake.signals = Signals(queue_waiting=160, gpu_util_percent=60)
        while not fake.scale_calls:
            await env.sleep(5)
        fake.signals = calm
        await env.sleep(30)
        up = (await status(handle)).last_scale_up
        target = fake.replicas
        assert up is not None and up.replicas == target and up.cold_start.parts == PARTS and up.cold_start.pod == f"chat-{target}"
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert f"{target} replica(s) Ready in" in meta.current_details
        assert f"node 60s, image 0s, weights 20s, compile 0s, warmup 10s (pod chat-{target})" in meta.current_details
        await handle.terminate()
