"""End to end against the sandbox: a tenant over its monthly token quota is refused at the gateway
while another is served, and metering shows the tokens per tenant.

Requests go through the fleet's gateway, which counts every answer's tokens per tenant in
``gen_ai_client_token_usage``; the real Prometheus scrapes them; ``tideplane quotas apply``'s
code (workers/cli/quotas.py) keeps the schedules and runs ApplyTokenQuotas in a worker with the
production activities (the worker's own kubeconfig and RBAC), which writes the Envoy Gateway
BackendTrafficPolicy the fleet's gateway then enforces.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
from kubernetes import client, config
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.clients.kube import KubeClient
from activities.clients.prometheus import PrometheusClient
from activities.quotas.quota_activities import QuotaActivities
from tests.sandbox_fixtures import create_logical_deployment, wait_for
from workers.cli.reports import run_now
from workers.cli.quotas import apply
from workflows.core import naming
from workflows.quotas.policy import QuotaFile
from workflows.quotas.workflow import ApplyTokenQuotas, TokenMetering, TokenMeteringInput

NAMESPACE = "e2e-quotas"
BETA_MONTHLY = 10  # tokens: a few requests spend it


KEYS = {"acme": "sk-e2e-acme", "beta": "sk-e2e-beta"}


def ask(fleet: str, tenant: str, claims: str | None = None) -> httpx.Response:
    """A request with ``tenant``'s API key (once the SecurityPolicy is there, the key names the tenant),
    and an x-tenant header claiming ``claims`` (default: the tenant itself)."""
    return httpx.post(f"{fleet}/gateway/{NAMESPACE}/chat/v1/completions",
                      headers={"x-tenant": claims or tenant, "Authorization": f"Bearer {KEYS[tenant]}"},
                      json={"prompt": "hello there", "max_tokens": 4}, timeout=30)


def tenant_tokens(prometheus: PrometheusClient) -> dict[str, float]:
    rows = prometheus.instant("e2e", f'sum by (tenant) (gen_ai_client_token_usage_sum{{namespace="{NAMESPACE}"}})')
    return {row["metric"]["tenant"]: float(row["value"][1]) for row in rows}


async def test_a_tenant_over_its_monthly_quota_is_refused_while_another_is_served(sandbox):
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    create_logical_deployment(api, NAMESPACE, "chat", "1.0.0", "llama-3-8b", replicas=1)
    client.CoreV1Api(api).create_namespaced_secret(NAMESPACE, {"metadata": {"name": "chat-tenant-keys"}, "stringData": KEYS})
    fleet, prometheus = sandbox.urls["fleet"], PrometheusClient(sandbox.urls["prometheus"])
    await wait_for(lambda: ask(fleet, "acme").status_code == 200 and ask(fleet, "beta").status_code == 200, 30,
                   "both tenants answered through the gateway")
    # Prometheus must see each tenant's series before the tokens that count: increase() starts at the first sample.
    first = await wait_for(lambda: (seen := tenant_tokens(prometheus)).keys() >= {"acme", "beta"} and seen, 10, "the tenants' series")
    for _ in range(3):
        assert ask(fleet, "beta").status_code == 200
    await wait_for(lambda: tenant_tokens(prometheus).get("beta", 0) - first["beta"] >= BETA_MONTHLY, 10, "beta's tokens scraped")

    quotas = QuotaFile(namespace=NAMESPACE, route="chat", tenants=[
        {"name": "acme", "tokens_per_minute": 100_000, "monthly_tokens": 1_000_000},
        {"name": "beta", "tokens_per_minute": 100_000, "monthly_tokens": BETA_MONTHLY}], default_tokens_per_minute=8)
    temporal = await Client.connect(sandbox.env["TEMPORAL_ADDRESS"], data_converter=pydantic_data_converter)
    queue = f"quotas-e2e-{uuid.uuid4().hex[:6]}"
    activities = QuotaActivities(KubeClient.connect(sandbox.sandbox.worker_kubeconfig), prometheus)
    schedule_ids = [naming.quota_schedule_id(NAMESPACE, "chat"), naming.TOKEN_METERING_SCHEDULE_ID]
    try:
        async with Worker(temporal, task_queue=queue, workflows=[ApplyTokenQuotas, TokenMetering],
                          activities=[activities.read_month_tokens, activities.read_month_usage, activities.apply_quota_policy,
                                      activities.apply_tenant_auth, activities.read_token_usage],
                          activity_executor=ThreadPoolExecutor(2)):
            schedules, applied = await apply(temporal, quotas, queue, every_minutes=5, timeout=30)
            again_schedules, again = await apply(temporal, quotas, queue, every_minutes=5, timeout=30)
            metered = await run_now(temporal, TokenMetering.run, TokenMeteringInput(window_hours=1), "token-metering", queue, 30)
    finally:
        for sid in schedule_ids:
            await temporal.get_schedule_handle(sid).delete()

    assert [outcome for _, outcome in schedules] == ["created", "created"]
    assert (applied.policy, applied.outcome, applied.over_quota) == (f"{NAMESPACE}/chat-backend-traffic", "created", ["beta"])
    assert applied.month_tokens["beta"] >= BETA_MONTHLY, "the month's tokens are read from Prometheus"
    assert [outcome for _, outcome in again_schedules] == ["unchanged", "unchanged"] and again.outcome == "unchanged"
    policy = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "gateway.envoyproxy.io", "v1alpha1", NAMESPACE, "backendtrafficpolicies", "chat-backend-traffic")
    assert [r["limit"]["requests"] for r in policy["spec"]["rateLimit"]["global"]["rules"]] == [100_000, 0, 8]

    refused = await wait_for(lambda: (r := ask(fleet, "beta")).status_code == 429 and r, 10, "beta refused by the gateway")
    assert refused.json()["message"].startswith(f"tenant beta is over its monthly token quota ({BETA_MONTHLY} tokens)")
    assert ask(fleet, "acme").status_code == 200, "another tenant is still served"
    assert applied.tenant_auth == f"{NAMESPACE}/chat-tenant-auth created"
    spoofed = ask(fleet, "beta", claims="acme")  # beta's key, acme's name: the gateway counts it as beta (issue 33)
    assert spoofed.status_code == 429 and spoofed.json()["message"].startswith("tenant beta is over its monthly token quota")
    assert ask(fleet, "acme").status_code == 200, "acme's quota did not move"

    def anonymous() -> httpx.Response:  # no API key: refused before any rate limit (issue 33)
        return httpx.post(f"{fleet}/gateway/{NAMESPACE}/chat/v1/completions", headers={"x-tenant": "acme"},
                          json={"prompt": "hello there", "max_tokens": 4}, timeout=30)

    refused_anonymous = anonymous()
    assert refused_anonymous.status_code == 401, refused_anonymous.text

    rows = {(r.tenant, r.model, r.version, r.request_class): r for r in metered.rows}
    beta = rows[("beta", "llama-3-8b", "1.0.0", "default")]
    assert beta.input_tokens > 0 and beta.output_tokens > 0
    assert ("acme", "llama-3-8b", "1.0.0", "default") in rows
    assert "| beta | llama-3-8b | 1.0.0 | default |" in metered.markdown
