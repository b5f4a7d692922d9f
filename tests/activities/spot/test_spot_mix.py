"""The spot mix's activities against the Kubernetes emulator and moto over HTTP.

``apply_spot_mix`` writes the split a scaling loop planned (one spot Deployment per pool, the
on-demand base as a claim, the total on the versioned Deployment) and converges when written
again; ``read_spot_domains`` reads a pool's room from its Auto Scaling group; SpotReclaim's and
ReturnToSpot's counts and release keep working on top of a mix.
"""

from __future__ import annotations

from pathlib import Path

from activities.clients.aws import AwsClient
from activities.clients.kube import KubeClient
from activities.rollout.serving_pods import ServingPods, deployment_manifest
from activities.spot.fallback_deployments import MIX_FOR, fallback_name, mix_name
from activities.spot.spot_activities import SpotActivities
from activities.spot.spot_mix_activities import SpotMixActivities
from workflows.core.naming import NODE_CAPACITY_TYPE, DeploymentRef
from workflows.rollout.contract import EnsureVersionInput
from workflows.spot.contract import (
    ApplySpotMixInput,
    ClaimFallbackInput,
    CountsInput,
    PoolInput,
    ReleaseFallbackInput,
    SpotDomainsInput,
)
from workflows.spot.mix import MIX_CLAIMANT, MIX_TARGET_ANNOTATION, SpotDomain

REF = DeploymentRef(namespace="default", name="summarise")


def _batch_version(kube: KubeClient) -> str:
    req = EnsureVersionInput(
        deployment=REF, model="llama-3-8b", version="1.0.0", image="vllm/vllm-openai:v0.8.5", gpus_per_replica=1,
        replicas=3, weights_path="/var/cache/tideplane/models/llama-3-8b/1.0.0", priority_class="batch",
    )
    body = deployment_manifest(req, ServingPods(model_cache_dir=Path("/var/cache/tideplane/models")))
    kube.apps.create_namespaced_deployment(REF.namespace, body)
    return body["metadata"]["name"]


def _spot_group(aws: AwsClient, name: str, max_size: int) -> None:
    template = aws.ec2.create_launch_template(
        LaunchTemplateName=f"{name}-lt", LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "p4d.24xlarge"}
    )["LaunchTemplate"]
    aws.autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=max_size, DesiredCapacity=0,
        LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"]}, AvailabilityZones=["us-east-1a"],
    )


