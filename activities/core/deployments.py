"""A logical deployment's objects in the cluster as every capability reads them: its versions'
Deployments (``deployment_state``), its HTTPRoute (``read_route``, ``list_routes``, ``edit_route_rules``),
the serving container's name, and the refusal when another workflow owns them (``owned_elsewhere``).

The rollout writes these objects (activities/rollout/); the scaling loop reads a deployment's
versions to scale the one with the most traffic, the registry lists the versions routes still
send traffic to, and the adapter rollout edits its rules of the route.
"""

from __future__ import annotations

import json

from temporalio.exceptions import ApplicationError

from activities.clients.kube import (
    API_TIMEOUT,
    KubeClient,
    container_named,
    label_selector,
    read_or_none,
    retry_on_conflict,
    selector,
)
from workflows.core import naming
from workflows.core.lora import lora_modules
from workflows.core.naming import DEPLOYMENT_OWNED, DeploymentRef
from workflows.core.versions import DeploymentState, VersionInfo, VersionReplicas

ROUTE_API = ("gateway.networking.k8s.io", "v1")
CONTAINER = "server"  # the serving container of every version's pods (activities/rollout/serving_pods.py)


def read_route(kube: KubeClient, ref: DeploymentRef) -> dict | None:
    """The logical deployment's HTTPRoute (None: not created yet)."""
    return read_or_none(kube.custom.get_namespaced_custom_object, *ROUTE_API, ref.namespace, "httproutes", ref.name)


def list_routes(kube: KubeClient, namespace: str | None = None) -> list[dict]:
    """Every HTTPRoute in ``namespace`` (None: all namespaces); ApiException as the client raises it."""
    if namespace is None:
        return kube.custom.list_cluster_custom_object(*ROUTE_API, "httproutes", _request_timeout=API_TIMEOUT)["items"]
    return kube.custom.list_namespaced_custom_object(
        *ROUTE_API, namespace, "httproutes", _request_timeout=API_TIMEOUT
    )["items"]


def deployment_state(kube: KubeClient, ref: DeploymentRef) -> DeploymentState:
    """The versions of a logical deployment in the cluster, their replicas and route weights
    (``describe_deployment``; the scaling loop's ``get_scale`` reads the same)."""
    kube.require_namespace(ref.namespace)
    deployments = kube.apps.list_namespaced_deployment(
        ref.namespace, label_selector=label_selector(selector(ref.name)), _request_timeout=API_TIMEOUT
    ).items
    route = read_route(kube, ref)
    weights = _route_weights(route)
    versions = []
    for dep in sorted(deployments, key=lambda d: d.metadata.name):
        labels = dep.metadata.labels or {}
        version = labels.get(naming.LABEL_VERSION)
        if version is None:
            continue
        held = version_replicas(kube, dep)
        versions.append(
            VersionInfo(
                version=version,
                model=labels.get(naming.LABEL_MODEL, ""),
                replicas=held.total,  # a spot mix's total, not its versioned Deployment's 0
                ready_replicas=held.ready,
                route_weight=weights.get(dep.metadata.name, 0),  # the name the cluster holds
                lora_modules=lora_modules(getattr(container_named(dep.spec.template.spec.containers, CONTAINER), "args", None) or []),
            )
        )
    return DeploymentState(route_exists=route is not None, versions=versions, stable_version=stable_version(route, versions, ref))


def stable_version(route: dict | None, versions: list[VersionInfo], ref: DeploymentRef) -> str | None:
    """The stable version: the one the rollout recorded on the route (``tideplane.io/stable-version``)
    while it still carries traffic; on a route that records none (written before the record), the one
    version with the most traffic; a tie there is refused, naming it, never settled by a sort order."""
    serving = [v for v in versions if v.route_weight > 0]
    recorded = ((route or {}).get("metadata", {}).get("annotations") or {}).get(naming.ANNOTATION_STABLE_VERSION)
    if recorded is not None and any(v.version == recorded for v in serving):
        return recorded
    if not serving:
        return None
    top = max(v.route_weight for v in serving)
    tied = sorted(v.version for v in serving if v.route_weight == top)
    if len(tied) > 1:
        raise ApplicationError(
            f"HTTPRoute {ref} sends equal traffic to {' and '.join(tied)} and records no stable version"
            f" ({naming.ANNOTATION_STABLE_VERSION}): annotate the route with the version that is stable",
            type="StableUnknown",
            non_retryable=True,
        )
    return tied[0]


def spot_claims(annotations: dict | None) -> dict[str, int]:
    """The fallback Deployment's claims, claimant -> replicas (``tideplane.io/spot-claims``)."""
    raw = (annotations or {}).get(naming.ANNOTATION_SPOT_CLAIMS)
    try:
        claims = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): int(v) for k, v in claims.items() if int(v) > 0} if isinstance(claims, dict) else {}


