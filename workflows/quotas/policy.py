"""Per-tenant token quotas as the gateway's rate limiting, built from plain values (pure; unit-tested).

A quota file names the HTTPRoute tenants call and, per tenant, a token rate and a monthly token
quota. tideplane writes them into the route's one Envoy Gateway ``BackendTrafficPolicy``
(``gateway.envoyproxy.io/v1alpha1``, shared with the queue limit: workflows/core/traffic_policy.py): one global rate-limit rule per tenant,
selected by the tenant header (``x-tenant: acme``), whose cost is the tokens of each answer (Envoy
AI Gateway's ``io.envoy.ai_gateway``/``llm_total_token`` response metadata) and not the request,
so a tenant is refused (429) once its tokens within the minute reach its rate. A tenant whose
metered tokens this month reached its monthly quota gets a rule of limit 0 costing 1 per request:
every request is refused until the month turns (the next apply after the 1st lifts it) or the
quota is raised. The tenant header is the gateway's, not the client's: ``tenant_auth_policy`` writes the
route's ``SecurityPolicy`` that sets it from the caller's API key (``tenant_from: api-key``). The annotations say which tenants are cut off and why, for people and for the
sandbox gateway's refusal message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from workflows.core.naming import LABEL_MANAGED_BY, MANAGED_BY, traffic_policy_name

POLICY_API_VERSION = "gateway.envoyproxy.io/v1alpha1"
ROUTE_GROUP = "gateway.networking.k8s.io"
TENANT_HEADER = "x-tenant"
TOKEN_COST = {"from": "Metadata", "metadata": {"namespace": "io.envoy.ai_gateway", "key": "llm_total_token"}}
MONTHLY_QUOTAS_ANNOTATION = "tideplane.io/monthly-token-quotas"  # JSON {tenant: tokens}
OVER_QUOTA_ANNOTATION = "tideplane.io/over-monthly-quota"  # comma-separated tenants cut off this month
# JSON MonthUsage: the month's tokens per tenant so far, and up to when they were counted. Carried
# from run to run, so a month's usage never depends on Prometheus keeping 31 days (it keeps 15 by default).
MONTH_USAGE_ANNOTATION = "tideplane.io/month-token-usage"
USAGE_REFRESH = timedelta(hours=6)  # a quiet route's record still moves this often (short query windows)
QUOTAS_LABEL = "tideplane.io/token-quotas"  # the route whose quotas the object holds
API_KEY_HEADER = "Authorization"  # OpenAI clients send "Authorization: Bearer <key>"; the gateway strips "Bearer "

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class TenantQuota(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
                      description="the tenant header's value (also its Prometheus label)")
    tokens_per_minute: int = Field(gt=0, description="prompt + completion tokens a minute; more is answered 429")
    monthly_tokens: int = Field(gt=0, description="prompt + completion tokens a calendar month (UTC)")


class QuotaFile(BaseModel):
    """What ``tideplane quotas apply FILE`` reads: every tenant's quotas on one route."""

    namespace: str = Field(pattern=_DNS_LABEL, max_length=63)
    route: str = Field(pattern=_DNS_LABEL, max_length=50, description="the HTTPRoute tenants call")
    tenant_header: str = Field(TENANT_HEADER, pattern=r"^[A-Za-z0-9-]+$", description="the header naming the tenant")
    tenants: list[TenantQuota] = Field(min_length=1, max_length=256)
    default_tokens_per_minute: int | None = Field(
        1000, ge=0, description="tokens a minute all callers without a listed tenant share (null: unlimited, as before)"
    )
    tenant_from: Literal["api-key", "header"] = Field(
        "api-key", description="api-key: the gateway takes the tenant from the caller's API key (an Envoy Gateway SecurityPolicy"
        " written beside the rate limits) and overwrites any tenant header the client sent; header: the tenant header is"
        " trusted as it arrives (only behind a gateway of your own that sets it from an authenticated identity)"
    )
    api_keys_secret: str | None = Field(
        None, pattern=_DNS_LABEL, max_length=253,
        description="the Secret in the namespace holding one API key per tenant (data key: the tenant, value: its key);"
        " default <route>-tenant-keys",
    )
    api_key_header: str = Field(API_KEY_HEADER, pattern=r"^[A-Za-z0-9-]+$", description="the request header carrying the API key")

    @model_validator(mode="after")
    def _unique(self) -> QuotaFile:
        names = [t.name for t in self.tenants]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tenants: each tenant once, {twice} appear more than once")
        return self


class QuotaInput(BaseModel):
    """ApplyTokenQuotas' input: the file, and how to read a tenant's tokens this month."""

    quotas: QuotaFile
    month_tokens_query: str = Field(
        'sum by (tenant) (increase(gen_ai_client_token_usage_sum{namespace="${namespace}", route="${route}"}[${window}]))',
        description="PromQL template: tokens per tenant on the route since the month began (${window})",
    )


def policy_name(route: str) -> str:
    """The route's BackendTrafficPolicy, shared with the queue limit (workflows/core/traffic_policy.py)."""
    return traffic_policy_name(route)


def tenant_auth_name(route: str) -> str:
    """The route's Envoy Gateway SecurityPolicy that turns an API key into the tenant header."""
    return f"{route}-tenant-auth"


def api_keys_secret(quotas: QuotaFile) -> str:
    return quotas.api_keys_secret or f"{quotas.route}-tenant-keys"


