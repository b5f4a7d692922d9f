"""Writes a writer's fields into the one Envoy Gateway BackendTrafficPolicy of an HTTPRoute
(workflows/core/traffic_policy.py): read, merge, create or replace with the resourceVersion read (a 409
re-reads and merges again: ``retry_on_conflict``), then delete the per-writer objects of the names used before.
A writer that stops takes its fields out again the same way, deleting the object (precondition: the
resourceVersion read) once nothing but its target is left.

A cluster without the CRD gets a non-retryable error saying so (install Envoy Gateway, or
infra/k8s/envoy-gateway/crds.yaml).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, fail, read_or_none, retry_on_conflict
from workflows.core.naming import LABEL_MANAGED_BY, MANAGED_BY, traffic_policy_name
from workflows.core.traffic_policy import legacy_policy_names, merged_policy, without_writer

# (group, version) literal here, not imported: the RBAC scanner (tests/unit/worker/test_k8s_manifests.py) reads it.
POLICY_API = ("gateway.envoyproxy.io", "v1alpha1")
POLICY_PLURAL = "backendtrafficpolicies"


def apply_traffic_policy(kube: KubeClient, wanted: dict, owns: Iterable[str]) -> Literal["created", "updated", "unchanged"]:
    """Set the ``owns`` fields of ``wanted`` (the whole policy as this writer sees it) in the route's
    shared policy, keeping every other field as found; adopt and delete tideplane's old per-writer objects."""
    ns, name = wanted["metadata"]["namespace"], wanted["metadata"]["name"]
    route = wanted["spec"]["targetRefs"][0]["name"]
    what = f"BackendTrafficPolicy {ns}/{name}"
    custom = kube.custom

    def crd_missing() -> ApplicationError:
        return ApplicationError(f"{what}: the cluster does not serve {'/'.join(POLICY_API)} {POLICY_PLURAL} "
                                "(Envoy Gateway's CRDs are not installed)", non_retryable=True)

    legacy = tideplanes(kube, ns, legacy_policy_names(route))

    def write() -> Literal["created", "updated", "unchanged"]:
        current = read_or_none(custom.get_namespaced_custom_object, *POLICY_API, ns, POLICY_PLURAL, name)
        body = merged_policy(current, wanted, owns, legacy)
        try:
            if current is None:
                custom.create_namespaced_custom_object(*POLICY_API, ns, POLICY_PLURAL, body, _request_timeout=API_TIMEOUT)
                return "created"
            if body != current:  # replaced with the resourceVersion read: the other writer's change is a 409
                custom.replace_namespaced_custom_object(*POLICY_API, ns, POLICY_PLURAL, name, body, _request_timeout=API_TIMEOUT)
                return "updated"
            return "unchanged"
        except ApiException as exc:
            if exc.status == 404:
                raise crd_missing() from None
            raise

    outcome = retry_on_conflict(what, write)
    for old in legacy:  # after the write: the route is never without its limits
        delete_policy(kube, ns, old["metadata"]["name"])
    return outcome


def remove_traffic_policy_fields(
    kube: KubeClient, namespace: str, route: str, owns: Iterable[str], annotations: Iterable[str] = (), legacy_name: str | None = None,
) -> Literal["deleted", "updated", "unchanged"]:
    """Take the ``owns`` fields and ``annotations`` out of the route's shared policy, keeping every
    other field as found, and delete the object once only its target is left; the writer's object of
    the name used before (``legacy_name``, if tideplane's) goes too, or the other writer would adopt
    its fields back. Idempotent: a policy with nothing of the writer's left reads "unchanged"."""
    owns, annotations = tuple(owns), tuple(annotations)
    name = traffic_policy_name(route)
    custom = kube.custom

    def remove() -> Literal["deleted", "updated", "unchanged"]:
        current = read_or_none(custom.get_namespaced_custom_object, *POLICY_API, namespace, POLICY_PLURAL, name)
        if current is None:  # none (or no such CRD): nothing of the writer's to take out
            return "unchanged"
        body = without_writer(current, owns, annotations)
        if body is None:  # deleted only as read: a field another writer added since is a 409, re-read
            preconditions = client.V1Preconditions(resource_version=current["metadata"].get("resourceVersion"))
            delete_policy(kube, namespace, name, client.V1DeleteOptions(preconditions=preconditions))
            return "deleted"
        if body != current:
            custom.replace_namespaced_custom_object(*POLICY_API, namespace, POLICY_PLURAL, name, body, _request_timeout=API_TIMEOUT)
            return "updated"
        return "unchanged"

    outcome = retry_on_conflict(f"BackendTrafficPolicy {namespace}/{name}", remove)
    for old in tideplanes(kube, namespace, [legacy_name] if legacy_name else []):
        delete_policy(kube, namespace, old["metadata"]["name"])
    return outcome


def tideplanes(kube: KubeClient, namespace: str, names: Iterable[str]) -> list[dict]:
    """Those of the named policies that exist and that tideplane wrote (labelled managed-by it)."""
    return [policy for name in names
            if (policy := read_or_none(kube.custom.get_namespaced_custom_object, *POLICY_API, namespace, POLICY_PLURAL, name)) is not None
            and (policy["metadata"].get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGED_BY]


def delete_policy(kube: KubeClient, namespace: str, name: str, options: client.V1DeleteOptions | None = None) -> None:
    """Delete a policy; already gone is done. A 409 (precondition unmet) is raised as it came, by
    ``fail``, for the caller's re-read."""
    try:
        kube.custom.delete_namespaced_custom_object(*POLICY_API, namespace, POLICY_PLURAL, name, _request_timeout=API_TIMEOUT, body=options)
    except ApiException as exc:
        if exc.status != 404:
            fail(exc, f"BackendTrafficPolicy {namespace}/{name}")
