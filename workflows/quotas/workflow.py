"""ApplyTokenQuotas and TokenMetering: per-tenant token quotas at the gateway, and the day's tokens.

``tideplane quotas apply FILE`` keeps a Temporal Schedule (``token-quotas/<namespace>/<route>``,
every 5 minutes) that runs ApplyTokenQuotas with the file, and runs it once at once::

    temporal workflow start --type ApplyTokenQuotas --task-queue tideplane --workflow-id token-quotas/llm-serving/chat/manual \\
      --input '{"quotas": {"namespace": "llm-serving", "route": "chat", "tenants": [
                 {"name": "acme", "tokens_per_minute": 20000, "monthly_tokens": 50000000}]}}'

Each run reads every tenant's metered tokens since the last run from Prometheus and adds them to
the month's usage that the policy carries (``tideplane.io/month-token-usage``: a month's count never
needs Prometheus to keep 31 days), turns a tenant over its
monthly quota into a rate limit of 0 (workflows/quotas/policy.py) and writes the gateway's
BackendTrafficPolicy (unchanged when nothing moved). TokenMetering runs daily
(``token_metering_schedule``) or from ``tideplane quotas usage``; its result is the day's table.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from workflows.core import telemetry
    from workflows.core.daily_schedule import daily_schedule
    from workflows.quotas.contract import (
        MonthTokensInput, MonthUsageInput, QuotaActivities, QuotaPolicyInput, TenantAuthInput, UsageInput,
    )
    from workflows.quotas.metering import TokenQueries, TokenUsage, render_markdown, tabulate
    from workflows.core.naming import TOKEN_METERING_WORKFLOW_ID
    from workflows.quotas.policy import (
        QuotaInput, carried, month_start, next_usage, over_quota, policy_name, quota_policy, tenant_auth_name,
        tenant_auth_policy, usage_from,
    )

RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=30))


# Runs from before this patch read the whole month from Prometheus each time (needs 31 days of
# retention); newer ones read since the usage the policy carries (MONTH_USAGE_ANNOTATION) and add.
CARRY_USAGE_PATCH = "quota-usage-carried"
# Runs from before this patch left the tenant header as the client sent it; newer ones first write the
# route's SecurityPolicy that takes the tenant from the caller's API key (tenant_from: api-key).
TENANT_AUTH_PATCH = "tenant-auth"


class QuotaResult(BaseModel):
    policy: str = Field(description="NAMESPACE/NAME of the BackendTrafficPolicy")
    outcome: str = Field(description="created | updated | unchanged")
    over_quota: list[str] = Field(description="tenants refused until the month turns")
    month_tokens: dict[str, float] = Field(description="tenant -> tokens metered this month")
    tenant_auth: str = Field("", description="NAMESPACE/NAME of the SecurityPolicy and what was done: created | updated |"
                             " unchanged | deleted | absent ('': a run from before tenants were authenticated)")


@workflow.defn(name="ApplyTokenQuotas")
class ApplyTokenQuotas:
    @workflow.run
    async def run(self, input: QuotaInput) -> QuotaResult:
        q, now = input.quotas, workflow.now()
        usage, auth = None, ""
        if workflow.patched(TENANT_AUTH_PATCH):  # before the rate limits, so they never select on a client's claim
            done = await workflow.execute_activity_method(
                QuotaActivities.apply_tenant_auth, TenantAuthInput(namespace=q.namespace, route=q.route, body=tenant_auth_policy(q)),
                start_to_close_timeout=timedelta(seconds=60), retry_policy=RETRY,
                summary=f"SecurityPolicy {q.namespace}/{tenant_auth_name(q.route)}: tenant from {q.tenant_from}",
            )
            auth = f"{done.name} {done.outcome}"
        if workflow.patched(CARRY_USAGE_PATCH):
            found = await workflow.execute_activity_method(
                QuotaActivities.read_month_usage, MonthUsageInput(namespace=q.namespace, route=q.route),
                start_to_close_timeout=timedelta(seconds=60), retry_policy=RETRY,
                summary=f"the month's usage carried by {q.namespace}/{policy_name(q.route)}",
            )
            previous = usage_from(found.annotations)
            since, base = carried(previous, now)
        else:
            previous, since, base = None, month_start(now), {}
        read = await workflow.execute_activity_method(
            QuotaActivities.read_month_tokens,
            MonthTokensInput(namespace=q.namespace, route=q.route, query=input.month_tokens_query, month_start=since, end=now),
            start_to_close_timeout=timedelta(seconds=60), retry_policy=RETRY,
            summary=f"Prometheus: tokens per tenant on {q.namespace}/{q.route} since {since:%Y-%m-%d %H:%M} UTC",
        )
        if workflow.patched(CARRY_USAGE_PATCH):
            usage = next_usage(previous, since, base, read.tokens, now)
            used = usage
        else:
            used = read
        applied = await workflow.execute_activity_method(
            QuotaActivities.apply_quota_policy, QuotaPolicyInput(body=quota_policy(q, used.tokens, usage)),
            start_to_close_timeout=timedelta(seconds=60), retry_policy=RETRY,
            summary=f"BackendTrafficPolicy {q.namespace}/{policy_name(q.route)}",
        )
        cut_off = over_quota(q, used.tokens)
        for t in q.tenants:
            telemetry.tenant_tokens(workflow.metric_meter(), q.namespace, q.route, t.name, used.tokens.get(t.name, 0.0), t.monthly_tokens)
        rows = [f"| {t.name} | {used.tokens.get(t.name, 0):,.0f} | {t.monthly_tokens:,} | {t.tokens_per_minute:,} |"
                f" {'refused' if t.name in cut_off else 'served'} |" for t in q.tenants]
        workflow.set_current_details("\n".join([
            f"**{applied.name}** {applied.outcome}", *([f"tenant from {q.tenant_from}: **{auth}**"] if auth else []), "", "| tenant | tokens this month | monthly quota | tokens/min | |",
            "|---|--:|--:|--:|---|", *rows]))
        return QuotaResult(policy=applied.name, outcome=applied.outcome, over_quota=cut_off, month_tokens=used.tokens,
                           tenant_auth=auth)


class TokenMeteringInput(BaseModel):
    window_hours: float = Field(24, gt=0, le=24 * 31)
    end: datetime | None = Field(None, description="end of the window (default: when the workflow runs)")
    queries: TokenQueries = Field(default_factory=TokenQueries)


class TokenMeteringResult(BaseModel):
    start: datetime
    end: datetime
    rows: list[TokenUsage]
    markdown: str


@workflow.defn(name="TokenMetering")
class TokenMetering:
    """Reads the window's tokens from Prometheus once; the table is the result (replayed, not re-queried)."""

    @workflow.run
    async def run(self, input: TokenMeteringInput) -> TokenMeteringResult:
        end = input.end or workflow.now()
        window_seconds = max(1, round(input.window_hours * 3600))
        start = end - timedelta(seconds=window_seconds)
        usage = await workflow.execute_activity_method(
            QuotaActivities.read_token_usage, UsageInput(end=end, window_seconds=window_seconds, queries=input.queries),
            start_to_close_timeout=timedelta(minutes=2), retry_policy=RETRY,
            summary=f"Prometheus: tokens per tenant, version and class over {window_seconds / 3600:g} h",
        )
        rows = tabulate(usage.samples)
        markdown = render_markdown(rows, f"Tokens {start:%Y-%m-%d %H:%M} - {end:%Y-%m-%d %H:%M} UTC")
        workflow.set_current_details(markdown)
        return TokenMeteringResult(start=start, end=end, rows=rows, markdown=markdown)


def token_metering_schedule(input: TokenMeteringInput, task_queue: str, hour_utc: int = 0):
    """The daily schedule (``naming.TOKEN_METERING_SCHEDULE_ID``; ``tideplane quotas apply`` keeps it):
    with ``input.end`` unset each run records the 24 h before it."""
    return daily_schedule(TokenMetering.run, input, TOKEN_METERING_WORKFLOW_ID, task_queue, hour_utc)
