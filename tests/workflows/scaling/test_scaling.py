"""ReactiveScaling, ScheduleFloor and PredictivePrewarm on Temporal's time-skipping server, with
stub activities under the real names.

The stubs play a deployment whose replicas follow what the loop sets and whose queue the test
controls, so each test asserts what the loop did, not what a mock was told.
"""

from __future__ import annotations

import math

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest
from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.worker import Worker

from workers.cli.scaling import floor_spec
from workflows.core import naming
from workflows.cost.contract import MonthSpendInput
from workflows.rollout.contract import SCALE_VERSION, ScaleVersionInput
from workflows.cost.budget import MonthlyBudget, Spend
from workflows.scaling import contract as acts
from workflows.scaling.decide import ScalingPolicy, Signals, slo_replicas
from workflows.scaling.forecast import DemandForecast, forecast_demand
from workflows.scaling.floors import FloorEntry, ScheduleFloor, ScheduleFloorInput, SetFloor, floor_at
from workflows.scaling.node_pools import NodePoolInput, NodePoolScaling
from workflows.scaling.placement import PoolSizing
from workflows.scaling.loop_state import PolicyPatch, ScalingInput, ScalingStatus
from workflows.scaling.loop import ReactiveScaling
from workflows.scaling.prewarm import PredictivePrewarm, PrewarmInput


class FakeDeployment:
    """A deployment as the stub activities see it: replicas follow set_scale, the test sets load."""

    def __init__(self, replicas: int = 2) -> None:
        self.replicas = replicas
        self.canary: str | None = None  # another version the route sends traffic to (a rollout's canary)
        self.signals = Signals(queue_waiting=0, running=1, request_rate=1, kv_cache_usage=0.1, ttft_p99_seconds=0.2, gpu_util_percent=10)
        self.scale_calls: list[int] = []
        self.demand: list[float] = []  # the arrival rate's history the forecast activity reads, a sample a minute
        self.forecasts: list[acts.DemandForecastInput] = []
        self.queue_limits: list[acts.QueueLimitInput] = []
        self.queue_limits_cleared: list[acts.ClearQueueLimitInput] = []

    def activities(self):
        @activity.defn(name=acts.GET_SCALE)
        async def get_scale(target: acts.ScaleTarget) -> acts.ScaleStatus:
            return acts.ScaleStatus(version="1.0.0", replicas=self.replicas, ready_replicas=self.replicas, canary=self.canary)

        @activity.defn(name=acts.READ_SCALING_SIGNALS)
        async def read_signals(request: acts.ReadSignalsInput) -> Signals:
            return self.signals

        @activity.defn(name=SCALE_VERSION)
        async def scale_version(request: ScaleVersionInput) -> None:
            assert request.version == "1.0.0"
            self.replicas = request.replicas
            self.scale_calls.append(request.replicas)

        @activity.defn(name=acts.READ_REPLICA_HISTORY)
        async def read_history(request: acts.ReplicaHistoryInput) -> acts.ReplicaHistory:
            # hourly peak arrival rates, req/s
            return acts.ReplicaHistory(samples={"0:9": [24, 28, 32, 36], "0:10": [36, 36, 44, 40]}, weekday=0, minute_of_day=9 * 60 + 55)

        @activity.defn(name=acts.FORECAST_DEMAND)
        async def forecast(request: acts.DemandForecastInput) -> DemandForecast:
            self.forecasts.append(request)
            return forecast_demand(self.demand, request.step_seconds, request.horizon_seconds, request.error_quantile)

        @activity.defn(name=acts.SET_QUEUE_LIMIT)
        async def set_queue_limit(request: acts.QueueLimitInput) -> None:
            self.queue_limits.append(request)

        @activity.defn(name=acts.CLEAR_QUEUE_LIMIT)
        async def clear_queue_limit(request: acts.ClearQueueLimitInput) -> str:
            self.queue_limits_cleared.append(request)
            return "deleted"

        return [get_scale, read_signals, scale_version, read_history, forecast, set_queue_limit, clear_queue_limit]


async def start_loop(env, fake: FakeDeployment, **overrides):
    deployment = f"llm-serving/d{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4()}"
    worker = Worker(
        env.client,
        task_queue=queue,
        workflows=[ReactiveScaling, ScheduleFloor, PredictivePrewarm],
        activities=fake.activities(),
        activity_executor=ThreadPoolExecutor(4),
    )
    inp = ScalingInput(deployment=deployment, **overrides)
    return worker, queue, inp


