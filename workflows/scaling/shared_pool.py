"""SharedPoolScaling: one durable loop for the models that share a pool of GPUs.

Each member model keeps its own scaling policy and ``decide`` (as under ReactiveScaling); the
pool holds a fixed number of GPUs (as a Karpenter NodePool's ``limits`` caps it) and, every
interval, ``share_pool`` (workflows/scaling/gpu_sharing.py) splits them: each model keeps its
minimum, idle models give their replicas back, and the memory left goes to the busiest models
(load per Ready replica), one replica at a time. Scale-downs are applied before scale-ups so the
replicas given back free their GPU memory for the ones that take it.

A member's Deployment asks for a share (``nvidia.com/gpu.shared``, its ``--gpu-memory-utilization``
as the rollout's ``gpu_memory_utilization`` writes it); the loop claims each member's Deployment
as ReactiveScaling does, so a member is not also scaled by its own loop.

API (stable): workflow type SharedPoolScaling; ID ``sharedpool/<pool>`` (naming.shared_pool_workflow_id); signals ``pause``,
``resume``; query ``status``.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from pydantic import BaseModel, Field, ValidationError, model_validator
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import workflows.core.naming as naming
    from workflows.core.bounds import DAY_SECONDS, MAX_ITERATIONS, PromWindow
    import workflows.scaling.contract as acts
    from workflows.scaling.decide import ScalerState, ScalingPolicy, Signals, decide, demand_rate
    from workflows.scaling.gpu_sharing import ModelDemand, model_demand, share_pool
    from workflows.scaling.deployment_scale import read_scale, read_signals, scale_to
    from workflows.core.waiting import wait_until

DECISIONS_KEPT = 20


class PoolMember(BaseModel):
    """One model of the shared pool: its Deployment, its own policy, and the share of a GPU each replica claims."""

    deployment: naming.DeploymentName = Field(description="NAMESPACE/NAME of the logical deployment")
    version: str | None = Field(None, description="version to scale; None: the one with the most traffic")
    policy: ScalingPolicy = Field(default_factory=ScalingPolicy)
    gpu_memory_utilization: float = Field(gt=0, le=1, description="vLLM's claim per replica: this fraction of a GPU")


class MemberDecision(BaseModel):
    """What one model wanted, what the pool granted, and why."""

    deployment: str
    current: int
    ready: int
    desired: int = Field(description="its own policy's decision")
    granted: int = Field(description="what the pool gave it")
    busy: float = Field(description="requests/s per Ready replica")
    applied: bool = False
    reason: str


class PoolDecision(BaseModel):
    at: datetime
    used_gpus: float = Field(description="GPU memory claimed after the decision, in whole GPUs")
    members: list[MemberDecision]


class SharedPoolCarry(BaseModel):
    states: dict[str, ScalerState] = Field(default_factory=dict, description="deployment -> its decide() state")
    paused: bool = False
    decisions: list[PoolDecision] = Field(default_factory=list)
    runs: int = 0


class SharedPoolInput(BaseModel):
    pool: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description="the node pool's name")
    gpus: float = Field(gt=0, description="GPUs the pool may hold (its limit); replicas' claims sum to at most this")
    members: list[PoolMember] = Field(min_length=1)
    interval_seconds: float = Field(30, ge=1, le=DAY_SECONDS)
    iterations_per_run: int = Field(240, ge=1, le=MAX_ITERATIONS, description="decisions per run before continue-as-new")
    window: PromWindow = Field("1m", description="rate window of the signal queries")
    carry: SharedPoolCarry | None = None

    @model_validator(mode="after")
    def _members_fit(self) -> SharedPoolInput:
        names = [m.deployment for m in self.members]
        if len(set(names)) != len(names):
            raise ValueError(f"members: a deployment is listed twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        floor = sum(m.policy.min_replicas * m.gpu_memory_utilization for m in self.members)
        if floor > self.gpus + 1e-9:
            raise ValueError(f"gpus: the members' min_replicas claim {floor:g} GPUs, more than the pool's {self.gpus:g}")
        return self


class SharedPoolStatus(BaseModel):
    pool: str
    gpus: float
    paused: bool
    decisions: list[PoolDecision]
    runs: int
    iteration: int


def member_demand(member: PoolMember, desired: int, ready: int, signals: Signals) -> ModelDemand:
    return model_demand(member.deployment, desired, member.policy.min_replicas, member.gpu_memory_utilization,
                        demand_rate(signals), ready)


@workflow.defn(name="SharedPoolScaling", failure_exception_types=[ValidationError])
class SharedPoolScaling:
    @workflow.init
    def __init__(self, input: SharedPoolInput) -> None:
        carry = input.carry or SharedPoolCarry()
        self._input = input
        self._states = dict(carry.states)
        self._paused = carry.paused
        self._decisions = list(carry.decisions)
        self._runs = carry.runs
        self._iteration = 0
        self._wake = False

    @workflow.run
    async def run(self, input: SharedPoolInput) -> None:
        while True:
            if self._iteration >= input.iterations_per_run or workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(input.model_copy(update={"carry": self._carry()}))
            if self._paused:
                workflow.set_current_details(f"**shared pool {input.pool}** · paused")
                await workflow.wait_condition(lambda: not self._paused)
            await self._decide_once()
            self._iteration += 1
            self._wake = False
            await wait_until(lambda: self._wake, timedelta(seconds=input.interval_seconds), "next decision")

    async def _observe(self, member: PoolMember) -> tuple[acts.ScaleStatus, Signals] | str:
        namespace, name = naming.split_deployment(member.deployment)
        scale = await read_scale(namespace, name, member.version, summary=f"read replicas of {name}")
        if isinstance(scale, str):
            return scale
        signals = await read_signals(namespace, name, dict(acts.DEFAULT_SIGNAL_QUERIES), self._input.window,
                                     summary=f"read signals of {name}")
        return scale, signals

    async def _decide_once(self) -> None:
        now = workflow.now()
        members = self._input.members
        observed = await asyncio.gather(*(self._observe(m) for m in members))
        decisions: dict[str, tuple[PoolMember, acts.ScaleStatus, int, str]] = {}
        demands: list[ModelDemand] = []
        held = 0.0  # claims of members the loop cannot read this time: their last grant stays
        notes: list[str] = []
        for member, seen in zip(members, observed):
            if isinstance(seen, str):
                notes.append(f"{member.deployment}: {seen}")
                held += self._last_granted(member) * member.gpu_memory_utilization
                continue
            scale, signals = seen
            state = self._states.get(member.deployment, ScalerState())
            decision = decide(now.timestamp(), scale.replicas, signals, member.policy, state, ready=scale.ready_replicas)
            self._states[member.deployment] = decision.state
            decisions[member.deployment] = (member, scale, decision.desired, decision.reason)
            demands.append(member_demand(member, decision.desired, scale.ready_replicas, signals))
        grants = share_pool(self._input.gpus - held, demands)
        records = {
            d.model: MemberDecision(
                deployment=d.model, current=decisions[d.model][1].replicas, ready=decisions[d.model][1].ready_replicas,
                desired=d.desired, granted=grants[d.model], busy=d.busy, reason=decisions[d.model][3],
            )
            for d in demands
        }
        for record in records.values():
            if record.granted < record.desired:
                record.reason += f"; the shared pool {self._input.pool} grants {record.granted} (its GPUs serve busier models)"
        # replicas given back first: their GPU memory is what the growing models are granted
        for record in sorted(records.values(), key=lambda r: (r.granted - r.current, r.deployment)):
            if record.granted != record.current:
                namespace, name = naming.split_deployment(record.deployment)
                failed = await scale_to(namespace, name, decisions[record.deployment][1], record.granted)
                record.applied = failed is None
                if failed:
                    record.reason += f"; scaling failed: {failed}"
        used = sum(r.granted * decisions[r.deployment][0].gpu_memory_utilization for r in records.values()) + held
        self._decisions = [*self._decisions, PoolDecision(at=now, used_gpus=used, members=list(records.values()))][-DECISIONS_KEPT:]
        self._details(used, notes)

    def _details(self, used: float, notes: list[str]) -> None:
        lines = [f"**shared pool {self._input.pool}** · {used:g} of {self._input.gpus:g} GPUs claimed"]
        lines += [f"⚠ {n}" for n in notes]
        if self._decisions:
            lines.append(
                "| model | current | wants | granted | req/s per replica |\n|---|---|---|---|---|\n"
                + "\n".join(f"| {m.deployment} | {m.current} | {m.desired} | {m.granted} | {m.busy:.2f} |"
                            for m in self._decisions[-1].members)
            )
        workflow.set_current_details("\n\n".join(lines))

    def _last_granted(self, member: PoolMember) -> int:
        for pool_decision in reversed(self._decisions):
            for m in pool_decision.members:
                if m.deployment == member.deployment:
                    return m.granted
        return member.policy.min_replicas

    def _carry(self) -> SharedPoolCarry:
        return SharedPoolCarry(states=self._states, paused=self._paused, decisions=self._decisions, runs=self._runs + 1)

    @workflow.signal(name="pause")
    def pause(self) -> None:
        self._paused = True

    @workflow.signal(name="resume")
    def resume(self) -> None:
        self._paused = False
        self._wake = True

    @workflow.query(name="status")
    def status(self) -> SharedPoolStatus:
        return SharedPoolStatus(pool=self._input.pool, gpus=self._input.gpus, paused=self._paused,
                                decisions=self._decisions, runs=self._runs, iteration=self._iteration)
