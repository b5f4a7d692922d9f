"""The sandbox's cloud: EC2 Auto Scaling groups in moto whose instances become Kubernetes Nodes.

Each node pool of the SandboxConfig is a launch template plus an Auto Scaling group (named after
the pool, desired capacity = count). A loop plays the kubelets of those instances: an InService,
running instance registers its Node through the API (POST /api/v1/nodes) after a boot delay, and a
Node whose instance is gone or terminated is deleted. Scaling and spot failover therefore act on
the cloud exactly as in production — change an ASG's desired capacity or terminate an instance
with boto3 — and see Nodes come and go.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import boto3
from kubernetes import client

from activities.clients.s3 import S3Client
from infra.sandbox.config import DEFAULT_CONFIG, NodePool, SandboxConfig, load_config
from infra.sandbox.fleet import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL
from infra.sandbox.kubeapi.resources import KUBERNETES_VERSION
from infra.sandbox.kubeclient import api_client, raw
from infra.sandbox.node_agents import NodeAgents
from workflows.naming import GPU_RESOURCE, NODE_CAPACITY_TYPE, NODE_INSTANCE_TYPE, NODE_POOL, NODE_ZONE
from workflows.scaling.gpu_sharing import (
    GPU_COUNT_LABEL,
    GPU_REPLICAS_LABEL,
    SHARED_GPU_RESOURCE,
    SHARED_PRODUCT_SUFFIX,
    SHARING_STRATEGY_LABEL,
)

log = logging.getLogger("tideplane.nodes")

BOOT_SECONDS = 90.0  # sandbox seconds from InService to a registered Node (boot, kubelet join)
POOL_TAG = "tideplane.io/node-pool"
PROVIDER_PREFIX = "aws:///"
MAX_POOL_SIZE = 64


def aws_clients(endpoint_url: str, region: str = "us-east-1") -> tuple:
    """(ec2, autoscaling) clients for the moto server (or real AWS when endpoint_url is None)."""
    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=region) if endpoint_url else boto3.session.Session()
    return session.client("ec2", endpoint_url=endpoint_url), session.client("autoscaling", endpoint_url=endpoint_url)


def pool_tags(pool: NodePool) -> dict[str, str]:
    """Tags on the ASG and its instances, as Karpenter tags what it launches."""
    return {NODE_CAPACITY_TYPE: pool.capacity_type, NODE_POOL: pool.name, POOL_TAG: pool.name}


def ensure_pools(ec2, autoscaling, pools: list[NodePool]) -> None:
    """Create a launch template and an Auto Scaling group per pool; existing ones are left alone."""
    image = ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
    existing_templates = {t["LaunchTemplateName"] for t in ec2.describe_launch_templates()["LaunchTemplates"]}
    existing_groups = {g["AutoScalingGroupName"] for g in autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]}
    for pool in pools:
        tags = pool_tags(pool)
        if pool.name not in existing_templates:
            ec2.create_launch_template(
                LaunchTemplateName=pool.name,
                LaunchTemplateData={
                    "ImageId": image,
                    "InstanceType": pool.instance_type,
                    "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
                },
            )
        if pool.name not in existing_groups:
            autoscaling.create_auto_scaling_group(
                AutoScalingGroupName=pool.name,
                LaunchTemplate={"LaunchTemplateName": pool.name, "Version": "$Latest"},
                MinSize=0,
                MaxSize=pool_max_size(pool),
                DesiredCapacity=pool.count,
                AvailabilityZones=pool.zones,
                Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True} for k, v in tags.items()],
            )


def pool_max_size(pool: NodePool) -> int:
    """The Auto Scaling group's MaxSize: the pool's capacity (max_nodes), else room to scale."""
    return pool.max_nodes if pool.max_nodes is not None else max(pool.count, MAX_POOL_SIZE)


def restore_pools(autoscaling, pools: list[NodePool]) -> None:
    """Put each pool's Auto Scaling group back as ``ensure_pools`` made it: its count, its capacity,
    only the pool's tags (scaling, failover and spot replays change all three and may stop midway)."""
    groups = {g["AutoScalingGroupName"]: g for g in autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=[p.name for p in pools])["AutoScalingGroups"]}
    for pool in pools:
        autoscaling.update_auto_scaling_group(AutoScalingGroupName=pool.name, MinSize=0, MaxSize=pool_max_size(pool), DesiredCapacity=pool.count)
        added = [t["Key"] for t in groups[pool.name].get("Tags", []) if t["Key"] not in pool_tags(pool)]
        if added:
            autoscaling.delete_tags(Tags=[{"ResourceId": pool.name, "ResourceType": "auto-scaling-group", "Key": k} for k in added])


