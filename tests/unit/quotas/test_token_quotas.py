"""Token quotas and metering: the gateway policy tideplane writes, how the sandbox gateway enforces
it and counts tokens, and the daily usage table."""

import json
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from infra.sandbox.ratelimit import Admission, TokenGate
from workflows.quotas.metering import UsageSample, render_markdown, tabulate
from workflows.quotas.policy import QuotaFile, over_quota, quota_policy
from workflows.quotas.workflow import month_start

QUOTAS = QuotaFile(namespace="llm-serving", route="chat", tenants=[
    {"name": "acme", "tokens_per_minute": 100, "monthly_tokens": 10_000},
    {"name": "beta", "tokens_per_minute": 50, "monthly_tokens": 1_000}])


def test_one_rule_per_tenant_costed_in_the_answers_tokens():
    policy = quota_policy(QUOTAS, {"acme": 5_000})
    assert (policy["apiVersion"], policy["kind"]) == ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy")
    assert policy["metadata"]["name"] == "chat-backend-traffic"
    assert policy["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "chat"}]
    acme, beta, _default = policy["spec"]["rateLimit"]["global"]["rules"]
    assert acme["clientSelectors"] == [{"headers": [{"name": "x-tenant", "type": "Exact", "value": "acme"}]}]
    assert acme["limit"] == {"requests": 100, "unit": "Minute"} and beta["limit"]["requests"] == 50
    assert acme["cost"]["request"] == {"from": "Number", "number": 0}
    assert acme["cost"]["response"]["metadata"] == {"namespace": "io.envoy.ai_gateway", "key": "llm_total_token"}
    assert json.loads(policy["metadata"]["annotations"]["tideplane.io/monthly-token-quotas"]) == {"acme": 10_000, "beta": 1_000}


def test_a_tenant_at_its_monthly_quota_gets_a_limit_of_zero():
    used = {"acme": 9_999, "beta": 1_000}
    assert over_quota(QUOTAS, used) == ["beta"]
    policy = quota_policy(QUOTAS, used)
    acme, beta, _default = policy["spec"]["rateLimit"]["global"]["rules"]
    assert beta["limit"]["requests"] == 0 and beta["cost"] == {"request": {"from": "Number", "number": 1}}
    assert acme["limit"]["requests"] == 100
    assert policy["metadata"]["annotations"]["tideplane.io/over-monthly-quota"] == "beta"
    assert quota_policy(QUOTAS, used) == policy, "same input, same object: applying again changes nothing"


def test_the_file_refuses_a_tenant_twice_and_names_the_field():
    with pytest.raises(ValidationError, match="each tenant once"):
        QuotaFile(namespace="ns", route="chat", tenants=[{"name": "a", "tokens_per_minute": 1, "monthly_tokens": 1}] * 2)
    with pytest.raises(ValidationError, match="tenants.0.tokens_per_minute"):
        QuotaFile(namespace="ns", route="chat", tenants=[{"name": "a", "tokens_per_minute": 0, "monthly_tokens": 1}])


def test_quotas_are_per_calendar_month_utc():
    assert month_start(datetime(2026, 12, 17, 13, 5, tzinfo=timezone.utc)) == datetime(2026, 12, 1, tzinfo=timezone.utc)


def test_the_sandbox_gateway_refuses_a_tenant_at_its_rate_until_the_window_turns():
    gate, policies = TokenGate(), [quota_policy(QUOTAS, {})]
    beta = {"X-Tenant": "beta"}
    first = gate.admit(policies, "llm-serving", beta, now=0.0)
    assert isinstance(first, Admission)
    gate.answered(first, {"version": "1.0.0"}, beta, prompt_tokens=30, completion_tokens=20)  # 50: beta's rate
    refused = gate.admit(policies, "llm-serving", beta, now=59.0)
    assert refused == ("rate limit reached: 50 tokens per Minute for x-tenant=beta "
                       "(BackendTrafficPolicy llm-serving/chat-backend-traffic)")
    assert isinstance(gate.admit(policies, "llm-serving", {"x-tenant": "acme"}, now=59.0), Admission)
    assert isinstance(gate.admit(policies, "llm-serving", beta, now=60.0), Admission), "a new minute"


def test_the_sandbox_gateway_refuses_a_tenant_over_its_monthly_quota_naming_it():
    gate, policies = TokenGate(), [quota_policy(QUOTAS, {"beta": 1_200})]
    refused = gate.admit(policies, "llm-serving", {"x-tenant": "beta"}, now=0.0)
    assert refused.startswith("tenant beta is over its monthly token quota (1000 tokens)")
    assert isinstance(gate.admit(policies, "llm-serving", {"x-tenant": "acme"}, now=0.0), Admission)


def test_the_sandbox_gateway_counts_tokens_per_tenant_version_and_class():
    gate = TokenGate()
    admitted = gate.admit([], "ns", {}, now=0.0)
    labels = {"gen_ai_request_model": "llama", "version": "1.0.0"}
    gate.answered(admitted, labels, {"x-tenant": "acme", "x-request-class": "batch"}, 7, 3)
    gate.answered(admitted, labels, {"x-tenant": "acme", "x-request-class": "batch"}, 5, 4)
    gate.answered(admitted, labels, {}, 1, 1)
    series = {(s[0]["tenant"], s[0]["request_class"], s[0]["gen_ai_token_type"]): s[1:] for s in gate.series()}
    assert series[("acme", "batch", "input")] == (12, 2) and series[("acme", "batch", "output")] == (7, 2)
    assert series[("anonymous", "default", "input")] == (1, 1)


def test_usage_rows_put_input_and_output_side_by_side():
    base = {"tenant": "acme", "gen_ai_request_model": "llama", "version": "1.0.0", "request_class": "realtime"}
    rows = tabulate([UsageSample(labels={**base, "gen_ai_token_type": "output"}, tokens=40),
                     UsageSample(labels={**base, "gen_ai_token_type": "input"}, tokens=100),
                     UsageSample(labels={**base, "tenant": "beta", "gen_ai_token_type": "input"}, tokens=9)])
    assert [(r.tenant, r.input_tokens, r.output_tokens) for r in rows] == [("acme", 100, 40), ("beta", 9, 0)]
    assert "| acme | llama | 1.0.0 | realtime | 100 | 40 |" in render_markdown(rows, "day")


def test_a_bad_quota_file_is_refused_naming_the_field(tmp_path):
    from workers.cli.quotas import QuotaFileError, load_quota_file

    path = tmp_path / "quotas.yaml"
    path.write_text("namespace: llm-serving\nroute: chat\ntenants:\n  - {name: acme, tokens_per_minute: 10, monthly_tokens: -1}\n")
    with pytest.raises(QuotaFileError, match=r"tenants\.0\.monthly_tokens: Input should be greater than 0"):
        load_quota_file(path)


def test_the_month_usage_is_carried_and_starts_again_when_the_month_turns():
    from datetime import datetime, timedelta, timezone

    from workflows.quotas.policy import MONTH_USAGE_ANNOTATION, carried, next_usage, usage_from

    t0 = datetime(2026, 12, 30, 12, tzinfo=timezone.utc)
    first = next_usage(None, *carried(None, t0), {"acme": 500.0}, t0)
    assert (first.month, first.tokens) == ("2026-12", {"acme": 500.0})
    since, base = carried(usage_from({MONTH_USAGE_ANNOTATION: first.model_dump_json()}), t0 + timedelta(minutes=5))
    assert (since, base) == (t0, {"acme": 500.0})  # only the five minutes since are read
    quiet = next_usage(first, since, base, {"acme": 0.0}, t0 + timedelta(minutes=5))
    assert quiet is first  # nothing used: the record (and the policy) stays as it was
    later = next_usage(first, since, base, {"acme": 20.0, "bolt": 3.0}, t0 + timedelta(minutes=10))
    assert later.tokens == {"acme": 520.0, "bolt": 3.0} and later.through == t0 + timedelta(minutes=10)
    january = datetime(2027, 1, 1, 0, 5, tzinfo=timezone.utc)
    assert carried(later, january) == (datetime(2027, 1, 1, tzinfo=timezone.utc), {})  # a new month counts afresh
    assert usage_from({MONTH_USAGE_ANNOTATION: "not json"}) is None and usage_from({}) is None


def test_a_request_without_a_known_tenant_is_limited_by_the_default_rule():
    """Without the tenant header (or with a name the file does not list) a request used to match no
    rule and was unlimited (issue 33): the last rule takes every such request, sharing
    ``default_tokens_per_minute`` (1,000 unless the file says otherwise; null turns it off)."""
    policy = quota_policy(QUOTAS, {})
    *_, default = policy["spec"]["rateLimit"]["global"]["rules"]
    assert default["clientSelectors"] == [{"headers": [
        {"name": "x-tenant", "type": "Exact", "value": "acme", "invert": True},
        {"name": "x-tenant", "type": "Exact", "value": "beta", "invert": True}]}]
    assert default["limit"] == {"requests": 1000, "unit": "Minute"}

    gate = TokenGate()
    for caller in ({}, {"x-tenant": "nobody"}):
        first = gate.admit([policy], "llm-serving", caller, now=0.0)
        assert isinstance(first, Admission), first
        gate.answered(first, {"version": "1.0.0"}, caller, prompt_tokens=600, completion_tokens=400)
        refused = gate.admit([policy], "llm-serving", caller, now=30.0)
        assert refused == ("rate limit reached: 1000 tokens per Minute for callers without a known x-tenant"
                           " (BackendTrafficPolicy llm-serving/chat-backend-traffic)"), refused
        gate = TokenGate()
    assert isinstance(gate.admit([policy], "llm-serving", {"x-tenant": "acme"}, now=0.0), Admission)
    off = QuotaFile.model_validate({**QUOTAS.model_dump(), "default_tokens_per_minute": None})
    assert len(quota_policy(off, {})["spec"]["rateLimit"]["global"]["rules"]) == 2


def test_the_tenant_comes_from_the_api_key_not_the_header():
    """tenant_from: api-key (default) writes Envoy Gateway's apiKeyAuth on the route: the key's client ID
    (the Secret's data key, the tenant) replaces the tenant header; header keeps the old trust."""
    from workflows.quotas.policy import tenant_auth_policy

    quotas = QuotaFile(namespace="llm-serving", route="chat", tenants=[{"name": "acme", "tokens_per_minute": 10, "monthly_tokens": 100}])
    policy = tenant_auth_policy(quotas)
    assert policy["kind"] == "SecurityPolicy" and policy["metadata"]["name"] == "chat-tenant-auth"
    assert policy["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "chat"}]
    assert policy["spec"]["apiKeyAuth"] == {
        "credentialRefs": [{"group": "", "kind": "Secret", "name": "chat-tenant-keys"}],
        "extractFrom": [{"headers": ["Authorization"]}], "forwardClientIDHeader": "x-tenant", "sanitize": True}
    assert tenant_auth_policy(quotas.model_copy(update={"tenant_from": "header"})) is None


def test_a_spoofed_tenant_header_does_not_move_another_tenants_quota():
    """The sandbox gateway, as Envoy Gateway: the route's SecurityPolicy turns the API key into the tenant
    header before the rate limits run. beta sending x-tenant: acme is counted as beta; no key or a
    wrong key is 401; the key never reaches the engine."""
    import base64

    from infra.sandbox.apikeys import authenticate
    from workflows.quotas.policy import tenant_auth_policy

    quotas = QuotaFile(namespace="llm-serving", route="chat", default_tokens_per_minute=None, tenants=[
        {"name": "acme", "tokens_per_minute": 50, "monthly_tokens": 10_000},
        {"name": "beta", "tokens_per_minute": 50, "monthly_tokens": 10_000}])
    auth = tenant_auth_policy(quotas)
    secrets = {("llm-serving", "chat-tenant-keys"): {"data": {
        "acme": base64.b64encode(b"key-acme").decode(), "beta": base64.b64encode(b"key-beta").decode()}}}
    policies, gate = [quota_policy(quotas, {})], TokenGate()

    def send(headers: dict, now: float = 0.0):
        caller = authenticate(auth, secrets, headers)
        if isinstance(caller, tuple):
            return caller
        admitted = gate.admit(policies, "llm-serving", caller, now)
        if isinstance(admitted, str):
            return 429, admitted
        gate.answered(admitted, {"route": "chat"}, caller, 40, 20)  # 60 tokens: past a 50 a minute rate
        return 200, caller

    status, forwarded = send({"Authorization": "Bearer key-beta", "x-tenant": "acme"})
    assert status == 200 and forwarded["x-tenant"] == "beta" and "Authorization" not in forwarded
    assert send({"authorization": "Bearer key-beta", "X-Tenant": "acme"})[0] == 429, "beta's own minute is spent"
    assert send({"Authorization": "Bearer key-acme"})[0] == 200, "acme's quota did not move"
    assert send({"x-tenant": "acme"}) == (401, "Client authentication failed: no API key in Authorization "
                                                 "(SecurityPolicy llm-serving/chat-tenant-auth)")
    assert send({"Authorization": "Bearer key-acmf", "x-tenant": "acme"})[0] == 401
    assert send({"Authorization": "Bearer key-acme"}, now=0.0)[0] == 429, "acme spent its own minute"
    tenants = {dict(labels)["tenant"]: tokens for labels, tokens, _ in gate.series() if dict(labels)["gen_ai_token_type"] == "input"}
    assert tenants == {"beta": 40, "acme": 40}
    assert authenticate(auth, {}, {"Authorization": "Bearer key-acme"})[0] == 500, "a missing Secret serves no one"