def test_a_split_is_written_per_pool_converges_and_keeps_its_base_through_a_return_to_spot(kube_api, moto_url):
    kube = KubeClient(kube_api)
    aws = AwsClient("us-east-1", moto_url, access_key_id="testing", secret_access_key="testing")
    spot, mix = SpotActivities(kube, aws), SpotMixActivities(kube, aws)
    name = _batch_version(kube)
    _spot_group(aws, "mix-spot-a", 4)
    _spot_group(aws, "mix-spot-b", 0)  # capacity withdrawn (what spot-replay does to a lost zone)
    domains = [SpotDomain(pool=p, zone=z, instance_type="p4d.24xlarge", spot_price=10.0, replicas_per_node=2)
               for p, z in (("mix-spot-a", "us-east-1a"), ("mix-spot-b", "us-east-1b"))]
    assert [(d.pool, d.available, d.capacity) for d in mix.read_spot_domains(SpotDomainsInput(domains=domains)).domains] == [
        ("mix-spot-a", True, 8), ("mix-spot-b", False, 0)
    ]

    split = ApplySpotMixInput(deployment=REF, version="1.0.0", total=5, spot={"mix-spot-a": 4, "mix-spot-b": 0}, on_demand=1)
    for _ in range(2):  # a retried or repeated write converges
        written = mix.apply_spot_mix(split)
    a = kube.apps.read_namespaced_deployment(mix_name(name, "mix-spot-a"), REF.namespace)
    assert a.spec.replicas == 4 and a.spec.template.metadata.labels[MIX_FOR] == name
    assert a.spec.template.spec.node_selector == {NODE_CAPACITY_TYPE: "spot", "karpenter.sh/nodepool": "mix-spot-a"}
    assert mix_name(name, "mix-spot-b") not in [d.metadata.name for d in kube.apps.list_namespaced_deployment(REF.namespace).items]
    versioned = kube.apps.read_namespaced_deployment(name, REF.namespace)
    # no node runs anything here: the version keeps its own 3 until the pools hold replicas Ready
    assert versioned.spec.replicas == 3 and versioned.metadata.annotations[MIX_TARGET_ANNOTATION] == "5"
    assert written.deployments == {mix_name(name, "mix-spot-a"): 4, mix_name(name, "mix-spot-b"): 0, fallback_name(name): 1, name: 3}

    # a reclaim claims on top of the base; spot must hold the total less the base
    key = DeploymentRef(namespace=REF.namespace, name=name)
    spot.claim_spot_fallback(ClaimFallbackInput(deployment=key, claimant="i-0abc", replicas=2))
    [counts] = spot.spot_replica_counts(CountsInput(deployments=[key])).counts
    assert (counts.desired, counts.fallback_desired) == (4, 3)
    _spot_group(aws, "mix-on-demand", 4)
    aws.set_desired_capacity("mix-on-demand", 1)
    assert spot.sync_on_demand_pool(PoolInput(asg="mix-on-demand")).claimants == ["i-0abc"]  # one node for the reclaim, none for the base
    released = spot.release_spot_fallback(ReleaseFallbackInput(deployment=key))
    assert released.claims == {"i-0abc": 2}
    assert kube.apps.read_namespaced_deployment(fallback_name(name), REF.namespace).spec.replicas == 1  # the mix's base stays

    mix.apply_spot_mix(split.model_copy(update={"spot": {"mix-spot-a": 0, "mix-spot-b": 0}, "on_demand": 5}))
    assert kube.apps.read_namespaced_deployment(mix_name(name, "mix-spot-a"), REF.namespace).spec.replicas == 0
    od = kube.apps.read_namespaced_deployment(fallback_name(name), REF.namespace)
    assert od.spec.replicas == 5 and MIX_CLAIMANT in od.metadata.annotations["tideplane.io/spot-claims"]


def test_a_spot_mix_deployment_reads_as_its_total_everywhere_and_retires_by_every_pool(kube_api, moto_url):
    """Issue 32: ``apply_spot_mix`` leaves the versioned Deployment at 0 and the total in an
    annotation only ``get_scale`` read, so a rollout sized its canary and promotion from 0 and
    retiring the old version left its spot pools and on-demand base running. One model,
    ``version_replicas``, answers for every reader; ``scale_version`` to 0 scales every pool down."""
    from temporalio.testing import ActivityEnvironment

    from activities.clients.kube import serving_namespace
    from activities.clients.prometheus import PrometheusClient
    from activities.clients.s3 import S3Client
    from activities.clients.vllm import VllmClient
    from activities.core.deployments import read_version_replicas
    from activities.rollout.rollout_activities import RolloutActivities
    from activities.scaling.scaling_activities import ScalingActivities
    from workflows.rollout.contract import RouteWeightsInput, ScaleVersionInput
    from workflows.rollout.gates import canary_replicas
    from workflows.scaling.contract import ScaleTarget

    kube = KubeClient(kube_api)
    kube.core.create_namespace(serving_namespace("mixed"))
    ref = DeploymentRef(namespace="mixed", name="summarise")
    nowhere = "http://127.0.0.1:9"
    rollout = RolloutActivities(kube, S3Client(nowhere, "us-east-1"), PrometheusClient(nowhere), VllmClient(),
                                ServingPods(model_cache_dir=Path("/var/cache/tideplane/models")), gateway="inference-gateway",
                                service_url_template="http://{service}.{namespace}:8000")
    aws = AwsClient("us-east-1", moto_url, access_key_id="testing", secret_access_key="testing")
    mix = SpotMixActivities(kube, aws)
    version = EnsureVersionInput(
        deployment=ref, model="llama-3-8b", version="1.0.0", image="vllm/vllm-openai:v0.8.5", gpus_per_replica=1,
        replicas=3, weights_path="/var/cache/tideplane/models/llama-3-8b/1.0.0", priority_class="batch",
    )
    rollout.ensure_version(version)
    ActivityEnvironment().run(rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 100}, stable="1.0.0"))
    name = ref.versioned("1.0.0")
    mix.apply_spot_mix(ApplySpotMixInput(deployment=ref, version="1.0.0", total=6, spot={"pool-a": 4, "pool-b": 0}, on_demand=2))

    held = read_version_replicas(kube, ref, "1.0.0")
    assert (held.total, held.own, held.pools, held.on_demand_base) == (6, 3, {"pool-a": 4}, 2)  # no node: own holds; pool-b never created
    stable = rollout.describe_deployment(ref).stable
    assert (stable.version, stable.replicas) == ("1.0.0", 6)  # the rollout sizes from the real total, not 0
    assert canary_replicas(stable.replicas, 50) == 3
    assert ScalingActivities(kube, PrometheusClient(nowhere)).get_scale(ScaleTarget(namespace="mixed", deployment="summarise")).replicas == 6

    # the new version promoted, the old one retires: every pool of it and its on-demand base go to 0
    rollout.ensure_version(version.model_copy(update={"version": "2.0.0", "replicas": 6, "weights_path": "/var/cache/tideplane/models/llama-3-8b/2.0.0"}))
    ActivityEnvironment().run(
        rollout.set_route_weights, RouteWeightsInput(deployment=ref, weights={"1.0.0": 0, "2.0.0": 100}, stable="2.0.0")
    )
    rollout.scale_version(ScaleVersionInput(deployment=ref, version="1.0.0", replicas=0))
    gone = read_version_replicas(kube, ref, "1.0.0")
    assert (gone.total, gone.own, gone.pools, gone.on_demand_base) == (0, 0, {"pool-a": 0}, 0)
    assert kube.apps.read_namespaced_deployment(mix_name(name, "pool-a"), ref.namespace).spec.replicas == 0
    assert kube.apps.read_namespaced_deployment(fallback_name(name), ref.namespace).spec.replicas == 0
    assert MIX_TARGET_ANNOTATION not in (kube.apps.read_namespaced_deployment(name, ref.namespace).metadata.annotations or {})
    assert {v.version: v.replicas for v in rollout.describe_deployment(ref).versions} == {"1.0.0": 0, "2.0.0": 6}


