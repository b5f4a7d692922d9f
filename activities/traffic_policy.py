"""Writes a writer's fields into the one Envoy Gateway BackendTrafficPolicy of an HTTPRoute
(workflows/traffic_policy.py): read, merge, create or replace with the resourceVersion read (a 409
re-reads and merges again: ``retry_on_conflict``), then delete the per-writer objects of the names used before.

A cluster without the CRD gets a non-retryable error saying so (install Envoy Gateway, or
infra/k8s/envoy-gateway/crds.yaml).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, fail, read_or_none, retry_on_conflict
from workflows.naming import LABEL_MANAGED_BY, MANAGED_BY
from workflows.traffic_policy import legacy_policy_names, merged_policy

# (group, version) literal here, not imported: the RBAC scanner (tests/unit/test_k8s_manifests.py) reads it.
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

    legacy = [old for old_name in legacy_policy_names(route)
              if (old := read_or_none(custom.get_namespaced_custom_object, *POLICY_API, ns, POLICY_PLURAL, old_name)) is not None
              and (old["metadata"].get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGED_BY]

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
        old_name = old["metadata"]["name"]
        try:
            custom.delete_namespaced_custom_object(*POLICY_API, ns, POLICY_PLURAL, old_name, _request_timeout=API_TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                fail(exc, f"BackendTrafficPolicy {ns}/{old_name}")
    return outcome