async def status(handle) -> ScalingStatus:
    return await handle.query(ReactiveScaling.status)


async def test_scales_up_at_once_and_reports_decision(time_skipping_env):
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    worker, queue, inp = await start_loop(env, fake, policy=ScalingPolicy(max_replicas=20))
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        await env.sleep(45)
        fake.signals = Signals(queue_waiting=160, gpu_util_percent=60)
        await env.sleep(30)
        s = await status(handle)
        assert fake.replicas == 2 + 8  # + ceil(160 / 20) in one decision
        last = s.decisions[-1]
        assert (last.current, last.desired, last.applied) == (2, 10, True)
        assert last.signals.queue_waiting == 160 and "queue 160 > 10" in last.reason
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "**2 → 10**" in meta.current_details and "| queue 🔺 | 160 | 10 | 10 |" in meta.current_details
        await handle.terminate()


async def test_gateway_queue_limit_follows_the_ready_replicas(time_skipping_env):
    """Written at the first decision and again only when the Ready replicas change; refused
    requests count as demand, so a gateway answering 429s makes the loop scale."""
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    policy = ScalingPolicy(max_replicas=20, replica_capacity_rps=4, ttft_p99_slo_seconds=2.0, replica_ttft_seconds=0.2,
                           gateway_queue_limit=True)
    worker, queue, inp = await start_loop(env, fake, policy=policy, interval_seconds=30)
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        await env.sleep(100)  # several decisions at 2 replicas: one write
        assert [(q.deployment.name, q.limit.max_pending_requests, q.limit.retry_after_seconds) for q in fake.queue_limits] == [
            (inp.deployment.split("/")[1], 14, 2)  # 2 replicas x 4 req/s x (2 - 0.2) s
        ]
        fake.signals = Signals(queue_waiting=0, running=4, request_rate=4, rejected_rate=40, kv_cache_usage=0.5, ttft_p99_seconds=1.0)
        await env.sleep(35)
        s = await status(handle)
        assert fake.replicas > 2 and s.decisions[-1].signals.rejected_rate == 40, s.decisions[-1].reason
        await env.sleep(30)
        assert fake.queue_limits[-1].limit.max_pending_requests == math.floor(fake.replicas * 4 * 1.8)
        await handle.terminate()


async def test_a_queue_limit_turned_off_is_taken_out_once_and_written_again_when_turned_on(time_skipping_env):
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    worker, queue, inp = await start_loop(env, fake, policy=ScalingPolicy(gateway_queue_limit=True), interval_seconds=30,
                                          iterations_per_run=2)  # turned off in one run, taken out in the next
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        await env.sleep(5)
        assert len(fake.queue_limits) == 1 and fake.queue_limits_cleared == []
        await env.sleep(30)  # the second decision: the run continues as new before the next
        await handle.execute_update(ReactiveScaling.update_policy, PolicyPatch(gateway_queue_limit=False))
        await env.sleep(100)
        assert [c.deployment.name for c in fake.queue_limits_cleared] == [inp.deployment.split("/")[1]], "once, not every decision"
        s = await status(handle)
        assert s.runs >= 1 and sum("gateway queue limit removed (deleted)" in d.reason for d in s.decisions) == 1
        assert len(fake.queue_limits) == 1
        await handle.execute_update(ReactiveScaling.update_policy, PolicyPatch(gateway_queue_limit=True))
        await env.sleep(5)
        assert len(fake.queue_limits) == 2 and len(fake.queue_limits_cleared) == 1
        await handle.terminate()


async def test_scale_in_waits_while_a_canary_is_in_analysis(time_skipping_env):
    """Issue 32: a quiet deployment with a canary at 50 % is not stepped down under the rollout's
    gates; once the canary is gone (promoted or rolled back) the loop steps down."""
    env = time_skipping_env
    fake = FakeDeployment(replicas=6)
    fake.canary = "1.1.0"
    policy = ScalingPolicy(min_replicas=1, max_replicas=20, stabilisation_seconds=60, cooldown_seconds=0)
    worker, queue, inp = await start_loop(env, fake, policy=policy, interval_seconds=30)
    async with worker:
        handle = await env.client.start_workflow(ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue)
        await env.sleep(300)
        assert fake.scale_calls == []
        last = (await status(handle)).decisions[-1]
        assert "scale-in frozen at 6: 1.1.0 is a canary in analysis" in last.reason
        fake.canary = None
        await env.sleep(60)
        assert fake.scale_calls and fake.scale_calls[0] < 6
        await handle.terminate()


