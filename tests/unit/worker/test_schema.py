"""``tideplane schema rollout`` describes what the workflow accepts: a spec the workflow takes
validates against it, a spec it refuses (a wrong type, an unknown field) fails it, so a CI job can
check a release before starting anything."""

from __future__ import annotations

import json

import jsonschema
import pytest

from workers.cli.main import run

GOOD = {"deployment": "llm-serving/chat", "model": "llama-3-8b", "version": "1.3.0", "image": "vllm/vllm-openai:v0.6.3",
        "steps": [{"weight": 5, "window_seconds": 60}], "gates": {"max_error_rate": 0.01}}


@pytest.fixture(scope="module")
def schema():
    from workers.cli.schema import rollout_schema

    return rollout_schema()


def test_the_printed_schema_is_the_document(capsys, schema):
    assert run(["schema", "rollout"]) == 0
    assert json.loads(capsys.readouterr().out) == schema
    jsonschema.Draft202012Validator.check_schema(schema)


def test_a_spec_the_workflow_takes_validates_and_a_bad_one_does_not(schema):
    jsonschema.validate(GOOD, schema)
    for bad in ({**GOOD, "replicas": "three"}, {**GOOD, "colour": "blue"}, {k: v for k, v in GOOD.items() if k != "image"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_signals_and_the_update_are_described(schema):
    handlers = schema["x-tideplane"]
    assert set(handlers) == {"workflow", "input", "signal pause", "signal resume", "signal abort", "update promote"}
    promote = schema["$defs"]["PromoteInput"]
    assert set(promote["properties"]) == {"full", "force"}
    jsonschema.validate({"full": True}, {**promote, "$defs": schema["$defs"]})
