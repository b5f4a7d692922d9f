"""The sandbox's cloud plays an Auto Scaling warm pool with ReuseOnScaleIn as AWS bounds it: a
scaled-in instance goes back to the pool, and the pool never holds more than its size (MinSize =
MaxGroupPreparedCapacity). NodePoolScaling relies on this to keep exactly the freed nodes it wants
warm: it raises the size before a scale-in. Against moto and a fresh emulated cluster, one
reconcile pass at a time."""

from __future__ import annotations

import uuid

from infra.sandbox.config import NodePool
from infra.sandbox.nodes import RETURNED_TAG, Cloud, aws_clients, ensure_pools
from tests.servers import moto_url  # noqa: F401 - moto over HTTP


def warm_pool(cloud: Cloud, pool: str) -> dict[str, str | None]:
    """The pool's warm instances -> the scaled-in instance each stands for (None: launched into the pool)."""
    ids = cloud.warm_instances().get(pool, [])
    if not ids:
        return {}
    found = cloud.ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return {i["InstanceId"]: next((t["Value"] for t in i.get("Tags", []) if t["Key"] == RETURNED_TAG), None)
            for r in found for i in r["Instances"]}


def test_a_full_warm_pool_stays_at_its_size_and_one_with_room_keeps_the_scaled_in_instance(moto_url, kube_api):  # noqa: F811
    pool = NodePool(name=f"gpu-reuse-{uuid.uuid4().hex[:6]}", count=3, capacity_type="on-demand", gpus=4, max_nodes=6)
    ec2, autoscaling = aws_clients(moto_url)
    ensure_pools(ec2, autoscaling, [pool])
    cloud = Cloud(ec2, autoscaling, kube_api, {pool.name: pool})
    cloud.reconcile(initial=True)
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[pool.name])["AutoScalingGroups"][0]
    first, second, _ = sorted(i["InstanceId"] for i in group["Instances"])

    def put_size(size: int) -> None:
        autoscaling.put_warm_pool(AutoScalingGroupName=pool.name, MinSize=size, MaxGroupPreparedCapacity=size,
                                  PoolState="Stopped", InstanceReusePolicy={"ReuseOnScaleIn": True})

    def scale_in(instance: str) -> None:
        autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=instance, ShouldDecrementDesiredCapacity=True)

    put_size(1)
    cloud.reconcile()
    assert len(warm_pool(cloud, pool.name)) == 1, "the pool is launched to its size"

    scale_in(first)  # into a full pool: it stays at its size, one instance is terminated
    cloud.reconcile()
    assert len(warm_pool(cloud, pool.name)) == 1

    put_size(2)  # room for one more, set before the scale-in as NodePoolScaling does
    scale_in(second)
    cloud.reconcile()
    warm = warm_pool(cloud, pool.name)
    assert len(warm) == 2 and second in warm.values(), f"the scaled-in {second} is kept warm: {warm}"
