"""The Deployments spot failover and the spot mix write beside a version's own: the on-demand
fallback ``<name>-od``, whose replicas are the sum of per-instance claims (an annotation, so a
retried or repeated claim converges instead of adding twice), and one spot Deployment per pool of a
spot mix."""

from __future__ import annotations

import copy
import json
from typing import Callable

from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, read_or_none, retry_on_conflict
from activities.core.deployments import spot_claims
from workflows.core import naming
from workflows.spot.contract import FallbackClaims


FALLBACK_FOR = naming.LABEL_FALLBACK_FOR  # label: on the fallback Deployment and its pods
CLAIMS_ANNOTATION = naming.ANNOTATION_SPOT_CLAIMS  # JSON {instance-id: replicas}
POOL_BASE_TAG = "tideplane.io/spot-base-capacity"
MIX_FOR = naming.LABEL_SPOT_MIX_FOR  # label: on a spot mix Deployment and its pods (the versioned name)
MIX_POOL = naming.LABEL_SPOT_POOL  # label: on a spot mix Deployment's pods, its node pool
fallback_name = naming.fallback_name


def claims_of(deployment: dict | None) -> dict[str, int]:
    return spot_claims((deployment or {}).get("metadata", {}).get("annotations"))


def fallback_manifest(original: dict, claims: dict[str, int], capacity_type: str) -> dict:
    """The on-demand twin of a spot Deployment: same pods (so its Service routes to them), other nodes.

    The Deployment itself carries no app label, so it is never mistaken for a version of the
    logical deployment; its pods carry the serving labels plus ``tideplane.io/fallback-for``.
    """
    name, ns = original["metadata"]["name"], original["metadata"]["namespace"]
    template = copy.deepcopy(original["spec"]["template"])
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    labels[FALLBACK_FOR] = name
    spec = template.setdefault("spec", {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), naming.NODE_CAPACITY_TYPE: capacity_type}
    selector = {k: v for k, v in labels.items() if k in (naming.LABEL_APP, naming.LABEL_VERSION)} | {FALLBACK_FOR: name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": fallback_name(name),
            "namespace": ns,
            "labels": {naming.LABEL_MANAGED_BY: naming.MANAGED_BY, FALLBACK_FOR: name},
            "annotations": {CLAIMS_ANNOTATION: json.dumps(claims, sort_keys=True)},
        },
        "spec": {"replicas": sum(claims.values()), "selector": {"matchLabels": selector}, "template": template},
    }


def mix_name(name: str, pool: str) -> str:
    return f"{name[:40].rstrip('-')}-{pool[:22]}".rstrip("-")


def mix_manifest(original: dict, pool: str, replicas: int) -> dict:
    """The versioned Deployment's pods pinned to one spot node pool (a failure domain of the mix).

    Same serving labels (its Service routes to them, the loop counts them Ready) plus
    ``tideplane.io/spot-mix-for``; no ``tideplane.io/fallback-for``, so they count as spot.
    """
    name, ns = original["metadata"]["name"], original["metadata"]["namespace"]
    template = copy.deepcopy(original["spec"]["template"])
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    labels[MIX_FOR] = name
    spec = template.setdefault("spec", {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), naming.NODE_CAPACITY_TYPE: "spot", naming.NODE_POOL: pool}
    labels[MIX_POOL] = pool
    selector = {k: v for k, v in labels.items() if k in (naming.LABEL_APP, naming.LABEL_VERSION, MIX_FOR, MIX_POOL)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": mix_name(name, pool), "namespace": ns, "labels": {naming.LABEL_MANAGED_BY: naming.MANAGED_BY, MIX_FOR: name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": template},
    }


def _versioned(pod_labels: dict[str, str]) -> str | None:
    app, version = pod_labels.get(naming.LABEL_APP), pod_labels.get(naming.LABEL_VERSION)
    return naming.versioned_name(app, version) if app and version else None
def as_dict(kube: KubeClient, obj) -> dict | None:
    """A client object as the JSON the API server holds (None stays None)."""
    return None if obj is None else kube.api.sanitize_for_serialization(obj)


def write_fallback(
    kube: KubeClient, key: naming.DeploymentRef, update_claims: Callable[[dict[str, int]], dict[str, int]], capacity_type: str
) -> FallbackClaims:
    """Read-modify-write the fallback's claims with optimistic concurrency (resourceVersion)."""
    apps = kube.apps

    def write() -> FallbackClaims:
        original = as_dict(kube, read_or_none(apps.read_namespaced_deployment, key.name, key.namespace))
        if original is None:
            raise ApplicationError(f"Deployment {key.namespace}/{key.name} not found", non_retryable=True)
        current = as_dict(kube, read_or_none(apps.read_namespaced_deployment, fallback_name(key.name), key.namespace))
        claims = update_claims(claims_of(current))
        state = FallbackClaims(name=fallback_name(key.name), replicas=sum(claims.values()), claims=claims)
        if current is None and not claims:
            return state
        body = fallback_manifest(original, claims, capacity_type)
        if current is None:
            apps.create_namespaced_deployment(key.namespace, body, _request_timeout=API_TIMEOUT)
        else:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            apps.replace_namespaced_deployment(body["metadata"]["name"], key.namespace, body, _request_timeout=API_TIMEOUT)
        return state

    return retry_on_conflict(f"fallback Deployment for {key.namespace}/{key.name}", write)

