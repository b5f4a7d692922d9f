"""ApplyTokenQuotas keeps the month's usage itself (issue 33): a Prometheus that remembers only a
day (15 by default; a month needs 31) still cuts a tenant off once the month's tokens reach the
quota, because each run reads only the tokens since the last one and adds them to the usage the
policy carries. Time-skipping server, stub cluster and a stub Prometheus with that retention."""

from __future__ import annotations

import copy
import json
import uuid
from datetime import datetime, timedelta

from temporalio import activity
from temporalio.worker import Worker

from workflows.core.traffic_policy import QUOTA_FIELDS, merged_policy
from workflows.quotas import contract
from workflows.quotas.policy import QuotaInput
from workflows.quotas.workflow import ApplyTokenQuotas, QuotaResult, month_start

RETENTION = timedelta(days=1)
RATE = 1000.0  # acme's tokens an hour
QUOTA = 60_000  # reached after 60 h: more than the retention holds


class Cluster:
    """The route's BackendTrafficPolicy, and a Prometheus that forgets after RETENTION."""

    def __init__(self) -> None:
        self.policy: dict | None = None
        self.first_read: datetime | None = None

    def tokens_between(self, start: datetime, end: datetime) -> float:
        """acme's increase over [start, end] as Prometheus answers it: traffic from the first read
        on, and nothing older than RETENTION before ``end``."""
        assert self.first_read is not None
        start = max(start, end - RETENTION, self.first_read)
        return max(0.0, (end - start).total_seconds() / 3600 * RATE)

    def activities(self) -> list:
        @activity.defn(name="read_month_tokens")
        async def read_month_tokens(req: contract.MonthTokensInput) -> contract.TenantTokens:
            if self.first_read is None:
                self.first_read = req.end
            return contract.TenantTokens(tokens={"acme": self.tokens_between(req.month_start, req.end)})

        @activity.defn(name="apply_quota_policy")
        async def apply_quota_policy(req: contract.QuotaPolicyInput) -> contract.AppliedQuotaPolicy:
            body = merged_policy(self.policy, req.body, QUOTA_FIELDS)
            outcome = "created" if self.policy is None else ("unchanged" if body == self.policy else "updated")
            self.policy = copy.deepcopy(body)
            return contract.AppliedQuotaPolicy(name="llm/chat-traffic", outcome=outcome)

        found = [read_month_tokens, apply_quota_policy]
        if hasattr(contract.QuotaActivities, "read_month_usage"):

            @activity.defn(name="read_month_usage")
            async def read_month_usage(req: contract.MonthUsageInput) -> contract.MonthUsageFound:
                return contract.MonthUsageFound(annotations=((self.policy or {}).get("metadata") or {}).get("annotations") or {})

            found.append(read_month_usage)
        if hasattr(contract.QuotaActivities, "apply_tenant_auth"):

            @activity.defn(name="apply_tenant_auth")
            async def apply_tenant_auth(req: contract.TenantAuthInput) -> contract.AppliedTenantAuth:
                self.auth = req.body
                return contract.AppliedTenantAuth(name="llm/chat-tenant-auth", outcome="unchanged")

            found.append(apply_tenant_auth)
        return found


QUOTAS = QuotaInput.model_validate(
    {"quotas": {"namespace": "llm", "route": "chat", "tenants": [{"name": "acme", "tokens_per_minute": 20000, "monthly_tokens": QUOTA}]}}
)


async def test_the_month_usage_outlives_prometheus_retention(time_skipping_env):
    env, cluster = time_skipping_env, Cluster()
    queue = f"quotas-{uuid.uuid4().hex[:6]}"
    results: list[tuple[datetime, QuotaResult]] = []
    async with Worker(env.client, task_queue=queue, workflows=[ApplyTokenQuotas], activities=cluster.activities()):
        for _ in range(30):  # every 3 hours for 90 hours, as the schedule would (every 5 minutes)
            started = await env.client.start_workflow(
                ApplyTokenQuotas.run, QUOTAS, id=f"token-quotas/llm/chat/{uuid.uuid4().hex[:6]}", task_queue=queue,
            )
            # awaited through a handle of its own: the run takes no virtual time (the environment's
            # handles would skip time meanwhile), only env.sleep moves the clock
            result = await env.client.get_workflow_handle(started.id, result_type=QuotaResult).result()
            results.append((await env.get_current_time(), result))
            await env.sleep(timedelta(hours=3))
    assert cluster.first_read is not None
    now, last = results[-1]
    since = max(cluster.first_read, month_start(now))  # a month turning during the test starts again
    expected = (now - since).total_seconds() / 3600 * RATE
    assert abs(last.month_tokens["acme"] - expected) <= RATE, (last.month_tokens, expected)
    if expected >= QUOTA + RATE:
        assert last.over_quota == ["acme"]
    usage = json.loads(cluster.policy["metadata"]["annotations"]["tideplane.io/month-token-usage"])
    assert usage["tokens"] == last.month_tokens
    assert last.tenant_auth == "llm/chat-tenant-auth unchanged"
    assert cluster.auth["spec"]["apiKeyAuth"]["forwardClientIDHeader"] == "x-tenant"
