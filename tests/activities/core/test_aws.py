"""AwsClient against moto over HTTP: what the spot and node-pool activities rely on.

A missing queue or group is answered non-retryably (no retry can create it), the pool's base tag
round-trips, and terminating a group's instance lowers its desired capacity. (A second
termination of the same instance is not tried: moto answers it with an HTTP 500, not AWS's
ValidationError.)
"""

from __future__ import annotations

import pytest
from kubernetes import client
from temporalio.exceptions import ApplicationError

from activities.clients.aws import AwsClient
from activities.clients.kube import KubeClient
from activities.scaling.node_pool_activities import NodePoolActivities
from workflows.scaling.contract import SetWarmPoolInput


@pytest.fixture
def aws(moto_url) -> AwsClient:
    return AwsClient("us-east-1", moto_url, access_key_id="testing", secret_access_key="testing")


def test_queue_round_trip_and_a_missing_queue_is_permanent(aws):
    url = aws.sqs.create_queue(QueueName="spot-notices")["QueueUrl"]
    aws.sqs.send_message(QueueUrl=url, MessageBody="{}")
    [message] = aws.receive_messages(url, max_messages=10, wait_seconds=0, visibility_timeout_seconds=30)
    aws.delete_message(url, message["ReceiptHandle"])
    assert aws.receive_messages(url, max_messages=10, wait_seconds=0, visibility_timeout_seconds=0) == []
    with pytest.raises(ApplicationError) as err:
        aws.receive_messages(url.replace("spot-notices", "no-such-queue"), 1, 0, 0)
    assert err.value.non_retryable and "no-such-queue" in str(err.value)


def _group(aws: AwsClient, name: str, desired: int) -> None:
    template = aws.ec2.create_launch_template(
        LaunchTemplateName=f"{name}-lt", LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "p4d.24xlarge"}
    )["LaunchTemplate"]
    aws.autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=4, DesiredCapacity=desired,
        LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"]}, AvailabilityZones=["us-east-1a"],
    )


def test_group_capacity_tags_and_termination(aws):
    _group(aws, "gpu-od-test", desired=1)
    with pytest.raises(ApplicationError, match="not found") as err:
        aws.auto_scaling_group("no-such-group")
    assert err.value.non_retryable

    aws.set_group_tag("gpu-od-test", "tideplane.io/spot-base-capacity", "1")
    aws.set_desired_capacity("gpu-od-test", 2)
    group = aws.auto_scaling_group("gpu-od-test")
    assert group["DesiredCapacity"] == 2
    assert {t["Key"]: t["Value"] for t in group["Tags"]}["tideplane.io/spot-base-capacity"] == "1"
    aws.delete_group_tag("gpu-od-test", "tideplane.io/spot-base-capacity")
    assert not aws.auto_scaling_group("gpu-od-test").get("Tags")

    instance = aws.auto_scaling_group("gpu-od-test")["Instances"][0]["InstanceId"]
    assert aws.terminate_group_instance(instance) is True
    assert aws.auto_scaling_group("gpu-od-test")["DesiredCapacity"] == 1, "the group does not replace it"


def test_warm_pool_round_trip(aws):
    """What set_warm_pool reads back: moto keeps the configuration (it launches no warm instances;
    the sandbox's cloud plays those, infra/sandbox/nodes.py)."""
    _group(aws, "gpu-warm-test", desired=1)
    assert aws.warm_pool("gpu-warm-test") is None
    aws.put_warm_pool("gpu-warm-test", min_size=2, max_prepared_capacity=2, reuse_on_scale_in=True)
    config = aws.warm_pool("gpu-warm-test")["WarmPoolConfiguration"]
    assert (config["MinSize"], config["MaxGroupPreparedCapacity"], config["PoolState"]) == (2, 2, "Stopped")
    assert config["InstanceReusePolicy"] == {"ReuseOnScaleIn": True}
    # (a missing group is not tried: moto answers it with an HTTP 500, not AWS's ValidationError)


def test_set_warm_pool_is_idempotent_and_bounded_by_the_group(aws):
    _group(aws, "gpu-warm-act", desired=1)
    pools = NodePoolActivities(KubeClient(client.ApiClient()), aws)  # the warm pool needs no cluster
    assert pools.set_warm_pool(SetWarmPoolInput(pool="gpu-warm-act", size=2)).changed is True
    assert pools.set_warm_pool(SetWarmPoolInput(pool="gpu-warm-act", size=2)).changed is False
    assert pools.set_warm_pool(SetWarmPoolInput(pool="gpu-warm-act", size=1)).changed is True
    assert aws.warm_pool("gpu-warm-act")["WarmPoolConfiguration"]["MinSize"] == 1
    with pytest.raises(ApplicationError, match="exceeds the group's MaxSize 4") as err:
        pools.set_warm_pool(SetWarmPoolInput(pool="gpu-warm-act", size=5))
    assert err.value.non_retryable
    aws.set_group_tag("gpu-warm-act", "karpenter.sh/capacity-type", "spot")
    with pytest.raises(ApplicationError, match="no warm pools for Spot") as err:
        pools.set_warm_pool(SetWarmPoolInput(pool="gpu-warm-act", size=1))
    assert err.value.non_retryable