async def test_pause_resume_and_policy_update(time_skipping_env):
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    worker, queue, inp = await start_loop(env, fake)
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        await env.sleep(5)
        await handle.signal(ReactiveScaling.pause)
        await env.sleep(5)
        fake.signals = Signals(queue_waiting=400, gpu_util_percent=95)
        paused_at = len((await status(handle)).decisions)
        await env.sleep(300)
        s = await status(handle)
        assert s.paused and len(s.decisions) == paused_at and fake.replicas == 2  # no decisions while paused
        assert s.pause_reason == "paused by operator"  # the README's pause sends no reason (issue 16 item 14)

        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(ReactiveScaling.update_policy, PolicyPatch(min_replicas=9, max_replicas=3))
        assert r"min_replicas (9) > max_replicas (3)" in str(refused.value.cause)
        with pytest.raises(WorkflowUpdateFailedError) as refused:  # issue 16 item 13: raw pydantic text, retryable
            await handle.execute_update("update_policy", {"max_replicas": "many", "max_replica": 3})
        assert refused.value.cause.non_retryable and refused.value.cause.type == "InvalidInput"
        assert refused.value.cause.message.startswith("invalid update_policy input: max_replicas: Input should be a valid integer")
        assert "max_replica: Extra inputs are not permitted" in refused.value.cause.message
        policy = await handle.execute_update(ReactiveScaling.update_policy, PolicyPatch(max_replicas=5))
        assert policy.max_replicas == 5 and policy.min_replicas == 1

        await handle.signal(ReactiveScaling.resume)
        await env.sleep(5)
        s = await status(handle)
        assert not s.paused and s.decisions[-1].desired == 5 and s.decisions[-1].capped_by == "max_replicas"
        assert fake.replicas == 5

        await handle.signal("pause", "load test")  # a bare string (the SDK would drop it undecoded, issue 33)
        await env.sleep(5)
        assert (await status(handle)).pause_reason == "load test"
        await handle.signal("pause", {"reason": 7})  # not understood: pauses anyway, and says so
        await env.sleep(5)
        s = await status(handle)
        assert s.paused and s.pause_reason.startswith("paused by operator (pause payload not understood: reason:")
        await handle.terminate()


async def test_set_floor_with_expiry_and_schedule_floor_workflow(time_skipping_env):
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    policy = ScalingPolicy(max_replicas=20, stabilisation_seconds=60, cooldown_seconds=60)
    worker, queue, inp = await start_loop(env, fake, policy=policy)
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        await env.sleep(5)
        await handle.signal(
            ReactiveScaling.set_floor, SetFloor(replicas=6, source="manual", ttl_seconds=600, reason="launch")
        )
        await env.sleep(5)
        assert fake.replicas == 6
        # the decision names who raised it: an operator's floor is not a schedule's or pre-warm's
        raised = next(d for d in (await status(handle)).decisions if d.desired == 6)
        assert "raised to floor 6" in raised.reason and "manual (launch) 6" in raised.reason
        # a schedule's action: the ScheduleFloor workflow signals the loop
        await env.client.execute_workflow(
            ScheduleFloor.run, ScheduleFloorInput(deployment=inp.deployment, replicas=4), id=f"sf-{uuid.uuid4()}", task_queue=queue
        )
        s = await status(handle)
        assert s.floors["schedule"].replicas == 4 and s.floor == 6
        # the manual floor lapses; quiet load brings it down one step per cooldown, never below 4
        await env.sleep(3600)
        assert fake.replicas == 4
        assert fake.scale_calls == [6, 5, 4]
        await handle.terminate()