@dataclass
class Instance:
    instance_id: str
    pool: str
    zone: str
    instance_type: str
    private_dns: str
    private_ip: str
    state: str

    @property
    def provider_id(self) -> str:
        return f"{PROVIDER_PREFIX}{self.zone}/{self.instance_id}"


def node_manifest(instance: Instance, pool: NodePool) -> dict:
    """The Node a kubelet on this instance registers: EKS/Karpenter labels, GPUs, taints."""
    labels = {
        "kubernetes.io/hostname": instance.private_dns,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/region": instance.zone[:-1],
        NODE_ZONE: instance.zone,
        NODE_INSTANCE_TYPE: instance.instance_type,
        NODE_CAPACITY_TYPE: pool.capacity_type,
        NODE_POOL: pool.name,
        "eks.amazonaws.com/capacityType": "SPOT" if pool.capacity_type == "spot" else "ON_DEMAND",
        **pool.labels,
    }
    if pool.gpus:
        labels |= {
            GPU_COUNT_LABEL: str(pool.gpus),
            GPU_MEMORY_LABEL: str(int(pool.gpu_memory_gib * 1024)),
            GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3",
        }
    resources = {"cpu": str(pool.cpu), "memory": f"{pool.memory_gib}Gi", "pods": "110", GPU_RESOURCE: str(pool.gpus)}
    if pool.gpus and pool.gpu_sharing == "time-slicing":
        # as the device plugin with sharing.timeSlicing (renameByDefault) and GPU feature discovery show it
        labels |= {SHARING_STRATEGY_LABEL: "time-slicing", GPU_REPLICAS_LABEL: str(pool.gpu_replicas),
                   GPU_PRODUCT_LABEL: labels[GPU_PRODUCT_LABEL] + SHARED_PRODUCT_SUFFIX}
        del resources[GPU_RESOURCE]
        resources[SHARED_GPU_RESOURCE] = str(pool.gpus * pool.gpu_replicas)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": instance.private_dns, "labels": labels},
        "spec": {"providerID": instance.provider_id, "taints": [dict(t) for t in pool.taints]},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "InternalIP", "address": instance.private_ip}, {"type": "Hostname", "address": instance.private_dns}],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": str(uuid.uuid5(uuid.NAMESPACE_OID, instance.instance_id)),
                "containerRuntimeVersion": "containerd://1.7.11",
                "kernelVersion": "6.1.102-111.182.amzn2023.x86_64",
                "kubeProxyVersion": KUBERNETES_VERSION,  # the control plane's version, as on a fresh cluster
                "kubeletVersion": KUBERNETES_VERSION,
                "machineID": instance.instance_id.replace("i-", "ec2"),
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023",
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, instance.instance_id)),
            },
        },
    }


