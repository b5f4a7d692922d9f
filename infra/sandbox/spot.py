"""``tideplane sandbox spot-interrupt NODE [--rebalance]``: play EC2 reclaiming a spot instance.

Publishes the EventBridge event in AWS's exact format to the sandbox's SQS queue for the node's
instance (from its ``spec.providerID``) and, for an interruption, terminates the instance through
its Auto Scaling group once the two-minute notice has run out (time-scaled). The group replaces
it (as a spot ASG does when capacity allows), so the cloud loop deletes the old Node and later
registers a new one: the failover, then the return to spot, can both be watched.

The event's ``time`` is set so that ``time + 120 s`` is when the instance really goes away at the
sandbox's time scale: the failover's deadline arithmetic stays that of production.
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
from workflows.naming import NODE_CAPACITY_TYPE
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
    session = boto3.session.Session(
        aws_access_key_id=sandbox_env.get("AWS_ACCESS_KEY_ID", "testing"),
        aws_secret_access_key=sandbox_env.get("AWS_SECRET_ACCESS_KEY", "testing"),
        region_name=sandbox_env.get("AWS_DEFAULT_REGION", "us-east-1"),
    )
    endpoint = sandbox_env["AWS_ENDPOINT_URL"]
    kind = NoticeKind.REBALANCE if rebalance else NoticeKind.INTERRUPTION
    notice = NOTICE_SECONDS / time_scale  # real seconds until the instance goes away
    emitted = datetime.now(UTC) - timedelta(seconds=NOTICE_SECONDS - notice)
    event_id = str(uuid.uuid4())
    event = build_event(kind, instance_id, event_id=event_id, time=emitted, region=session.region_name)
    session.client("sqs", endpoint_url=endpoint).send_message(
        QueueUrl=sandbox_env["TIDEPLANE_SPOT_QUEUE_URL"], MessageBody=json.dumps(event)
    )
    terminated = False
    if not rebalance and wait:
        time.sleep(notice)
        session.client("autoscaling", endpoint_url=endpoint).terminate_instance_in_auto_scaling_group(
            InstanceId=instance_id, ShouldDecrementDesiredCapacity=False
        )
        terminated = True
    return SpotInterruption(node=node, instance_id=instance_id, event_id=event_id, kind=kind, terminated=terminated)


def spot_interrupt_running(state_dir: Path | str, node: str, rebalance: bool = False) -> SpotInterruption:
    """``spot_interrupt`` for the sandbox running from ``state_dir`` (its ports and time scale)."""
    box = Sandbox(state_dir)
    if not box.running():
        raise SandboxError(f"no sandbox running from {box.state_dir}")
    record = json.loads(box.pids_file.read_text())
    running = Sandbox(state_dir, Ports(**record["ports"]))
    return spot_interrupt(running.env(), node, rebalance=rebalance, time_scale=float(record["time_scale"]))