async def test_predictive_prewarm_raises_floor(time_skipping_env):
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    worker, queue, inp = await start_loop(env, fake, policy=ScalingPolicy(max_replicas=20))
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        reason = await env.client.execute_workflow(
            PredictivePrewarm.run,
            PrewarmInput(deployment=inp.deployment, startup_seconds=600),
            id=f"pw-{uuid.uuid4()}",
            task_queue=queue,
        )
        # 09:55 + 10 min start-up reaches the 10:00 slot; the loop's SLO sizing of [36, 36, 40, 44] req/s
        # is [10, 10, 11, 12] replicas (4 req/s each + headroom): q0.75 = 11.25 -> 12
        assert [slo_replicas(r, ScalingPolicy()) for r in (36, 40, 44)] == [10, 11, 12]
        assert "expected peak 12" in reason
        await env.sleep(5)
        s = await status(handle)
        assert s.floors["prewarm"].replicas == 12 and fake.replicas == 12
        await handle.terminate()


async def test_forecast_holds_what_the_ramp_will_need_within_the_cold_start(time_skipping_env):
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    fake.demand = [10.0 + i for i in range(30)]  # +1 req/s a minute for half an hour: 39 req/s now
    policy = ScalingPolicy(max_replicas=40, forecast_horizon_seconds=600)
    worker, queue, inp = await start_loop(env, fake, policy=policy)
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        await env.sleep(5)
        s = await status(handle)
        # ahead: the cold start, the wait until the next forecast and a decision interval, 930 s = 16 minutes
        ahead = slo_replicas(39 + 16, policy)
        assert ahead > slo_replicas(39, policy)
        assert s.floors["forecast"].replicas == ahead and fake.replicas == ahead
        assert "forecast (trend: 55 req/s within 930s)" in s.decisions[-1].reason
        # the history is read once per forecast_every_seconds, not at every decision
        await env.sleep(600)
        assert len(fake.forecasts) == 3 and fake.forecasts[0].horizon_seconds == 930
        await handle.terminate()


async def test_continue_as_new_keeps_history_bounded_over_a_week(time_skipping_env):
    env = time_skipping_env
    fake = FakeDeployment(replicas=3)
    worker, queue, inp = await start_loop(env, fake, interval_seconds=3600, iterations_per_run=12)
    async with worker:
        wid = naming.scaling_workflow_id(inp.deployment)
        handle = await env.client.start_workflow(ReactiveScaling.run, inp, id=wid, task_queue=queue)
        await env.sleep(5)
        await handle.signal(ReactiveScaling.set_floor, SetFloor(replicas=3, source="schedule"))
        await env.sleep(7 * 24 * 3600)
        latest = env.client.get_workflow_handle(wid)
        s = await status(latest)
        assert s.runs >= 13  # 168 hourly decisions / 12 per run
        assert s.floors["schedule"].replicas == 3  # floors survive continue-as-new
        assert len(s.decisions) == 20
        first = await env.client.get_workflow_handle(wid, run_id=handle.result_run_id).describe()
        assert first.status == WorkflowExecutionStatus.CONTINUED_AS_NEW
        events = [e async for e in latest.fetch_history_events()]
        assert len(events) < 200  # one run's history, not a week's
        assert fake.replicas == 3  # quiet week at the floor
        await latest.terminate()


@pytest.mark.parametrize(
    ("utc", "expected"),
    [
        ("2026-03-27T07:49:00+00:00", 1),  # Fri 08:49 Paris (CET): still the 02:00 minimum
        ("2026-03-27T07:50:00+00:00", 6),  # Fri 08:50 pre-warm
        ("2026-03-30T06:55:00+00:00", 6),  # Mon 08:55 Paris (CEST, after the DST change)
        ("2026-03-30T07:00:00+00:00", 8),  # Mon 09:00 peak
        ("2026-03-28T08:30:00+00:00", 1),  # Saturday: weekday entries do not apply
        ("2026-03-30T19:30:00+00:00", 4),  # Mon 21:30 scale-down starts
        ("2026-03-30T23:59:00+00:00", 4),  # Tue 01:59 CEST: still the evening floor
        ("2026-03-31T00:00:00+00:00", 1),  # Tue 02:00 CEST = 00:00 UTC: the night minimum
    ],
)
def test_floor_at_local_time(utc, expected):
    floors = [
        FloorEntry(at="08:50", replicas=6, days=["weekdays"]),
        FloorEntry(at="09:00", replicas=8, days=["weekdays"]),
        FloorEntry(at="21:00", replicas=4),
        FloorEntry(at="02:00", replicas=1),
    ]
    assert floor_at(floors, datetime.fromisoformat(utc), "Europe/Paris").replicas == expected


