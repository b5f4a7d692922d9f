"""A logical deployment's objects in the cluster as every capability reads them: its versions'
Deployments (``deployment_state``), its HTTPRoute (``read_route``, ``list_routes``, ``edit_route_rules``),
the serving container's name, and the refusal when another workflow owns them (``owned_elsewhere``).

The rollout writes these objects (activities/rollout/); the scaling loop reads a deployment's
versions to scale the one with the most traffic, the registry lists the versions routes still
send traffic to, and the adapter rollout edits its rules of the route.
"""

from __future__ import annotations

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
from workflows.core.versions import DeploymentState, VersionInfo

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
        versions.append(
            VersionInfo(
                version=version,
                model=labels.get(naming.LABEL_MODEL, ""),
                replicas=dep.spec.replicas or 0,
                ready_replicas=(dep.status.ready_replicas if dep.status else None) or 0,
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
