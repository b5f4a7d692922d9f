"""The queue limit and the token quotas share one BackendTrafficPolicy per route, each writing only its own fields."""

from __future__ import annotations

from activities.scaling.scaling_activities import queue_limit_policy
from workflows.core.naming import DeploymentRef, traffic_policy_name
from workflows.quotas.policy import QuotaFile, quota_policy
from workflows.scaling.queue_limit import QueueLimit
from workflows.core.traffic_policy import QUEUE_LIMIT_FIELDS, QUOTA_FIELDS, merged_policy, without_writer

QUOTAS = QuotaFile(namespace="llm-serving", route="chat", tenants=[{"name": "acme", "tokens_per_minute": 100, "monthly_tokens": 10_000}])
LIMIT = queue_limit_policy(DeploymentRef(namespace="llm-serving", name="chat"), QueueLimit(max_pending_requests=7, retry_after_seconds=2))


def test_both_writers_name_the_same_policy_on_the_route():
    assert LIMIT["metadata"]["name"] == quota_policy(QUOTAS, {})["metadata"]["name"] == traffic_policy_name("chat")


def test_each_writer_keeps_the_others_fields():
    with_quotas = merged_policy(None, quota_policy(QUOTAS, {}), QUOTA_FIELDS)
    current = {**with_quotas, "metadata": {**with_quotas["metadata"], "resourceVersion": "7"}}
    both = merged_policy(current, LIMIT, QUEUE_LIMIT_FIELDS)
    assert both["spec"]["rateLimit"] == with_quotas["spec"]["rateLimit"]
    assert both["spec"]["circuitBreaker"] == {"maxPendingRequests": 7}
    assert both["metadata"]["resourceVersion"] == "7"  # replaced as read: a concurrent write is a 409
    assert both["metadata"]["annotations"].keys() >= {"tideplane.io/retry-after-seconds", "tideplane.io/monthly-token-quotas"}

    tighter = quota_policy(QUOTAS, {"acme": 10_000})  # acme cut off: the quotas writer rewrites only rateLimit
    again = merged_policy(both, tighter, QUOTA_FIELDS)
    assert again["spec"]["rateLimit"] == tighter["spec"]["rateLimit"]
    assert again["spec"]["circuitBreaker"] == both["spec"]["circuitBreaker"]
    assert again["spec"]["responseOverride"] == both["spec"]["responseOverride"]
    assert merged_policy(again, tighter, QUOTA_FIELDS) == again  # nothing moved: nothing to write


def test_a_field_the_writer_no_longer_sends_is_removed_and_only_that():
    both = merged_policy(merged_policy(None, LIMIT, QUEUE_LIMIT_FIELDS), quota_policy(QUOTAS, {}), QUOTA_FIELDS)
    no_override = {**LIMIT, "spec": {k: v for k, v in LIMIT["spec"].items() if k != "responseOverride"}}
    out = merged_policy(both, no_override, QUEUE_LIMIT_FIELDS)
    assert "responseOverride" not in out["spec"] and "rateLimit" in out["spec"]


def test_the_old_per_writer_objects_are_adopted():
    old_quotas = {**quota_policy(QUOTAS, {}), "metadata": {**quota_policy(QUOTAS, {})["metadata"], "name": "chat-token-quotas"}}
    old_limit = {**LIMIT, "spec": {**LIMIT["spec"], "circuitBreaker": {"maxPendingRequests": 3}},
                 "metadata": {**LIMIT["metadata"], "name": "chat-queue-limit"}}
    out = merged_policy(None, LIMIT, QUEUE_LIMIT_FIELDS, [old_limit, old_quotas])
    assert out["metadata"]["name"] == "chat-backend-traffic"
    assert out["spec"]["rateLimit"] == old_quotas["spec"]["rateLimit"]  # the quotas survive the move
    assert out["spec"]["circuitBreaker"] == {"maxPendingRequests": 7}  # the writer's own fields are its new ones
    assert out["metadata"]["annotations"]["tideplane.io/monthly-token-quotas"] == '{"acme": 10000}'


def test_a_writer_that_stops_takes_out_only_its_own_fields_and_annotations():
    both = merged_policy(merged_policy(None, LIMIT, QUEUE_LIMIT_FIELDS), quota_policy(QUOTAS, {}), QUOTA_FIELDS)
    out = without_writer(both, QUEUE_LIMIT_FIELDS, ["tideplane.io/retry-after-seconds"])
    assert set(out["spec"]) == {"targetRefs", "rateLimit"} and out["spec"]["rateLimit"] == both["spec"]["rateLimit"]
    assert set(out["metadata"]["annotations"]) == set(both["metadata"]["annotations"]) - {"tideplane.io/retry-after-seconds"}
    assert "circuitBreaker" in both["spec"], "the object read is left as it was"
    assert without_writer(out, QUEUE_LIMIT_FIELDS) == out  # nothing of the writer's left: nothing to write
    assert without_writer(out, QUOTA_FIELDS) is None  # only the target left: delete it
    foreign = {**out, "spec": {**out["spec"], "timeout": {"http": {"requestTimeout": "60s"}}}}
    assert without_writer(foreign, QUOTA_FIELDS)["spec"] == {"targetRefs": out["spec"]["targetRefs"], "timeout": foreign["spec"]["timeout"]}
