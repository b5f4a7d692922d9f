"""Token metering and quotas: tokens per tenant from Prometheus, the gateway's rate-limit policy in the cluster.

The rate limits live in the route's one Envoy Gateway ``BackendTrafficPolicy``, shared with the
scaling loop's queue limit (activities/core/traffic_policy.py).
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, read_or_none, retry_on_conflict
from activities.clients.prometheus import PrometheusClient, render
from activities.core.traffic_policy import POLICY_API, POLICY_PLURAL, apply_traffic_policy
from workflows.quotas import contract
from workflows.quotas.contract import (
    AppliedQuotaPolicy,
    AppliedTenantAuth,
    MonthTokensInput,
    MonthUsageFound,
    MonthUsageInput,
    QuotaPolicyInput,
    TenantAuthInput,
    TenantTokens,
    UsageInput,
    UsageSamples,
)
from workflows.quotas.metering import UsageSample
from workflows.core.naming import LABEL_MANAGED_BY, MANAGED_BY, traffic_policy_name
from workflows.core.traffic_policy import QUOTA_FIELDS
from workflows.quotas.policy import tenant_auth_name

# (group, version) literal here, not imported: the RBAC scanner (tests/unit/worker/test_k8s_manifests.py) reads it.
SECURITY_POLICY_API = ("gateway.envoyproxy.io", "v1alpha1")
SECURITY_POLICY_PLURAL = "securitypolicies"


def _vector(result: list, name: str) -> list[tuple[dict[str, str], float]]:
    if result and not (isinstance(result[0], dict) and "value" in result[0]):
        raise ApplicationError(f"token query {name!r}: expected a vector", non_retryable=True)
    return [(series["metric"], float(series["value"][1])) for series in result]


class QuotaActivities(contract.QuotaActivities):
    def __init__(self, kube: KubeClient, prometheus: PrometheusClient) -> None:
        self.kube = kube
        self.prometheus = prometheus

    @activity.defn(name="read_month_tokens")
    def read_month_tokens(self, req: MonthTokensInput) -> TenantTokens:
        seconds = max(1, int((req.end - req.month_start).total_seconds()))
        promql = render("month_tokens", req.query, {"namespace": req.namespace, "route": req.route, "window": f"{seconds}s"})  # rendered from a number
        tokens: dict[str, float] = {}
        for labels, value in _vector(self.prometheus.instant("month_tokens", promql, req.end.timestamp()), "month_tokens"):
            if "tenant" not in labels:
                raise ApplicationError(f"token query 'month_tokens' must return the label tenant; {labels} lacks it", non_retryable=True)
            tokens[labels["tenant"]] = tokens.get(labels["tenant"], 0.0) + value
        return TenantTokens(tokens=tokens)

    @activity.defn(name="read_month_usage")
    def read_month_usage(self, req: MonthUsageInput) -> MonthUsageFound:
        self.kube.require_namespace(req.namespace)
        policy = read_or_none(self.kube.custom.get_namespaced_custom_object, *POLICY_API, req.namespace, POLICY_PLURAL,
                              traffic_policy_name(req.route))
        return MonthUsageFound(annotations=((policy or {}).get("metadata") or {}).get("annotations") or {})

    @activity.defn(name="apply_quota_policy")
    def apply_quota_policy(self, req: QuotaPolicyInput) -> AppliedQuotaPolicy:
        """Write the rate limits into the route's BackendTrafficPolicy, keeping its queue limit."""
        ns, name = req.body["metadata"]["namespace"], req.body["metadata"]["name"]
        self.kube.require_namespace(ns)
        return AppliedQuotaPolicy(name=f"{ns}/{name}", outcome=apply_traffic_policy(self.kube, req.body, QUOTA_FIELDS))

    @activity.defn(name="apply_tenant_auth")
    def apply_tenant_auth(self, req: TenantAuthInput) -> AppliedTenantAuth:
        """The route's SecurityPolicy that takes the tenant from the caller's API key, as wanted."""
        ns, name = req.namespace, tenant_auth_name(req.route)
        what, custom = f"SecurityPolicy {ns}/{name}", self.kube.custom
        self.kube.require_namespace(ns)

        def write() -> str:
            current = read_or_none(custom.get_namespaced_custom_object, *SECURITY_POLICY_API, ns, SECURITY_POLICY_PLURAL, name)
            ours = current is not None and (current["metadata"].get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGED_BY
            if current is not None and not ours:
                raise ApplicationError(f"{what} exists and tideplane did not write it (no {LABEL_MANAGED_BY}={MANAGED_BY}"
                                       " label): delete it, or set tenant_from: header to keep your own", non_retryable=True)
            try:
                if req.body is None:
                    if current is None:
                        return "absent"
                    custom.delete_namespaced_custom_object(*SECURITY_POLICY_API, ns, SECURITY_POLICY_PLURAL, name,
                                                           _request_timeout=API_TIMEOUT)
                    return "deleted"
                if current is None:
                    custom.create_namespaced_custom_object(*SECURITY_POLICY_API, ns, SECURITY_POLICY_PLURAL, req.body,
                                                           _request_timeout=API_TIMEOUT)
                    return "created"
                if current.get("spec") == req.body["spec"] and current["metadata"].get("labels") == req.body["metadata"]["labels"]:
                    return "unchanged"
                body = {**req.body, "metadata": {**req.body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
                custom.replace_namespaced_custom_object(*SECURITY_POLICY_API, ns, SECURITY_POLICY_PLURAL, name, body,
                                                        _request_timeout=API_TIMEOUT)
                return "updated"
            except ApiException as exc:
                if exc.status == 404 and req.body is not None:
                    raise ApplicationError(f"{what}: the cluster does not serve {'/'.join(SECURITY_POLICY_API)} "
                                           f"{SECURITY_POLICY_PLURAL} (Envoy Gateway's CRDs are not installed)", non_retryable=True) from None
                if exc.status == 404:
                    return "absent"
                raise

        return AppliedTenantAuth(name=f"{ns}/{name}", outcome=retry_on_conflict(what, write))

    @activity.defn(name="read_token_usage")
    def read_token_usage(self, req: UsageInput) -> UsageSamples:
        promql = render("usage", req.queries.usage, {"window": f"{req.window_seconds}s"})
        rows = _vector(self.prometheus.instant("usage", promql, req.end.timestamp()), "usage")
        return UsageSamples(samples=[UsageSample(labels=labels, tokens=max(0.0, value)) for labels, value in rows])
