"""``tideplane sandbox spot-interrupt NODE [--rebalance]``: play EC2 reclaiming a spot instance.

Publishes the EventBridge event in AWS's exact format to the sandbox's SQS queue for the node's
instance (from its ``spec.providerID``) and, for an interruption, terminates the instance through
its Auto Scaling group once the two-minute notice has run out (time-scaled). The group replaces
it (as a spot ASG does when capacity allows), so the cloud loop deletes the old Node and later
registers a new one: the failover, then the return to spot, can both be watched.

The event's ``time`` is set so that ``time + 120 s`` is when the instance really goes away at the
sandbox's time scale: the failover's deadline arithmetic stays that of production.

``tideplane sandbox spot-replay --trace DIR --pool ZONE=POOL ...``: the same, driven by an
availability trace (``benchmarks.traces.load_availability``'s folder format). Each spot pool
stands for one trace zone; when the trace reads a zone unavailable, every instance of its pool
gets the interruption notice and is terminated after it, and the pool's capacity (its Auto
Scaling group's MaxSize) drops to 0 until the trace reads it available again; then the pool
gets its nodes back, at most the zone's launch count.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
from kubernetes import client

from infra.sandbox.kubeclient import api_client, raw
from infra.sandbox.launcher import Ports, Sandbox, SandboxError
from workflows.core.naming import NODE_CAPACITY_TYPE
from workflows.spot.events import (
    NOTICE_SECONDS,
    NoticeKind,
    build_event,
    instance_id_from_provider_id,
)


class SpotInterruptRefused(SandboxError):
    """The node does not exist or is not a spot instance: nothing is sent or terminated."""


@dataclass
class SpotInterruption:
    node: str
    instance_id: str
    event_id: str
    kind: NoticeKind
    terminated: bool


def spot_interrupt(
    sandbox_env: Mapping[str, str],
    node: str,
    rebalance: bool = False,
    time_scale: float = 1.0,
    wait: bool = True,
) -> SpotInterruption:
    """Send the notice for ``node``; for an interruption, terminate its instance after the notice.

    ``sandbox_env`` is the sandbox's environment (``Sandbox.env()`` / the env file): the kube API,
    moto and queue URLs. With ``wait=False`` only the event is published (the caller terminates).
    Raises SpotInterruptRefused for an unknown node or one that is not spot capacity.
    """
    kube = api_client(sandbox_env["TIDEPLANE_SANDBOX_KUBEAPI_URL"])
    try:
        found = raw(client.CoreV1Api(kube).read_node(node, _preload_content=False))
    except client.ApiException as exc:
        if exc.status == 404:
            raise SpotInterruptRefused(f"no node {node!r} in the sandbox (`kubectl get nodes -L {NODE_CAPACITY_TYPE}` lists them)") from None
        raise
    capacity = (found["metadata"].get("labels") or {}).get(NODE_CAPACITY_TYPE)
    if capacity != "spot":
        raise SpotInterruptRefused(
            f"node {node!r} is {capacity or 'unlabelled'} capacity ({NODE_CAPACITY_TYPE}={capacity}): "
            "EC2 sends interruption notices and rebalance recommendations to spot instances only"
        )
    instance_id = instance_id_from_provider_id((found.get("spec") or {}).get("providerID", ""))
    aws = _Aws(sandbox_env)
    kind = NoticeKind.REBALANCE if rebalance else NoticeKind.INTERRUPTION
    event_id = aws.notice(kind, instance_id, time_scale)
    terminated = False
    if not rebalance and wait:
        time.sleep(NOTICE_SECONDS / time_scale)
        aws.autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=instance_id, ShouldDecrementDesiredCapacity=False)
        terminated = True
    return SpotInterruption(node=node, instance_id=instance_id, event_id=event_id, kind=kind, terminated=terminated)


class _Aws:
    """The sandbox's moto: the spot queue and the Auto Scaling groups."""

    def __init__(self, sandbox_env: Mapping[str, str]) -> None:
        session = boto3.session.Session(
            aws_access_key_id=sandbox_env.get("AWS_ACCESS_KEY_ID", "testing"),
            aws_secret_access_key=sandbox_env.get("AWS_SECRET_ACCESS_KEY", "testing"),
            region_name=sandbox_env.get("AWS_DEFAULT_REGION", "us-east-1"),
        )
        self.region = session.region_name
        self.sqs = session.client("sqs", endpoint_url=sandbox_env["AWS_ENDPOINT_URL"])
        self.autoscaling = session.client("autoscaling", endpoint_url=sandbox_env["AWS_ENDPOINT_URL"])
        self.queue_url = sandbox_env["TIDEPLANE_SPOT_QUEUE_URL"]

    def notice(self, kind: NoticeKind, instance_id: str, time_scale: float) -> str:
        """Publish the event, dated so that its two-minute deadline falls when the time-scaled notice ends."""
        emitted = datetime.now(UTC) - timedelta(seconds=NOTICE_SECONDS - NOTICE_SECONDS / time_scale)
        event_id = str(uuid.uuid4())
        event = build_event(kind, instance_id, event_id=event_id, time=emitted, region=self.region)
        self.sqs.send_message(QueueUrl=self.queue_url, MessageBody=json.dumps(event))
        return event_id

    def group(self, pool: str) -> dict:
        groups = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[pool])["AutoScalingGroups"]
        if not groups:
            raise SpotInterruptRefused(f"no Auto Scaling group {pool!r} in the sandbox")
        return groups[0]