def test_a_version_placed_into_a_mix_keeps_its_own_replicas_until_the_pools_carry_the_total(kube_api, moto_url):
    """Make before break: the versioned Deployment went to 0 the moment the split was written,
    before any pool's pod was Ready, so a version promoted onto a spot-mix deployment served 100 %
    of the traffic from nothing while its spot pods started. Its own replicas now go down only by
    what the pools and the on-demand base hold Ready."""
    from infra.sandbox.config import NodePool
    from infra.sandbox.nodes import Instance, node_manifest
    from tests.kube_fixtures import kube_wait

    kube = KubeClient(kube_api)
    aws = AwsClient("us-east-1", moto_url, access_key_id="testing", secret_access_key="testing")
    mix = SpotMixActivities(kube, aws)
    for i, (pool, capacity) in enumerate((("mix-od", "on-demand"), ("mix-pool-a", "spot"))):
        nodes = NodePool(name=pool, count=1, capacity_type=capacity, gpus=16)
        kube.core.create_node(node_manifest(Instance(f"i-0{i}", pool, "us-east-1a", "p5.48xlarge", f"ip-10-0-0-{i}", f"10.0.0.{i}", "running"), nodes))
    name = _batch_version(kube)

    def ready(deployment: str) -> int:
        return kube.apps.read_namespaced_deployment(deployment, REF.namespace).status.ready_replicas or 0

    kube_wait(lambda: ready(name) == 3, "the version's 3 replicas Ready")
    split = ApplySpotMixInput(deployment=REF, version="1.0.0", total=3, spot={"mix-pool-a": 2}, on_demand=1)
    first = mix.apply_spot_mix(split)
    assert first.deployments[name] == 3 and first.own == 3  # nothing of the mix is Ready yet: own stays
    kube_wait(lambda: ready(mix_name(name, "mix-pool-a")) == 2 and ready(fallback_name(name)) == 1, "the mix Ready")
    second = mix.apply_spot_mix(split)
    assert second.own == 0 and kube.apps.read_namespaced_deployment(name, REF.namespace).spec.replicas == 0