def test_floor_spec_is_a_local_calendar():
    spec = floor_spec(FloorEntry(at="08:50", replicas=6, days=["mon", "fri"]), "Europe/Paris")
    assert spec.time_zone_name == "Europe/Paris"
    (cal,) = spec.calendars
    assert [r.start for r in cal.hour] == [8] and [r.start for r in cal.minute] == [50]
    assert [r.start for r in cal.second] == [0]
    assert sorted(r.start for r in cal.day_of_week) == [1, 5]  # Temporal counts Sunday = 0
    daily = floor_spec(FloorEntry(at="02:00", replicas=1), "UTC").calendars[0]
    assert [(r.start, r.end) for r in daily.day_of_week] == [(0, 6)]


def test_bad_input_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="deployment must be NAMESPACE/NAME"):
        ScalingInput(deployment="chat")
    with pytest.raises(ValueError, match="unknown signal queries"):
        ScalingInput(deployment="a/b", queries={"queue": "x"})
    assert ScalingInput(deployment="a/b", queries={"running": "sum(x)"}).queries == {"running": "sum(x)"}
    # windows are parsed and rendered from a number: never the user's text inside [...]
    assert [ScalingInput(deployment="a/b", window=w).window for w in ("90", 45, "1h30m", "2m30s")] == ["90s", "45s", "5400s", "150s"]


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"interval_seconds": 1e308}, "interval_seconds"),
        ({"policy": {"cooldown_seconds": 1e308}}, "policy.cooldown_seconds"),
        ({"policy": {"max_replicas": 2_147_483_648}}, "policy.max_replicas"),
        ({"window": "abc"}, "window"),
        ({"window": "1m]) or vector(1000) #"}, "window"),
        ({"window": "0s"}, "window"),
    ],
)
async def test_bad_loop_input_fails_at_once_naming_the_field(time_skipping_env, bad, field):
    """Issue 20: these were accepted; 1e308 froze the loop, a window was pasted into every query."""
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    worker, queue, inp = await start_loop(env, fake)
    async with worker:
        handle = await env.client.start_workflow(
            "ReactiveScaling", {**inp.model_dump(mode="json"), **bad}, id=f"scaling/bad/{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        with pytest.raises(WorkflowFailureError) as info:
            await asyncio.wait_for(handle.result(), 10)
    assert field.split(".")[-1] in str(info.value.cause) and fake.scale_calls == []


async def test_huge_floor_ttl_and_policy_are_refused_and_the_loop_goes_on(time_skipping_env):
    """A set_floor with ttl 1e308 once raised OverflowError on every workflow task: now the
    signal is dropped (logged), an update with 1e308 is refused naming the field, and the loop
    still decides, answers status and pauses."""
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    worker, queue, inp = await start_loop(env, fake)
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        await env.sleep(5)
        await handle.signal("set_floor", {"replicas": 6, "source": "manual", "ttl_seconds": 1e308})
        await handle.signal("set_floor", {"replicas": 2_147_483_648, "source": "schedule"})
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("update_policy", {"stabilisation_seconds": 1e308}, result_type=ScalingPolicy)
        assert "stabilisation_seconds" in str(refused.value.cause)
        await env.sleep(65)
        s = await asyncio.wait_for(status(handle), 10)
        assert s.floors == {} and len(s.decisions) >= 2 and fake.replicas == 2
        await handle.signal(ReactiveScaling.pause)
        await env.sleep(5)
        assert (await status(handle)).paused
        await handle.terminate()


async def test_a_protected_realtime_class_grows_over_the_monthly_budget_and_says_so(time_skipping_env):
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    spend_reads: list[MonthSpendInput] = []

    @activity.defn(name="read_month_spend")
    async def read_month_spend(request: MonthSpendInput) -> Spend:
        spend_reads.append(request)
        return Spend(spent_usd=900, rate_usd_per_hour=40)  # already past a $100 month

    budget = MonthlyBudget(monthly_usd=100, protected=True)
    queue = f"q-{uuid.uuid4()}"
    inp = ScalingInput(deployment=f"llm-serving/d{uuid.uuid4().hex[:8]}", policy=ScalingPolicy(max_replicas=20, monthly_budget=budget))
    worker = Worker(env.client, task_queue=queue, workflows=[ReactiveScaling],
                    activities=[*fake.activities(), read_month_spend], activity_executor=ThreadPoolExecutor(4))
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        await env.sleep(45)
        assert spend_reads == [], "no growth, no spend read"
        fake.signals = Signals(queue_waiting=160, gpu_util_percent=60)
        await env.sleep(30)
        last = (await status(handle)).decisions[-1]
        assert fake.replicas == 10 and (last.current, last.desired, last.applied) == (2, 10, True)
        assert "over budget, growth kept (protected realtime class): forecast $" in last.reason
        assert spend_reads[0].month_start.day == 1 and spend_reads[0].prices == budget.prices
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "budget $100/month (protected)" in meta.current_details
        await handle.terminate()


async def test_a_node_pool_refuses_nodes_the_monthly_budget_cannot_pay_for(time_skipping_env):
    env = time_skipping_env
    capacity_set: list[int] = []

    @activity.defn(name=acts.OBSERVE_NODE_POOL)
    async def observe(pool: acts.PoolRef) -> acts.PoolObservation:
        pending = [acts.PendingReplica(pod=f"llm-serving/batch-{i}", model="llama-3-8b", gpus=1) for i in range(8)]
        return acts.PoolObservation(pending_gpus=8, pending_pods=[p.pod for p in pending], pending=pending,
                                    desired_capacity=0, max_size=10)

    @activity.defn(name=acts.SET_POOL_CAPACITY)
    async def set_capacity(request: acts.SetCapacityInput) -> None:
        capacity_set.append(request.desired)

    @activity.defn(name="read_month_spend")
    async def read_month_spend(request: MonthSpendInput) -> Spend:
        return Spend(spent_usd=0, rate_usd_per_hour=0)

    queue = f"q-{uuid.uuid4()}"
    inp = NodePoolInput(pool=acts.PoolRef(pool="gpu-spot", capacity_type="spot"), budget=MonthlyBudget(monthly_usd=0.01),
                        sizing=PoolSizing(warm_standby=0, gpus_per_node=4, pending_grace_seconds=0), interval_seconds=15)
    async with Worker(env.client, task_queue=queue, workflows=[NodePoolScaling],
                      activities=[observe, set_capacity, read_month_spend], activity_executor=ThreadPoolExecutor(2)):
        handle = await env.client.start_workflow(NodePoolScaling.run, inp, id=f"nodepool/{uuid.uuid4().hex[:6]}", task_queue=queue)
        await env.sleep(40)
        record = (await handle.query(NodePoolScaling.status)).records[-1]
        await handle.terminate()
    assert capacity_set == [] and record.desired == 0
    assert "monthly budget refuses 2 of 2 more node(s) (0 -> 0): forecast $" in record.reason
    with pytest.raises(ValueError, match="protected is for the realtime class's on-demand pools only"):
        NodePoolInput(pool=acts.PoolRef(pool="gpu-spot", capacity_type="spot"), budget=MonthlyBudget(monthly_usd=1, protected=True))


async def test_a_batch_loop_scales_on_completion_time(time_skipping_env):
    env = time_skipping_env
    fake = FakeDeployment(replicas=2)
    fake.signals = Signals(queue_waiting=600, request_rate=3, ttft_p99_seconds=0.1, e2e_p95_seconds=40)
    policy = ScalingPolicy(priority_class="batch", min_replicas=0, max_replicas=20, replica_capacity_rps=4,
                           queue_per_replica=1000, completion_p95_slo_seconds=60)
    worker, queue, inp = await start_loop(env, fake, policy=policy)
    async with worker:
        handle = await env.client.start_workflow(
            ReactiveScaling.run, inp, id=naming.scaling_workflow_id(inp.deployment), task_queue=queue
        )
        await env.sleep(5)
        first = (await status(handle)).decisions[0]
        await handle.terminate()
    # TTFT is fine, the 600-request backlog would take 120 s on 2 replicas: 4 drain it within 60 s
    assert (first.current, first.desired) == (2, 4) and first.reason.startswith("up: completion 120 > 60 (wants 4)")