@dataclass
class ReplayedChange:
    step: int
    zone: str
    pool: str
    change: str  # "lost": notices sent, instances terminated, capacity 0 | "back": capacity and nodes restored
    instances: list[str]


def spot_replay(
    sandbox_env: Mapping[str, str],
    trace_dir: Path | str,
    pools: Mapping[str, str],
    sample_seconds: float,
    time_scale: float = 1.0,
    first_step: int = 0,
    steps: int | None = None,
) -> list[ReplayedChange]:
    """Replay the trace's availability of the zones in ``pools`` (trace zone -> spot pool), one
    sample every ``sample_seconds`` real seconds; returns what changed, in order."""
    from benchmarks.traces import load_availability  # the trace format's one reader

    trace = load_availability(trace_dir)
    zones = {z.zone: z for z in trace.zones}
    unknown = sorted(set(pools) - set(zones))
    if unknown:
        raise SpotInterruptRefused(f"zones {unknown} are not in {trace.name} (it has {sorted(zones)})")
    aws = _Aws(sandbox_env)
    for pool in pools.values():
        aws.group(pool)  # refuse an unknown pool before anything is sent
    full = {pool: aws.group(pool)["MaxSize"] for pool in pools.values()}
    held = {pool: aws.group(pool)["DesiredCapacity"] for pool in pools.values()}
    last = trace.steps if steps is None else min(trace.steps, first_step + steps)
    changes: list[ReplayedChange] = []
    for step in range(first_step, last):
        started = time.monotonic()
        lost = [(z, p) for z, p in pools.items() if not zones[z].available[step] and (step == first_step or zones[z].available[step - 1])]
        back = [(z, p) for z, p in pools.items() if step > first_step and zones[z].available[step] and not zones[z].available[step - 1]]
        doomed = {p: [i["InstanceId"] for i in aws.group(p)["Instances"]] for _, p in lost}
        for ids in doomed.values():
            for instance_id in ids:
                aws.notice(NoticeKind.INTERRUPTION, instance_id, time_scale)
        if lost:
            time.sleep(NOTICE_SECONDS / time_scale)
        for zone, pool in lost:
            for instance_id in doomed[pool]:
                aws.autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=instance_id, ShouldDecrementDesiredCapacity=True)
            aws.autoscaling.update_auto_scaling_group(AutoScalingGroupName=pool, MinSize=0, MaxSize=0, DesiredCapacity=0)
            changes.append(ReplayedChange(step, zone, pool, "lost", doomed[pool]))
        for zone, pool in back:
            capacity = zones[zone].capacity(step)
            size = held[pool] if capacity is None else min(held[pool], capacity)
            aws.autoscaling.update_auto_scaling_group(AutoScalingGroupName=pool, MaxSize=full[pool], DesiredCapacity=size)
            changes.append(ReplayedChange(step, zone, pool, "back", []))
        time.sleep(max(0.0, sample_seconds - (time.monotonic() - started)))
    return changes


def spot_interrupt_running(state_dir: Path | str, node: str, rebalance: bool = False) -> SpotInterruption:
    """``spot_interrupt`` for the sandbox running from ``state_dir`` (its ports and time scale)."""
    env, time_scale = _running(state_dir)
    return spot_interrupt(env, node, rebalance=rebalance, time_scale=time_scale)


def spot_replay_running(state_dir: Path | str, trace_dir: Path | str, pools: Mapping[str, str], sample_seconds: float,
                        first_step: int = 0, steps: int | None = None) -> list[ReplayedChange]:
    """``spot_replay`` for the sandbox running from ``state_dir``."""
    env, time_scale = _running(state_dir)
    return spot_replay(env, trace_dir, pools, sample_seconds, time_scale, first_step, steps)


def _running(state_dir: Path | str) -> tuple[dict[str, str], float]:
    box = Sandbox(state_dir)
    if not box.running():
        raise SandboxError(f"no sandbox running from {box.state_dir}")
    record = json.loads(box.pids_file.read_text())
    return Sandbox(state_dir, Ports(**record["ports"])).env(), float(record["time_scale"])