def tenant_auth_policy(quotas: QuotaFile) -> dict | None:
    """The SecurityPolicy that makes the tenant an authenticated identity (None: ``tenant_from: header``).

    Envoy Gateway's ``apiKeyAuth``: a request whose ``api_key_header`` holds none of the Secret's keys
    is answered 401; an accepted one gets the key's client ID (the Secret's data key: the tenant) in
    the tenant header, replacing whatever the client sent there, and loses its key (``sanitize``)
    before the engine sees it. The rate-limit rules (``quota_policy``) then select on that header,
    so a caller counts against its own tenant whatever it claims."""
    if quotas.tenant_from != "api-key":
        return None
    return {
        "apiVersion": POLICY_API_VERSION, "kind": "SecurityPolicy",
        "metadata": {"name": tenant_auth_name(quotas.route), "namespace": quotas.namespace,
                     "labels": {LABEL_MANAGED_BY: MANAGED_BY, QUOTAS_LABEL: quotas.route}},
        "spec": {
            "targetRefs": [{"group": ROUTE_GROUP, "kind": "HTTPRoute", "name": quotas.route}],
            "apiKeyAuth": {
                "credentialRefs": [{"group": "", "kind": "Secret", "name": api_keys_secret(quotas)}],
                "extractFrom": [{"headers": [quotas.api_key_header]}],
                "forwardClientIDHeader": quotas.tenant_header,
                "sanitize": True,
            },
        },
    }


def over_quota(quotas: QuotaFile, used: Mapping[str, float]) -> list[str]:
    """The tenants whose tokens this month reached their monthly quota, sorted."""
    return sorted(t.name for t in quotas.tenants if used.get(t.name, 0.0) >= t.monthly_tokens)


class MonthUsage(BaseModel):
    """Each tenant's tokens this month, counted up to ``through`` (the policy's MONTH_USAGE_ANNOTATION)."""

    month: str = Field(description="YYYY-MM, UTC")
    through: datetime
    tokens: dict[str, float] = Field(default_factory=dict)


def month_of(now: datetime) -> str:
    return f"{now.year:04d}-{now.month:02d}"


def month_start(now: datetime) -> datetime:
    """Midnight UTC on the 1st of ``now``'s month (quotas are per calendar month, UTC)."""
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def usage_from(annotations: Mapping[str, str]) -> MonthUsage | None:
    """The usage the policy carries (None: none, or unreadable: then the month is counted afresh)."""
    try:
        return MonthUsage.model_validate_json(annotations[MONTH_USAGE_ANNOTATION])
    except (KeyError, ValueError):
        return None


def carried(previous: MonthUsage | None, now: datetime) -> tuple[datetime, dict[str, float]]:
    """From when to read tokens, and what this month already counted: since the record's
    ``through`` when it is this month's, else since the month began, from nothing."""
    if previous is not None and previous.month == month_of(now) and month_start(now) <= previous.through <= now:
        return previous.through, dict(previous.tokens)
    return month_start(now), {}


def next_usage(previous: MonthUsage | None, since: datetime, base: Mapping[str, float],
               read: Mapping[str, float], now: datetime) -> MonthUsage:
    """The record after a run that read ``read`` tokens per tenant over [since, now]. While nothing
    was used and the record is recent it stays as it was (the policy is left unchanged); the next
    read then covers the longer window, so nothing is counted twice or lost."""
    added = {tenant: value for tenant, value in read.items() if value > 0}
    kept_since = previous is not None and since == previous.through and now - since < USAGE_REFRESH
    if not added and kept_since:
        return previous
    tokens = dict(base)
    for tenant, value in added.items():
        tokens[tenant] = tokens.get(tenant, 0.0) + value
    return MonthUsage(month=month_of(now), through=now, tokens=dict(sorted(tokens.items())))


def quota_policy(quotas: QuotaFile, used: Mapping[str, float], usage: MonthUsage | None = None) -> dict:
    """The BackendTrafficPolicy for the file, given each tenant's tokens this month (and the record
    of them to carry to the next run)."""
    cut_off = set(over_quota(quotas, used))
    rules = []
    for tenant in quotas.tenants:
        selector = {"headers": [{"name": quotas.tenant_header, "type": "Exact", "value": tenant.name}]}
        if tenant.name in cut_off:
            rules.append({"clientSelectors": [selector], "limit": {"requests": 0, "unit": "Minute"},
                          "cost": {"request": {"from": "Number", "number": 1}}})
        else:
            rules.append({"clientSelectors": [selector], "limit": {"requests": tenant.tokens_per_minute, "unit": "Minute"},
                          "cost": {"request": {"from": "Number", "number": 0}, "response": TOKEN_COST}})
    if quotas.default_tokens_per_minute is not None:
        # every request whose header names no listed tenant (absent included: an inverted match of a
        # missing header holds), sharing one budget: no header is no way around the quotas
        unknown = [{"name": quotas.tenant_header, "type": "Exact", "value": t.name, "invert": True} for t in quotas.tenants]
        rules.append({"clientSelectors": [{"headers": unknown}],
                      "limit": {"requests": quotas.default_tokens_per_minute, "unit": "Minute"},
                      "cost": {"request": {"from": "Number", "number": 0}, "response": TOKEN_COST}})
    monthly = {t.name: t.monthly_tokens for t in quotas.tenants}
    return {
        "apiVersion": POLICY_API_VERSION, "kind": "BackendTrafficPolicy",
        "metadata": {
            "name": policy_name(quotas.route), "namespace": quotas.namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, QUOTAS_LABEL: quotas.route},
            "annotations": {MONTHLY_QUOTAS_ANNOTATION: json.dumps(monthly, sort_keys=True),
                            OVER_QUOTA_ANNOTATION: ",".join(sorted(cut_off)),
                            **({MONTH_USAGE_ANNOTATION: usage.model_dump_json()} if usage is not None else {})},
        },
        "spec": {
            "targetRefs": [{"group": ROUTE_GROUP, "kind": "HTTPRoute", "name": quotas.route}],
            "rateLimit": {"type": "Global", "global": {"rules": rules}},
        },
    }
