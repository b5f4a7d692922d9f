"""What ApplyTokenQuotas and TokenMetering ask of Prometheus and the cluster: the contract
``QuotaActivities`` (activities/quotas/quota_activities.py) and its I/O. Activity names are a stable API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field
from temporalio import activity

from workflows.quotas.metering import TokenQueries, UsageSample


class MonthTokensInput(BaseModel):
    namespace: str
    route: str
    query: str = Field(description="PromQL template with ${namespace}, ${route}, ${window}; returns the label tenant")
    month_start: datetime = Field(description="start of the window: the month's start, or the last run's count")
    end: datetime


class TenantTokens(BaseModel):
    tokens: dict[str, float] = Field(default_factory=dict, description="tenant -> tokens over [month_start, end]")


class MonthUsageInput(BaseModel):
    namespace: str
    route: str


class MonthUsageFound(BaseModel):
    annotations: dict[str, str] = Field(default_factory=dict, description="the route's policy's annotations ({}: no policy)")


class QuotaPolicyInput(BaseModel):
    body: dict = Field(description="the BackendTrafficPolicy (workflows/quotas/policy.py)")


class AppliedQuotaPolicy(BaseModel):
    name: str = Field(description="NAMESPACE/NAME of the BackendTrafficPolicy")
    outcome: Literal["created", "updated", "unchanged"]


class TenantAuthInput(BaseModel):
    namespace: str
    route: str
    body: dict | None = Field(description="the SecurityPolicy (workflows/quotas/policy.py); None: take tideplane's away")


class AppliedTenantAuth(BaseModel):
    name: str = Field(description="NAMESPACE/NAME of the SecurityPolicy")
    outcome: Literal["created", "updated", "unchanged", "deleted", "absent"]


class UsageInput(BaseModel):
    end: datetime
    window_seconds: int = Field(gt=0)
    queries: TokenQueries = Field(default_factory=TokenQueries)


class UsageSamples(BaseModel):
    samples: list[UsageSample]


class QuotaActivities:
    """Metered tokens from Prometheus, and the gateway's rate-limit policy in the cluster (activities/quotas/quota_activities.py)."""

    @activity.defn(name="read_month_tokens")
    def read_month_tokens(self, req: MonthTokensInput) -> TenantTokens:
        """Pinned to ``req.end``, so a retry reads the same numbers."""
        raise NotImplementedError

    @activity.defn(name="read_month_usage")
    def read_month_usage(self, req: MonthUsageInput) -> MonthUsageFound:
        """The annotations of the route's BackendTrafficPolicy, where the month's usage is carried."""
        raise NotImplementedError

    @activity.defn(name="apply_quota_policy")
    def apply_quota_policy(self, req: QuotaPolicyInput) -> AppliedQuotaPolicy:
        """Idempotent: a policy already as wanted is left alone."""
        raise NotImplementedError

    @activity.defn(name="apply_tenant_auth")
    def apply_tenant_auth(self, req: TenantAuthInput) -> AppliedTenantAuth:
        """Idempotent: the route's SecurityPolicy made as wanted (or tideplane's deleted); one that
        tideplane did not write is refused, not replaced."""
        raise NotImplementedError

    @activity.defn(name="read_token_usage")
    def read_token_usage(self, req: UsageInput) -> UsageSamples:
        """Tokens per tenant, model, version, class and type over the window ending at ``req.end``."""
        raise NotImplementedError
