"""LoRA adapters' pure parts: the route rule, the gateway's model-name split, the simulated vLLM LoRA
API's answers and how the activities read them."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from activities.adapters.adapter_activities import lora_call_outcome
from infra.sandbox.gateway import MODEL_HEADER, backend_for, headers_set_by
from infra.sandbox.lora import LoraAdapters, lora_settings
from workflows.adapters.routing import (
    adapter_rule,
    served_name,
    with_adapter_module,
    with_adapter_rule,
)
from workflows.core.lora import (
    adapters_on,
    lora_modules,
    moved_adapter_rules,
    with_lora_modules,
)
from workflows.adapters.types import ADAPTER_QUERIES

DEFAULT = {"backendRefs": [{"name": "chat-v1-0-0", "port": 8000, "weight": 100}]}


def test_the_adapter_rule_splits_its_model_name_between_versions_on_the_base_service():
    rule = adapter_rule("sql-lora", "chat-v1-0-0", 8000, {served_name("sql-lora", "1.0.0"): 90, served_name("sql-lora", "1.1.0"): 10})
    route = {"spec": {"rules": with_adapter_rule([DEFAULT], "sql-lora", rule)}}
    assert route["spec"]["rules"][0] == DEFAULT, "the model rollout's rule stays first"
    draws = [backend_for(route, {MODEL_HEADER: "sql-lora"}, draw / 100) for draw in range(100)]
    served = [headers_set_by(b)[MODEL_HEADER] for b in draws]
    assert served.count("sql-lora-1.1.0") == 10 and served.count("sql-lora-1.0.0") == 90
    assert {b["name"] for b in draws} == {"chat-v1-0-0"}
    assert backend_for(route, {MODEL_HEADER: "llama"}) == DEFAULT["backendRefs"][0], "other models take the default rule"
    moved = adapter_rule("sql-lora", "chat-v1-0-0", 8000, {"sql-lora-1.0.0": 100})
    assert with_adapter_rule(route["spec"]["rules"], "sql-lora", moved) == [DEFAULT, moved], "replaced, not added twice"


def test_a_weight_zero_backend_takes_no_request():
    route = {"spec": {"rules": [{"backendRefs": [{"name": "new", "weight": 0}, {"name": "old", "weight": 100}]}]}}
    assert {backend_for(route, {}, d / 10)["name"] for d in range(10)} == {"old"}


def test_the_simulated_lora_api_answers_as_vllm():
    pod = {"spec": {"containers": [{"args": ["--model", "x", "--enable-lora"],
                                    "env": [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}]}]}}
    assert lora_settings(pod) == (True, True, {}) and lora_settings({"spec": {"containers": [{}]}}) == (False, False, {})
    lora = LoraAdapters(*lora_settings(pod))
    assert lora.load({"lora_name": "a", "lora_path": "/p"}) == (200, "Success: LoRA adapter 'a' added successfully.")
    status, body = lora.load({"lora_name": "a", "lora_path": "/p"})
    assert (status, body["type"]) == (400, "InvalidUserInput") and "has already been loaded" in body["message"]
    assert [c["id"] for c in lora.model_cards("llama")] == ["llama", "a"] and lora.serves("a", "llama")
    assert not lora.serves("b", "llama")
    assert lora.unload({"lora_name": "a"})[0] == 200
    status, body = lora.unload({"lora_name": "a"})
    assert (status, body["type"]) == (404, "NotFoundError") and "cannot be found" in body["message"]
    status, body = LoraAdapters(enabled=False, runtime_updating=True).load({"lora_name": "a", "lora_path": "/p"})
    assert status == 400 and "--enable-lora" in body["message"]


def test_repeated_calls_are_success_and_a_misconfigured_base_is_named():
    lora_call_outcome("load", 400, "The lora adapter 'a' has already been loaded.", "ns/p")
    lora_call_outcome("unload", 404, "The lora adapter 'a' cannot be found.", "ns/p")
    with pytest.raises(ApplicationError, match="add --enable-lora") as refused:
        lora_call_outcome("load", 400, "LoRA is not enabled. Use --enable-lora to enable LoRA.", "ns/p")
    assert refused.value.non_retryable
    with pytest.raises(ApplicationError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") as off:
        lora_call_outcome("load", 404, "Not Found", "ns/p")
    assert off.value.non_retryable
    with pytest.raises(ApplicationError) as busy:
        lora_call_outcome("load", 503, "overloaded", "ns/p")
    assert not busy.value.non_retryable, "a server error is retried"


def test_the_adapter_gate_queries_select_each_version_by_its_served_name():
    rendered = ADAPTER_QUERIES.error_rate.replace("${model}", "sql-lora").replace("${version}", "1.1.0")
    assert 'target_model_name="sql-lora-1.1.0"' in rendered
    assert "${stable_version}" in ADAPTER_QUERIES.stable_p99_latency


def test_lora_modules_are_read_as_vllm_parses_them_and_written_as_one_flag():
    args = ["--model", "/w", "--lora-modules", "a-1.0.0=/c/a/1.0.0", '{"name": "b-2.0.0", "path": "/c/b/2.0.0"}', "--enable-lora"]
    assert lora_modules(args) == {"a-1.0.0": "/c/a/1.0.0", "b-2.0.0": "/c/b/2.0.0"}
    assert lora_modules([*args, "--lora-modules", "c-1.0.0=/c"]) == {"c-1.0.0": "/c"}, "a repeated flag replaces the earlier one"
    promoted = with_adapter_module(lora_modules(args), "a", "1.1.0", "/c/a/1.1.0")
    assert promoted == {"a-1.1.0": "/c/a/1.1.0", "b-2.0.0": "/c/b/2.0.0"}, "the adapter's old version replaced, others kept"
    written = with_lora_modules(args, promoted)
    assert written == ["--model", "/w", "--enable-lora", "--lora-modules", "a-1.1.0=/c/a/1.1.0", "b-2.0.0=/c/b/2.0.0"]
    assert lora_modules(written) == promoted and with_lora_modules(written, {}) == ["--model", "/w", "--enable-lora"]
    assert with_adapter_module({"a-v2-1.0.0": "/x"}, "a", "1.0.0", "/y") == {"a-v2-1.0.0": "/x", "a-1.0.0": "/y"}, \
        "another adapter whose name starts alike is kept"


def test_a_pod_started_with_lora_modules_serves_them_only_with_lora_enabled():
    pod = {"spec": {"containers": [{"args": ["--enable-lora", "--lora-modules", "sql-lora-1.0.0=/c/sql-lora/1.0.0"]}]}}
    lora = LoraAdapters(*lora_settings(pod))
    assert lora.serves("sql-lora-1.0.0", "llama") and not lora.serves("sql-lora-1.1.0", "llama")
    assert lora_settings({"spec": {"containers": [{"args": ["--lora-modules", "a-1.0.0=/p"]}]}})[2] == {}


def test_a_base_rollout_moves_the_adapter_rules_to_the_new_base_service():
    sql = adapter_rule("sql-lora", "chat-v1-0-0", 8000, {"sql-lora-1.0.0": 100})
    other = adapter_rule("doc-lora", "chat-v0-9-0", 8000, {"doc-lora-1.0.0": 100})
    rules = [DEFAULT, sql, other]
    assert adapters_on(rules, "chat-v1-0-0") == ["sql-lora"]
    moved = moved_adapter_rules(rules, "chat-v1-0-0", "chat-v1-1-0")
    assert moved[0] == DEFAULT and moved[2] == other, "the default rule is the model rollout's; others untouched"
    assert [b["name"] for b in moved[1]["backendRefs"]] == ["chat-v1-1-0"] and moved[1]["matches"] == sql["matches"]
    assert moved_adapter_rules(rules, "chat-v1-0-0", None) == [DEFAULT, other], "no base to carry to: the rule goes"
