"""Token metering and quotas: tokens per tenant from Prometheus, the gateway's rate-limit policy in the cluster.

The policy is Envoy Gateway's ``BackendTrafficPolicy``; a cluster without its CRD gets a
non-retryable error saying so (install Envoy Gateway, or infra/k8s/envoy-gateway/crds.yaml).
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, fail, read_or_none
from activities.clients.prometheus import PrometheusClient, render
from workflows.quotas import activities as contract
from workflows.quotas.activities import (
    AppliedQuotaPolicy,
    MonthTokensInput,
    QuotaPolicyInput,
    TenantTokens,
    UsageInput,
    UsageSamples,
)
from workflows.quotas.metering import UsageSample

# (group, version) literal here, not imported: the RBAC scanner (tests/unit/test_k8s_manifests.py) reads it.
POLICY_API = ("gateway.envoyproxy.io", "v1alpha1")


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

    @activity.defn(name="apply_quota_policy")
    def apply_quota_policy(self, req: QuotaPolicyInput) -> AppliedQuotaPolicy:
        body = req.body
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        self.kube.require_namespace(ns)
        c = self.kube.custom
        try:
            have = read_or_none(c.get_namespaced_custom_object, *POLICY_API, ns, "backendtrafficpolicies", name)
            if have is None:
                c.create_namespaced_custom_object(*POLICY_API, ns, "backendtrafficpolicies", body, _request_timeout=API_TIMEOUT)
                return AppliedQuotaPolicy(name=f"{ns}/{name}", outcome="created")
            meta = have["metadata"]
            labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
            wanted = body["metadata"]
            if (have.get("spec") == body["spec"] and labels.items() >= wanted["labels"].items()
                    and annotations.items() >= wanted["annotations"].items()):
                return AppliedQuotaPolicy(name=f"{ns}/{name}", outcome="unchanged")
            meta = {**meta, "labels": {**labels, **wanted["labels"]}, "annotations": {**annotations, **wanted["annotations"]}}
            c.replace_namespaced_custom_object(*POLICY_API, ns, "backendtrafficpolicies", name, {**have, "spec": body["spec"], "metadata": meta},
                                               _request_timeout=API_TIMEOUT)
            return AppliedQuotaPolicy(name=f"{ns}/{name}", outcome="updated")
        except ApiException as exc:
            if exc.status == 404:
                raise ApplicationError(
                    f"BackendTrafficPolicy {ns}/{name}: the cluster does not serve {'/'.join(POLICY_API)} backendtrafficpolicies "
                    "(Envoy Gateway's CRDs are not installed)", non_retryable=True) from None
            fail(exc, f"BackendTrafficPolicy {ns}/{name}")

    @activity.defn(name="read_token_usage")
    def read_token_usage(self, req: UsageInput) -> UsageSamples:
        promql = render("usage", req.queries.usage, {"window": f"{req.window_seconds}s"})
        rows = _vector(self.prometheus.instant("usage", promql, req.end.timestamp()), "usage")
        return UsageSamples(samples=[UsageSample(labels=labels, tokens=max(0.0, value)) for labels, value in rows])