@dataclass
class Cloud:
    """Turns the pools' InService instances into Nodes and removes Nodes of vanished instances."""

    ec2: object
    autoscaling: object
    kube: client.ApiClient
    pools: dict[str, NodePool]
    time_scale: float = 1.0
    boot_seconds: float = BOOT_SECONDS
    first_seen: dict[str, float] = field(default_factory=dict)  # instance id -> monotonic time

    def instances(self) -> list[Instance]:
        groups = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=list(self.pools))["AutoScalingGroups"]
        in_service = {i["InstanceId"]: g["AutoScalingGroupName"] for g in groups for i in g["Instances"] if i["LifecycleState"] == "InService"}
        if not in_service:
            return []
        found = []
        for reservation in self.ec2.describe_instances(InstanceIds=list(in_service))["Reservations"]:
            for i in reservation["Instances"]:
                found.append(Instance(i["InstanceId"], in_service[i["InstanceId"]], i["Placement"]["AvailabilityZone"], i["InstanceType"], i["PrivateDnsName"], i.get("PrivateIpAddress", ""), i["State"]["Name"]))
        return found

    def reconcile(self, initial: bool = False) -> None:
        """One pass; ``initial`` registers every running instance at once (nodes that were up)."""
        now = time.monotonic()
        running = {i.provider_id: i for i in self.instances() if i.state == "running"}
        core = client.CoreV1Api(self.kube)
        nodes = raw(core.list_node(_preload_content=False))["items"]
        registered = {(n.get("spec") or {}).get("providerID"): n["metadata"]["name"] for n in nodes}
        for provider_id, name in registered.items():
            if provider_id and provider_id.startswith(PROVIDER_PREFIX) and provider_id not in running:
                log.info("instance of node %s is gone: deleting the node", name)
                try:
                    core.delete_node(name)
                except client.ApiException as exc:
                    if exc.status != 404:
                        raise
        for provider_id, instance in running.items():
            if provider_id in registered:
                continue
            seen = self.first_seen.setdefault(instance.instance_id, now - (self.boot_seconds if initial else 0))
            if (now - seen) * self.time_scale < self.boot_seconds:
                continue
            self.register(core, instance)
        alive = {i.instance_id for i in running.values()}
        self.first_seen = {k: v for k, v in self.first_seen.items() if k in alive}

    def register(self, core: client.CoreV1Api, instance: Instance) -> None:
        body = node_manifest(instance, self.pools[instance.pool])
        log.info("registering node %s (%s, pool %s)", instance.private_dns, instance.instance_id, instance.pool)
        try:
            created = raw(core.create_node(body, _preload_content=False))
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            return
        if not (created.get("status") or {}).get("allocatable"):
            core.patch_node_status(instance.private_dns, {"status": body["status"]})

    def run(self, interval: float = 1.0) -> None:
        """Reconcile forever; transient API or cloud errors are logged and retried."""
        initial = True
        while True:
            try:
                self.reconcile(initial)
                initial = False
            except Exception as exc:  # noqa: BLE001 - the cloud loop outlives flaky calls
                log.warning("reconcile failed: %s", exc)
            time.sleep(interval)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infra.sandbox.nodes", description=__doc__.splitlines()[0])
    parser.add_argument("--kube-url", required=True)
    parser.add_argument("--aws-endpoint-url", required=True)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--time-scale", type=float, default=None, help="override the config's time_scale")
    parser.add_argument("--boot-seconds", type=float, default=BOOT_SECONDS, help="sandbox seconds for a new instance to join")
    parser.add_argument("--node-cache-root", default=None, help="run a node agent per Node with its weight cache under this directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config: SandboxConfig = load_config(args.config)
    ec2, autoscaling = aws_clients(args.aws_endpoint_url)
    ensure_pools(ec2, autoscaling, config.node_pools)
    cloud = Cloud(ec2, autoscaling, api_client(args.kube_url), {p.name: p for p in config.node_pools}, args.time_scale or config.time_scale, args.boot_seconds)
    if args.node_cache_root:
        agents = NodeAgents(api_client(args.kube_url), args.kube_url, Path(args.node_cache_root),
                            S3Client(args.aws_endpoint_url, "us-east-1", access_key_id="testing", secret_access_key="testing"))
        threading.Thread(target=run_agents, args=(agents,), name="node-agents", daemon=True).start()
    cloud.run()


def run_agents(agents: NodeAgents, interval: float = 0.3) -> None:
    """Follow Nodes and staging pods forever; transient API errors are logged and retried."""
    while True:
        try:
            agents.reconcile()
        except Exception as exc:  # noqa: BLE001 - the agents outlive flaky calls
            log.warning("node agents: %s", exc)
        time.sleep(interval)


if __name__ == "__main__":
    main()
