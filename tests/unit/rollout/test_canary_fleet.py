"""What read_canary_fleet takes from a pod's container statuses, and the fleet queries' templates."""

import pytest
from kubernetes import client
from pydantic import ValidationError

from activities.rollout.canary_fleet import crash_reason
from workflows.rollout.diagnosis import CanaryFleet, diagnose
from workflows.rollout.gates import Evaluation, Verdict
from workflows.rollout.types import FleetQueries


def pod(state: client.V1ContainerState | None = None, last: client.V1ContainerState | None = None) -> client.V1Pod:
    status = client.V1ContainerStatus(name="vllm", image="vllm", image_id="", ready=False, restart_count=3,
                                      state=state, last_state=last)
    return client.V1Pod(metadata=client.V1ObjectMeta(name="chat-1-3-0-abc"), status=client.V1PodStatus(container_statuses=[status]))


def test_an_oom_kill_is_read_from_the_last_termination():
    killed = client.V1ContainerState(terminated=client.V1ContainerStateTerminated(exit_code=137, reason="OOMKilled"))
    running = client.V1ContainerState(running=client.V1ContainerStateRunning())
    assert crash_reason(pod(state=running, last=killed)) == "OOMKilled"


def test_a_crash_loop_is_read_from_the_wait():
    waiting = client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason="CrashLoopBackOff"))
    assert crash_reason(pod(state=waiting)) == "CrashLoopBackOff"


@pytest.mark.parametrize("reason", ["ContainerCreating", "ImagePullBackOff"])
def test_a_pod_still_starting_or_ended_normally_is_no_crash(reason):
    waiting = client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason=reason))
    done = client.V1ContainerState(terminated=client.V1ContainerStateTerminated(exit_code=0, reason="Completed"))
    assert crash_reason(pod(state=waiting, last=done)) is None
    assert crash_reason(client.V1Pod(metadata=client.V1ObjectMeta(name="p"))) is None  # no status yet


def test_fleet_queries_refuse_an_unknown_variable_naming_it():
    with pytest.raises(ValidationError, match="unknown variables.*pod"):
        FleetQueries(canary_rps="sum(rate(x{pod=\"${pod}\"}[1m]))")


def test_the_cause_reads_in_one_line_with_its_load():
    lost = diagnose(Evaluation(verdict=Verdict.PASS),
                    CanaryFleet(weight=50, canary_wanted=2, canary_ready=1, stable_ready=4, canary_rps=10, stable_rps=40))
    assert lost.describe() == "lost_capacity: 1 of 2 canary pod(s) lost (canary replica load 1.00x a stable replica's)"
