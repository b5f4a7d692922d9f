"""Token metering and quotas: tokens per tenant from Prometheus, the gateway's rate-limit policy in the cluster.

The rate limits live in the route's one Envoy Gateway ``BackendTrafficPolicy``, shared with the
scaling loop's queue limit (activities/core/traffic_policy.py).
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import KubeClient, read_or_none
from activities.clients.prometheus import PrometheusClient, render
from activities.core.traffic_policy import POLICY_API, POLICY_PLURAL, apply_traffic_policy
from workflows.quotas import contract
from workflows.quotas.contract import (
    AppliedQuotaPolicy,
    MonthTokensInput,
    MonthUsageFound,
    MonthUsageInput,
    QuotaPolicyInput,
    TenantTokens,
    UsageInput,
    UsageSamples,
)
from workflows.quotas.metering import UsageSample
from workflows.core.naming import traffic_policy_name
from workflows.core.traffic_policy import QUOTA_FIELDS



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

    @activity.defn(name="read_token_usage")
    def read_token_usage(self, req: UsageInput) -> UsageSamples:
        promql = render("usage", req.queries.usage, {"window": f"{req.window_seconds}s"})
        rows = _vector(self.prometheus.instant("usage", promql, req.end.timestamp()), "usage")
        return UsageSamples(samples=[UsageSample(labels=labels, tokens=max(0.0, value)) for labels, value in rows])