def version_replicas(kube: KubeClient, dep) -> VersionReplicas:
    """How many replicas the version of the versioned Deployment ``dep`` has, by pool: the one
    answer ``deployment_state``, ``get_scale``, ``scale_version`` and the spot mix read."""
    ns, name = dep.metadata.namespace, dep.metadata.name
    mixes = kube.apps.list_namespaced_deployment(
        ns, label_selector=label_selector({naming.LABEL_SPOT_MIX_FOR: name}), _request_timeout=API_TIMEOUT
    ).items
    fallback = read_or_none(kube.apps.read_namespaced_deployment, naming.fallback_name(name), ns)
    target = (dep.metadata.annotations or {}).get(naming.ANNOTATION_SPOT_MIX_TARGET)
    return VersionReplicas(
        version=(dep.metadata.labels or {}).get(naming.LABEL_VERSION, ""),
        own=dep.spec.replicas or 0,
        pools={_pool_of(m): m.spec.replicas or 0 for m in sorted(mixes, key=lambda m: m.metadata.name)},
        on_demand_base=spot_claims(fallback.metadata.annotations if fallback else None).get(naming.SPOT_MIX_CLAIMANT, 0),
        mix_total=int(target) if target is not None else None,
        ready=sum(_ready(d) for d in [dep, *mixes, *([fallback] if fallback else [])]),
    )


def read_version_replicas(kube: KubeClient, ref: DeploymentRef, version: str) -> VersionReplicas:
    """``version_replicas`` of one version by name; a version with no Deployment has none."""
    dep = read_or_none(kube.apps.read_namespaced_deployment, ref.versioned(version), ref.namespace)
    return VersionReplicas(version=version) if dep is None else version_replicas(kube, dep)


def scale_down_spot_mix(kube: KubeClient, ref: DeploymentRef, version: str) -> VersionReplicas:
    """Take a version's spot mix down (a retirement): every pool's Deployment to 0, the mix's
    on-demand base claim off its fallback (SpotReclaim's claims stay theirs), its total annotation
    off the versioned Deployment. Idempotent; what the version held before."""
    name, ns, apps = ref.versioned(version), ref.namespace, kube.apps
    dep = read_or_none(apps.read_namespaced_deployment, name, ns)
    if dep is None:
        return VersionReplicas(version=version)
    held = version_replicas(kube, dep)
    for mix in apps.list_namespaced_deployment(
        ns, label_selector=label_selector({naming.LABEL_SPOT_MIX_FOR: name}), _request_timeout=API_TIMEOUT
    ).items:
        if mix.spec.replicas:
            apps.patch_namespaced_deployment_scale(mix.metadata.name, ns, {"spec": {"replicas": 0}}, _request_timeout=API_TIMEOUT)

    def drop_base() -> None:
        fallback = read_or_none(apps.read_namespaced_deployment, naming.fallback_name(name), ns)
        claims = spot_claims(fallback.metadata.annotations if fallback else None)
        if naming.SPOT_MIX_CLAIMANT not in claims:
            return
        del claims[naming.SPOT_MIX_CLAIMANT]
        fallback.metadata.annotations = {**fallback.metadata.annotations, naming.ANNOTATION_SPOT_CLAIMS: json.dumps(claims, sort_keys=True)}
        fallback.spec.replicas = sum(claims.values())
        apps.replace_namespaced_deployment(fallback.metadata.name, ns, fallback, _request_timeout=API_TIMEOUT)

    retry_on_conflict(f"fallback Deployment of {ns}/{name}", drop_base)
    if held.mixed:
        patch = {"metadata": {"annotations": {naming.ANNOTATION_SPOT_MIX_TARGET: None}}}
        apps.patch_namespaced_deployment(name, ns, patch, _request_timeout=API_TIMEOUT)
    return held


def _pool_of(mix) -> str:
    labels = (mix.spec.template.metadata.labels if mix.spec.template.metadata else None) or {}
    return labels.get(naming.LABEL_SPOT_POOL, mix.metadata.name)


def _ready(dep) -> int:
    return (dep.status.ready_replicas if dep.status else None) or 0


def owned_elsewhere(what: str, held: str, owner: str) -> ApplicationError:
    """The non-retryable refusal when another workflow owns a deployment's objects."""
    return ApplicationError(
        f"{what} is owned by {held} ({naming.ANNOTATION_OWNER}); {owner} refused: one rollout and one scaling loop"
        f" per deployment. Stop {held}, or remove the annotation if that workflow is gone",
        type=DEPLOYMENT_OWNED,
        non_retryable=True,
    )


def _route_weights(route: dict | None) -> dict[str, int]:
    """Service name -> weight in the route's first rule (the rule tideplane manages)."""
    rules = (route or {}).get("spec", {}).get("rules") or []
    refs = rules[0].get("backendRefs", []) if rules else []
    return {r["name"]: int(r.get("weight", 1)) for r in refs}


def edit_route_rules(kube: KubeClient, ref: DeploymentRef, edit, must_exist: bool = True) -> None:
    """Read the HTTPRoute, apply ``edit`` to its rules, replace it when they changed (conflicts retried);
    no route: refused when ``must_exist``, else nothing to edit."""
    what = f"HTTPRoute {ref}"

    def write() -> None:
        route = read_route(kube, ref)
        if route is None:
            if must_exist:
                raise ApplicationError(f"no {what}: deploy the base model with a ModelRollout first", non_retryable=True)
            return
        rules = route.setdefault("spec", {}).setdefault("rules", [])
        wanted = edit(rules)
        if wanted == rules:
            return
        route["spec"]["rules"] = wanted
        kube.custom.replace_namespaced_custom_object(*ROUTE_API, ref.namespace, "httproutes", ref.name, route, _request_timeout=API_TIMEOUT)

    retry_on_conflict(what, write)
