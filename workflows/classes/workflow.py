"""ApplyRequestClasses: route realtime and batch requests to their own pools through the gateway.

    temporal workflow start --type ApplyRequestClasses --task-queue tideplane \\
      --workflow-id request-classes/llm-serving/chat-classes --input '{"namespace": "llm-serving", "route": "chat-classes",
        "classes": [{"name": "realtime", "deployment": "chat", "priority": 10},
                    {"name": "batch", "deployment": "chat-batch", "priority": 0}]}'

One idempotent activity (a second run with the same input changes nothing): InferencePools and
InferenceObjectives where the Gateway API Inference Extension is installed, else Services, and the
HTTPRoute that matches the class header (workflows/classes/manifests.py): a route of its own, not the
deployment's (the rollout's traffic split owns that one). The result and the current details say
which mode was used and what changed.

API (stable): workflow type ApplyRequestClasses, ID ``request-classes/<namespace>/<route>``.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from workflows.classes.contract import AppliedClasses, RequestClassActivities
    from workflows.classes.manifests import RequestClassesInput


@workflow.defn(name="ApplyRequestClasses")
class ApplyRequestClasses:
    @workflow.run
    async def run(self, input: RequestClassesInput) -> AppliedClasses:
        applied = await workflow.execute_activity_method(
            RequestClassActivities.apply_request_classes,
            input,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=10)),
            summary=f"gateway objects of {input.namespace}/{input.route}",
        )
        classes = ", ".join(f"{c.name} → {c.deployment}" for c in input.classes)
        workflow.set_current_details(
            f"**{input.namespace}/{input.route}** ({applied.mode}): {classes}; default {input.default_class}\n\n"
            f"changed: {', '.join(applied.changed) or 'nothing (already applied)'}"
        )
        return applied
