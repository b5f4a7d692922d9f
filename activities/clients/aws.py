"""AWS as tideplane uses it: SQS (spot notices), EC2 Auto Scaling (GPU node pools, their warm pools) and EC2.

Built once by the worker with an explicit region and endpoint (moto in the sandbox) and passed to
the activity classes. Errors come back as ApplicationError naming what was asked, non-retryable
when asking again cannot help (a queue or group that does not exist, a bad parameter, no access).
The boto3 clients are public (``sqs``, ``autoscaling``, ``ec2``) for calls not wrapped here.
"""

from __future__ import annotations

from typing import NoReturn

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from temporalio.exceptions import ApplicationError

# Error codes that no retry can fix.
_PERMANENT = {
    "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist",
    "ReceiptHandleIsInvalid",
    "InvalidParameterValue",
    "AccessDenied",
    "AccessDeniedException",
    "UnauthorizedOperation",
}


def _fail(exc: ClientError, what: str) -> NoReturn:
    code = exc.response.get("Error", {}).get("Code", "")
    raise ApplicationError(f"{what}: {code}: {exc}", non_retryable=code in _PERMANENT) from None


class AwsClient:
    """SQS, EC2 Auto Scaling and EC2 clients for one region and endpoint."""

    def __init__(
        self,
        region: str,
        endpoint_url: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        connect_timeout: float = 5,
        read_timeout: float = 40,
    ):
        """Credentials: boto3's default chain (environment, IRSA, instance profile) unless given."""
        # read_timeout above SQS's 20 s long poll
        config = Config(connect_timeout=connect_timeout, read_timeout=read_timeout, retries={"max_attempts": 3, "mode": "standard"})
        session = boto3.session.Session(aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key)
        self.sqs = session.client("sqs", endpoint_url=endpoint_url, region_name=region, config=config)
        self.autoscaling = session.client("autoscaling", endpoint_url=endpoint_url, region_name=region, config=config)
        self.ec2 = session.client("ec2", endpoint_url=endpoint_url, region_name=region, config=config)

    # ------------------------------------------------------------ SQS

    def receive_messages(self, queue_url: str, max_messages: int, wait_seconds: int, visibility_timeout_seconds: int) -> list[dict]:
        """Long-poll the queue: SQS's message dicts (MessageId, ReceiptHandle, Body), maybe none."""
        try:
            response = self.sqs.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=max_messages,
                WaitTimeSeconds=wait_seconds,
                VisibilityTimeout=visibility_timeout_seconds,
            )
        except ClientError as exc:
            _fail(exc, f"receive from {queue_url}")
        return response.get("Messages", [])

    def delete_message(self, queue_url: str, receipt_handle: str) -> None:
        try:
            self.sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=receipt_handle)
        except ClientError as exc:
            _fail(exc, f"delete from {queue_url}")

    # ------------------------------------------------------------ EC2 Auto Scaling

    def auto_scaling_group(self, name: str) -> dict:
        """The group as DescribeAutoScalingGroups returns it; non-retryable when it does not exist."""
        try:
            groups = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
        except ClientError as exc:
            _fail(exc, f"Auto Scaling group {name}")
        if not groups:
            raise ApplicationError(f"Auto Scaling group {name!r} not found", non_retryable=True)
        return groups[0]

    def set_desired_capacity(self, group: str, desired: int) -> None:
        try:
            self.autoscaling.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=desired, HonorCooldown=False)
        except ClientError as exc:
            _fail(exc, f"Auto Scaling group {group}: desired capacity {desired}")

    def set_group_tag(self, group: str, key: str, value: str) -> None:
        """Tag the group itself (not propagated to the instances it launches)."""
        tag = {"ResourceId": group, "ResourceType": "auto-scaling-group", "Key": key, "Value": value, "PropagateAtLaunch": False}
        try:
            self.autoscaling.create_or_update_tags(Tags=[tag])
        except ClientError as exc:
            _fail(exc, f"Auto Scaling group {group}: tag {key}")

    def delete_group_tag(self, group: str, key: str) -> None:
        try:
            self.autoscaling.delete_tags(Tags=[{"ResourceId": group, "ResourceType": "auto-scaling-group", "Key": key}])
        except ClientError as exc:
            _fail(exc, f"Auto Scaling group {group}: delete tag {key}")

    def terminate_group_instance(self, instance_id: str) -> bool:
        """Terminate an instance and decrement its group's desired capacity (so it is not replaced).

        False when the instance was already gone or terminating (a retried call), True otherwise.
        """
        try:
            self.autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=instance_id, ShouldDecrementDesiredCapacity=True)
        except ClientError as exc:
            text = str(exc).lower()
            if "not found" in text or "terminat" in text:
                return False
            _fail(exc, f"terminate {instance_id}")
        return True

    def warm_pool(self, group: str) -> dict | None:
        """The group's warm pool as DescribeWarmPool returns it (``WarmPoolConfiguration`` and the
        warm ``Instances``), None when the group has none."""
        try:
            response = self.autoscaling.describe_warm_pool(AutoScalingGroupName=group)
        except ClientError as exc:
            _fail(exc, f"Auto Scaling group {group}: warm pool")
        return response if response.get("WarmPoolConfiguration") else None

    def put_warm_pool(self, group: str, min_size: int, max_prepared_capacity: int, reuse_on_scale_in: bool) -> None:
        """Stopped instances (paying for their disks, not their GPUs) kept ready to join the group."""
        try:
            self.autoscaling.put_warm_pool(
                AutoScalingGroupName=group,
                PoolState="Stopped",
                MinSize=min_size,
                MaxGroupPreparedCapacity=max_prepared_capacity,
                InstanceReusePolicy={"ReuseOnScaleIn": reuse_on_scale_in},
            )
        except ClientError as exc:
            _fail(exc, f"Auto Scaling group {group}: warm pool of {min_size}")
