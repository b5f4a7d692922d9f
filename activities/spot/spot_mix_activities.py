"""``SpotMixActivities``: what a scaling loop with a spot mix reads of the spot pools (their Auto
Scaling groups) and writes to the cluster (a Deployment per pool, the on-demand base claim, the
total on the version)."""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.aws import AwsClient
from activities.clients.kube import API_TIMEOUT, KubeClient, fail, read_or_none
from activities.core.deployments import version_replicas
from activities.spot.fallback_deployments import as_dict, mix_manifest, write_fallback
from workflows.core import naming
from workflows.spot import contract
from workflows.spot.contract import AppliedSpotMix, ApplySpotMixInput, SpotDomainsInput, SpotDomainsNow
from workflows.spot.mix import MIX_CLAIMANT, MIX_TARGET_ANNOTATION, DomainNow


class SpotMixActivities(contract.SpotMixActivities):
    """One instance per worker, thread-safe."""

    def __init__(self, kube: KubeClient, aws: AwsClient) -> None:
        self._kube = kube
        self._aws = aws

    @activity.defn(name="read_spot_domains")
    def read_spot_domains(self, req: SpotDomainsInput) -> SpotDomainsNow:
        """A pool whose group may not grow (MaxSize 0: capacity withdrawn) is unavailable; its room is MaxSize nodes."""
        out = SpotDomainsNow()
        for d in req.domains:
            group = self._aws.auto_scaling_group(d.pool)
            out.domains.append(DomainNow(pool=d.pool, available=group["MaxSize"] > 0, capacity=group["MaxSize"] * d.replicas_per_node))
        return out

    @activity.defn(name="apply_spot_mix")
    def apply_spot_mix(self, req: ApplySpotMixInput) -> AppliedSpotMix:
        """Idempotent: every write sets a count. The versioned Deployment keeps the pod template and
        records the total; its own replicas go down (to 0 at the end: every replica is in a pool's
        Deployment or on-demand) only by what the pools and the on-demand base already hold Ready, so
        a version placed into a mix (one just promoted) never serves from nothing while they start."""
        ref, apps = req.deployment, self._kube.apps
        name = ref.versioned(req.version)
        original = as_dict(self._kube, read_or_none(apps.read_namespaced_deployment, name, ref.namespace))
        if original is None:
            raise ApplicationError(f"Deployment {ref.namespace}/{name} not found", non_retryable=True)
        written: dict[str, int] = {}
        for pool, replicas in sorted(req.spot.items()):
            body = mix_manifest(original, pool, replicas)
            current = read_or_none(apps.read_namespaced_deployment, body["metadata"]["name"], ref.namespace)
            try:
                if current is None:
                    if replicas:
                        apps.create_namespaced_deployment(ref.namespace, body, _request_timeout=API_TIMEOUT)
                else:
                    apps.patch_namespaced_deployment_scale(
                        body["metadata"]["name"], ref.namespace, {"spec": {"replicas": replicas}}, _request_timeout=API_TIMEOUT
                    )
            except ApiException as exc:
                fail(exc, f"spot mix Deployment {ref.namespace}/{body['metadata']['name']}")
            written[body["metadata"]["name"]] = replicas
        key = naming.DeploymentRef(namespace=ref.namespace, name=name)

        def base(claims: dict[str, int]) -> dict[str, int]:
            return {k: v for k, v in claims.items() if k != MIX_CLAIMANT} | ({MIX_CLAIMANT: req.on_demand} if req.on_demand else {})

        fallback = write_fallback(self._kube, key, base, req.capacity_type)
        written[fallback.name] = fallback.replicas
        current = read_or_none(apps.read_namespaced_deployment, name, ref.namespace)
        if current is None:
            raise ApplicationError(f"Deployment {ref.namespace}/{name} not found", non_retryable=True)
        own_now = current.spec.replicas or 0
        elsewhere = version_replicas(self._kube, current).ready - ((current.status.ready_replicas if current.status else None) or 0)
        own = max(0, min(own_now, req.total - elsewhere))
        patch = {"metadata": {"annotations": {MIX_TARGET_ANNOTATION: str(req.total)}}, "spec": {"replicas": own}}
        try:
            apps.patch_namespaced_deployment(name, ref.namespace, patch, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            fail(exc, f"Deployment {ref.namespace}/{name}")
        written[name] = own
        activity.logger.info("spot mix of %s/%s: total %d, %s", ref.namespace, name, req.total, written)
        return AppliedSpotMix(deployments=written, own=own)
