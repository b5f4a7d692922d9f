"""An availability trace replayed on the sandbox's spot pools: notices, terminations, capacity."""

from __future__ import annotations

import json
import threading
import time

import boto3

from infra.sandbox.launcher import AWS_ENV
from infra.sandbox.spot import spot_replay


def test_a_zone_lost_in_the_trace_loses_its_pool_after_the_notice_and_comes_back(sandbox, tmp_path):  # noqa: F811
    trace = tmp_path / "one-zone"
    trace.mkdir()
    doc = {"metadata": {"zone": "us-east-1c", "gap_seconds": 600, "instance_type": "p5.48xlarge",
                        "price_info": {"price": 30.0, "on_demand_price": 98.32}}, "data": [0, 1, 1, 0]}
    (trace / "us-east-1c.json").write_text(json.dumps(doc))
    env = sandbox.env
    aws = dict(aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"], aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
               region_name=AWS_ENV["AWS_DEFAULT_REGION"], endpoint_url=sandbox.urls["moto"])
    autoscaling, sqs = boto3.client("autoscaling", **aws), boto3.client("sqs", **aws)
    group = lambda: autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu-spot"])["AutoScalingGroups"][0]
    before = group()
    held = [i["InstanceId"] for i in before["Instances"]]
    assert held, "the test sandbox's spot pool has an instance"

    during: list[int] = []  # MaxSize while the zone is out (samples 1-2 of the trace)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            during.append(group()["MaxSize"])
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    changes = spot_replay(env, trace, {"us-east-1c": "gpu-spot"}, sample_seconds=2, time_scale=float(sandbox.config["time_scale"]))
    done.set()
    watcher.join(5)

    assert [(c.step, c.change, c.pool) for c in changes] == [(1, "lost", "gpu-spot"), (3, "back", "gpu-spot")]
    assert changes[0].instances == held
    bodies = [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=env["TIDEPLANE_SPOT_QUEUE_URL"], MaxNumberOfMessages=10).get("Messages", [])]
    warned = {b["detail"]["instance-id"] for b in bodies if b["detail-type"] == "EC2 Spot Instance Interruption Warning"}
    assert set(held) <= warned, "each instance got the interruption warning before it went"
    assert 0 in during, "no capacity while the trace says the zone is unavailable"
    after = group()
    assert after["MaxSize"] == before["MaxSize"] and after["DesiredCapacity"] == before["DesiredCapacity"]
    assert not set(held) & {i["InstanceId"] for i in after["Instances"]}, "the pool came back on new instances"


def test_a_zone_the_trace_does_not_have_is_refused_before_anything_is_sent(tmp_path):
    import pytest

    from infra.sandbox.spot import SpotInterruptRefused

    doc = {"metadata": {"zone": "us-east-1c", "gap_seconds": 600, "price_info": {"price": 1.0, "on_demand_price": 2.0}}, "data": [0]}
    (tmp_path / "z.json").write_text(json.dumps(doc))
    with pytest.raises(SpotInterruptRefused, match=r"zones \['us-east-1z'\] are not in .* \(it has \['us-east-1c'\]\)"):
        spot_replay({}, tmp_path, {"us-east-1z": "gpu-spot"}, sample_seconds=0)
