"""The sandbox's cloud: EC2 Auto Scaling groups in moto whose instances become Kubernetes Nodes.

Each node pool of the SandboxConfig is a launch template plus an Auto Scaling group (named after
the pool, desired capacity = count). A loop plays the kubelets of those instances: an InService,
running instance registers its Node through the API (POST /api/v1/nodes) after a boot delay, and a
Node whose instance is gone or terminated is deleted. Scaling and spot failover therefore act on
the cloud exactly as in production — change an ASG's desired capacity or terminate an instance
with boto3 — and see Nodes come and go.

Warm pools (``put_warm_pool``): moto keeps a group's warm pool configuration but runs no warm
instances, so this loop plays them. It keeps AWS's warm pool size (MaxGroupPreparedCapacity, or
MaxSize, minus the desired capacity, at least MinSize) of stopped EC2 instances tagged
``tideplane.io/warm-pool``, each prepared (booted, the serving images of the cluster's model
Deployments pulled, stopped) ``boot_seconds`` after its launch. When the group scales out, a new
instance takes a prepared warm instance's place and its disk: its Node joins after
``WARM_START_SECONDS`` instead of ``boot_seconds``, with the images and engine caches it had. When
the group's desired capacity drops and its pool reuses on scale-in, the removed node's instance is
stopped back into the pool with its disk instead of terminating (a spot reclaim, which does not
lower the desired capacity, is not reused). Each Node says how it started (annotation
``sandbox.tideplane.io/node-start`` and a ``ColdStart`` Event), which the kubelet reports as the
node part of a replica's cold start.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import boto3
from kubernetes import client

from activities.clients.s3 import S3Client
from activities.node_cache.access import TOKEN_ENV
from infra.sandbox.config import (
    DEFAULT_CONFIG,
    ENGINE_CACHES_ANNOTATION,
    IMAGE_SIZE_BYTES,
    NODE_START_ANNOTATION,
    NodePool,
    SandboxConfig,
    load_config,
)
from infra.sandbox.fleet_simulator.cluster import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL
from infra.sandbox.kubeapi.resources import KUBERNETES_VERSION
from infra.sandbox.kubeclient import api_client, raw
from infra.sandbox.node_agents import NodeAgents
from workflows.core.naming import (
    GPU_RESOURCE,
    LABEL_MODEL,
    NODE_CAPACITY_TYPE,
    NODE_INSTANCE_TYPE,
    NODE_POOL,
    NODE_ZONE,
)
from workflows.core.gpu_shares import (
    GPU_COUNT_LABEL,
    GPU_REPLICAS_LABEL,
    SHARED_GPU_RESOURCE,
    SHARED_PRODUCT_SUFFIX,
    SHARING_STRATEGY_LABEL,
)

log = logging.getLogger("tideplane.nodes")

BOOT_SECONDS = 90.0  # sandbox seconds from InService to a registered Node (boot, kubelet join)
# A stopped warm-pool instance starts and joins in about a minute (no launch, no first boot).
WARM_START_SECONDS = 60.0
WARM_POOL_TAG = "tideplane.io/warm-pool"  # on the stopped instances played as a group's warm pool
RETURNED_TAG = "tideplane.io/returned-from"  # on one of them: the scaled-in instance it stands for
REUSE_PAIRING_SECONDS = 5.0  # real seconds a scale-in and a gone node may be apart to be paired
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
    only the pool's tags, no warm pool (scaling, failover and spot replays change them and may stop
    midway)."""
    groups = {g["AutoScalingGroupName"]: g for g in autoscaling.describe_auto_scaling_groups(
        AutoScalingGroupNames=[p.name for p in pools])["AutoScalingGroups"]}
    for pool in pools:
        if autoscaling.describe_warm_pool(AutoScalingGroupName=pool.name).get("WarmPoolConfiguration"):
            autoscaling.delete_warm_pool(AutoScalingGroupName=pool.name, ForceDelete=True)
        autoscaling.update_auto_scaling_group(AutoScalingGroupName=pool.name, MinSize=0, MaxSize=pool_max_size(pool), DesiredCapacity=pool.count)
        added = [t["Key"] for t in groups[pool.name].get("Tags", []) if t["Key"] not in pool_tags(pool)]
        if added:
            autoscaling.delete_tags(Tags=[{"ResourceId": pool.name, "ResourceType": "auto-scaling-group", "Key": k} for k in added])


