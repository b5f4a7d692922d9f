"""``tideplane schema rollout``: the JSON Schema of ModelRollout's input, signals and update, from the
same pydantic models the workflow validates with, so a CI job checks a release spec before anything
starts (``check-jsonschema --schemafile``, or ``tideplane rollout start FILE --dry-run``)."""

from __future__ import annotations

import json

from pydantic import BaseModel

from workers.config import Settings
from workflows.core.naming import MODEL_ROLLOUT_WORKFLOW
from workflows.rollout.types import AbortInput, PauseInput, PromoteInput, ResumeInput, RolloutInput


def rollout_schema() -> dict:
    """One JSON Schema document: the workflow input at the top level (a spec file validates against
    it as is), the signals' and the update's payloads under ``$defs`` and ``x-tideplane``."""

    def schema(model: type[BaseModel]) -> dict:
        return model.model_json_schema(mode="validation")

    top = schema(RolloutInput)
    top["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    top["title"] = f"{MODEL_ROLLOUT_WORKFLOW} input (RolloutInput)"
    defs = top.setdefault("$defs", {})
    handlers = {"signal pause": PauseInput, "signal resume": ResumeInput, "signal abort": AbortInput, "update promote": PromoteInput}
    for model in handlers.values():
        defs[model.__name__] = schema(model)
    top["x-tideplane"] = {
        "workflow": MODEL_ROLLOUT_WORKFLOW,
        "input": "#",
        **{name: f"#/$defs/{model.__name__}" for name, model in handlers.items()},
    }
    return top


SCHEMAS = {"rollout": rollout_schema}


def cmd_schema(args, config: Settings) -> int:
    print(json.dumps(SCHEMAS[args.workflow](), indent=2))
    return 0


def add_schema_commands(subparsers) -> None:
    p = subparsers.add_parser("schema", help="print the JSON Schema of a workflow's input, signals and updates")
    p.add_argument("workflow", choices=sorted(SCHEMAS), help="rollout: ModelRollout")
    p.set_defaults(func=cmd_schema)