def warm_pool_size(config: dict | None, desired: int, max_size: int) -> int:
    """Instances AWS keeps in a group's warm pool: MaxGroupPreparedCapacity (the group's MaxSize
    when unset or -1) minus the desired capacity, at least MinSize; 0 without a warm pool."""
    if not config:
        return 0
    prepared = config.get("MaxGroupPreparedCapacity")
    if prepared is None or prepared < 0:
        prepared = max_size
    return max(config.get("MinSize", 0), prepared - desired)


@dataclass
class Disk:
    """What an instance's root volume keeps while it is stopped: pulled images, engine caches."""

    images: list[str] = field(default_factory=list)
    engine_caches: list[str] = field(default_factory=list)

    @classmethod
    def of_node(cls, node: dict) -> Disk:
        status = node.get("status") or {}
        annotations = node["metadata"].get("annotations") or {}
        images = [name for image in status.get("images") or [] for name in image.get("names") or []]
        return cls(images, json.loads(annotations.get(ENGINE_CACHES_ANNOTATION) or "[]"))


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


def node_manifest(instance: Instance, pool: NodePool, disk: Disk | None = None, start: str | None = None) -> dict:
    """The Node a kubelet on this instance registers: EKS/Karpenter labels, GPUs, taints; with a
    ``disk``, the images and engine caches already on it; ``start``: how it came up."""
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
    annotations = {}
    if start:
        annotations[NODE_START_ANNOTATION] = start
    if disk and disk.engine_caches:
        annotations[ENGINE_CACHES_ANNOTATION] = json.dumps(disk.engine_caches)
    if pool.gpus and pool.gpu_sharing == "time-slicing":
        # as the device plugin with sharing.timeSlicing (renameByDefault) and GPU feature discovery show it
        labels |= {SHARING_STRATEGY_LABEL: "time-slicing", GPU_REPLICAS_LABEL: str(pool.gpu_replicas),
                   GPU_PRODUCT_LABEL: labels[GPU_PRODUCT_LABEL] + SHARED_PRODUCT_SUFFIX}
        del resources[GPU_RESOURCE]
        resources[SHARED_GPU_RESOURCE] = str(pool.gpus * pool.gpu_replicas)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": instance.private_dns, "labels": labels, "annotations": annotations},
        "spec": {"providerID": instance.provider_id, "taints": [dict(t) for t in pool.taints]},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "InternalIP", "address": instance.private_ip}, {"type": "Hostname", "address": instance.private_dns}],
            "images": [{"names": [image], "sizeBytes": IMAGE_SIZE_BYTES} for image in (disk.images if disk else [])],
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
    """Turns the pools' InService instances into Nodes, removes Nodes of vanished instances, and
    plays the groups' warm pools."""

    ec2: object
    autoscaling: object
    kube: client.ApiClient
    pools: dict[str, NodePool]
    time_scale: float = 1.0
    boot_seconds: float = BOOT_SECONDS
    warm_start_seconds: float = WARM_START_SECONDS
    first_seen: dict[str, float] = field(default_factory=dict)  # instance id -> monotonic time
    disks: dict[str, Disk] = field(default_factory=dict)  # warm or warm-started instance id -> its disk
    prepared_at: dict[str, float] = field(default_factory=dict)  # warm instance id -> monotonic time it is ready
    from_warm_pool: set[str] = field(default_factory=set)  # InService instances that took a warm one's place
    desired_seen: dict[str, int] = field(default_factory=dict)  # group -> desired capacity at the last pass
    scaled_in: dict[str, list[float]] = field(default_factory=dict)  # group -> desired-capacity drops not yet paired
    departed: dict[str, list[tuple[float, Disk, str]]] = field(default_factory=dict)  # group -> gone nodes' (disk, instance) not yet paired

    def groups(self) -> list[dict]:
        return self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=list(self.pools))["AutoScalingGroups"]

    def instances(self, groups: list[dict] | None = None) -> list[Instance]:
        groups = self.groups() if groups is None else groups
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
        groups = self.groups()
        warm_configs = {g["AutoScalingGroupName"]: self.autoscaling.describe_warm_pool(
            AutoScalingGroupName=g["AutoScalingGroupName"]).get("WarmPoolConfiguration") for g in groups}
        warm = self.warm_instances()
        running = {i.provider_id: i for i in self.instances(groups) if i.state == "running"}
        core = client.CoreV1Api(self.kube)
        nodes = raw(core.list_node(_preload_content=False))["items"]
        registered = {(n.get("spec") or {}).get("providerID"): n for n in nodes}
        for provider_id, node in registered.items():
            if provider_id and provider_id.startswith(PROVIDER_PREFIX) and provider_id not in running:
                name = node["metadata"]["name"]
                pool = (node["metadata"].get("labels") or {}).get(NODE_POOL, "")
                self.departed.setdefault(pool, []).append((now, Disk.of_node(node), provider_id.rsplit("/", 1)[-1]))
                log.info("instance of node %s is gone: deleting the node", name)
                try:
                    core.delete_node(name)
                except client.ApiException as exc:
                    if exc.status != 404:
                        raise
        for provider_id, instance in running.items():
            if provider_id in registered:
                continue
            if instance.instance_id not in self.first_seen and not initial:
                self.take_from_warm_pool(instance, warm.setdefault(instance.pool, []), now)
            seen = self.first_seen.setdefault(instance.instance_id, now - (self.boot_seconds if initial else 0))
            boot = self.warm_start_seconds if instance.instance_id in self.from_warm_pool else self.boot_seconds
            if (now - seen) * self.time_scale < boot:
                continue
            self.register(core, instance, boot)
        alive = {i.instance_id for i in running.values()}
        self.first_seen = {k: v for k, v in self.first_seen.items() if k in alive}
        self.from_warm_pool &= alive
        for group in groups:
            name = group["AutoScalingGroupName"]
            drop = self.desired_seen.get(name, group["DesiredCapacity"]) - group["DesiredCapacity"]
            self.scaled_in.setdefault(name, []).extend([now] * max(0, drop))
            self.desired_seen[name] = group["DesiredCapacity"]
            self.reuse_scaled_in(name, (warm_configs.get(name) or {}).get("InstanceReusePolicy") or {}, warm.setdefault(name, []), now)
            self.size_warm_pool(name, warm.setdefault(name, []), warm_pool_size(warm_configs.get(name), group["DesiredCapacity"], group["MaxSize"]), now)
        live = alive | {i for ids in warm.values() for i in ids}
        self.disks = {k: v for k, v in self.disks.items() if k in live}
        self.prepared_at = {k: v for k, v in self.prepared_at.items() if k in live}

    # -- warm pools -------------------------------------------------------------------------------
    def reuse_scaled_in(self, pool: str, policy: dict, warm: list[str], now: float) -> None:
        """Pair the group's desired-capacity drops with its nodes that went (seen in either order, a
        pass apart at most: the two are separate reads): with ReuseOnScaleIn each such instance is
        stopped back into the warm pool with its disk. Unpaired departures (a spot reclaim keeps the
        desired capacity) are forgotten.

        The pool then never holds more than its size: ``size_warm_pool`` right after terminates the
        excess, launches still preparing first, so a scale-in into a full pool costs one instance and
        one into a pool with room keeps the returned one (what NodePoolScaling's freed-node sizing
        relies on). AWS documents the cap, not which instance goes: ReuseOnScaleIn lets a scaled-in
        instance return to the warm pool instead of terminating (API_InstanceReusePolicy), and
        MaxGroupPreparedCapacity bounds the instances in the warm pool or in any state but Terminated,
        the pool having an absolute size when MinSize equals it (API_PutWarmPool:
        https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_PutWarmPool.html)."""
        drops, departed = self.scaled_in[pool], self.departed.setdefault(pool, [])
        while drops and departed:
            drops.pop(0)
            _, disk, instance_id = departed.pop()
            if policy.get("ReuseOnScaleIn"):
                log.info("%s of %s was scaled in: it goes back to the warm pool", instance_id, pool)
                warm.append(self.launch_warm(pool, disk, prepared=True, now=now, returned=instance_id))
        horizon = now - REUSE_PAIRING_SECONDS
        self.scaled_in[pool] = [t for t in drops if t > horizon]
        self.departed[pool] = [entry for entry in departed if entry[0] > horizon]

    def warm_instances(self) -> dict[str, list[str]]:
        """Pool -> its warm (stopped or stopping) instance ids, oldest first."""
        reservations = self.ec2.describe_instances(Filters=[
            {"Name": "tag-key", "Values": [WARM_POOL_TAG]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
        ])["Reservations"]
        found: dict[str, list[tuple[str, str]]] = {}
        for reservation in reservations:
            for i in reservation["Instances"]:
                pool = next(t["Value"] for t in i.get("Tags", []) if t["Key"] == WARM_POOL_TAG)
                found.setdefault(pool, []).append((str(i.get("LaunchTime", "")), i["InstanceId"]))
        return {pool: [i for _, i in sorted(ids)] for pool, ids in found.items()}

    def launch_warm(self, pool: str, disk: Disk, prepared: bool, now: float, returned: str | None = None) -> str:
        """A stopped instance in ``pool``'s warm pool holding ``disk``; a new one is prepared (booted,
        images pulled, stopped) boot_seconds later, one ``returned`` by scale-in (the instance it plays,
        tagged) at once."""
        tags = {**pool_tags(self.pools[pool]), WARM_POOL_TAG: pool} | ({RETURNED_TAG: returned} if returned else {})
        tags = [{"Key": k, "Value": v} for k, v in tags.items()]
        instance_id = self.ec2.run_instances(
            LaunchTemplate={"LaunchTemplateName": pool, "Version": "$Latest"}, MinCount=1, MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )["Instances"][0]["InstanceId"]
        self.ec2.stop_instances(InstanceIds=[instance_id])
        self.disks[instance_id] = disk
        self.prepared_at[instance_id] = now if prepared else now + self.boot_seconds / self.time_scale
        log.info("warm pool of %s: %s %s", pool, instance_id, "returned" if prepared else "preparing")
        return instance_id

    def size_warm_pool(self, pool: str, ids: list[str], size: int, now: float) -> None:
        """Launch or terminate warm instances (``ids``, updated) to the pool's size; those with the
        least on their disks and the least prepared go first."""
        if len(ids) < size:
            images = self.serving_images()
            ids += [self.launch_warm(pool, Disk(list(images)), prepared=False, now=now) for _ in range(size - len(ids))]
        elif len(ids) > size:
            worth = sorted(ids, key=lambda i: (bool(self.disks.get(i, Disk()).engine_caches), -self.prepared_at.get(i, now)))
            gone = worth[: len(ids) - size]
            self.ec2.terminate_instances(InstanceIds=gone)
            ids[:] = [i for i in ids if i not in gone]

    def take_from_warm_pool(self, instance: Instance, warm: list[str], now: float) -> None:
        """A scale-out starts a prepared warm instance (moto launched a new one: it takes the warm
        one's place and disk)."""
        ready = [i for i in warm if self.prepared_at.get(i, now) <= now]
        if not ready:
            return
        taken = max(ready, key=lambda i: len(self.disks.get(i, Disk()).engine_caches))
        warm.remove(taken)
        self.ec2.terminate_instances(InstanceIds=[taken])
        self.disks[instance.instance_id] = self.disks.pop(taken, Disk())
        self.from_warm_pool.add(instance.instance_id)
        log.info("instance %s of %s starts from the warm pool (%s)", instance.instance_id, instance.pool, taken)

    def serving_images(self) -> list[str]:
        """The images of the cluster's model Deployments: what a warm instance pulls while prepared."""
        apps = client.AppsV1Api(self.kube)
        deployments = raw(apps.list_deployment_for_all_namespaces(label_selector=LABEL_MODEL, _preload_content=False))["items"]
        return sorted({c["image"] for d in deployments for c in d["spec"]["template"]["spec"].get("containers") or []})

    # -- nodes ------------------------------------------------------------------------------------
    def register(self, core: client.CoreV1Api, instance: Instance, boot: float | None = None) -> None:
        how = "warm-pool" if instance.instance_id in self.from_warm_pool else "launched"
        start = f"{boot if boot is not None else self.boot_seconds:g} {how}"
        body = node_manifest(instance, self.pools[instance.pool], self.disks.get(instance.instance_id), start)
        log.info("registering node %s (%s, pool %s, %s)", instance.private_dns, instance.instance_id, instance.pool, how)
        try:
            created = raw(core.create_node(body, _preload_content=False))
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            return
        if not (created.get("status") or {}).get("allocatable"):
            core.patch_node_status(instance.private_dns, {"status": body["status"]})
        seconds, _, _ = start.partition(" ")
        self.record_start(core, created, f"node {seconds}s: {'started from the warm pool' if how == 'warm-pool' else 'launched'} ({instance.instance_id})")

    def record_start(self, core: client.CoreV1Api, node: dict, message: str) -> None:
        """A ``ColdStart`` Event on the Node: how long it took to join (``kubectl get events``)."""
        meta = node["metadata"]
        core.create_namespaced_event("default", {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": "default"},
            "involvedObject": {"kind": "Node", "apiVersion": "v1", "name": meta["name"], "uid": meta.get("uid")},
            "reason": "ColdStart", "message": message, "type": "Normal", "count": 1,
            "source": {"component": "sandbox-cloud"}, "reportingComponent": "sandbox-cloud",
        })

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
                            S3Client(args.aws_endpoint_url, "us-east-1", access_key_id="testing", secret_access_key="testing"),
                            secret=os.environ.get(TOKEN_ENV))
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
