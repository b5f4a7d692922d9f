"""What ApplyRequestClasses asks of the cluster: the contract ``RequestClassActivities`` (activities/classes/request_class_activities.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from workflows.classes.manifests import Mode, RequestClassesInput

APPLY_REQUEST_CLASSES = "apply_request_classes"


class AppliedClasses(BaseModel):
    mode: Mode = Field(description="inference-extension: InferencePools + InferenceObjectives; httproute: Services")
    objects: list[str] = Field(description="kind/name of every object created or updated")
    changed: list[str] = Field(default_factory=list, description="those that were created or differed")


class RequestClassActivities:
    """Creates or updates the gateway objects of request classes (activities/classes/request_class_activities.py)."""

    @activity.defn(name=APPLY_REQUEST_CLASSES)
    def apply_request_classes(self, req: RequestClassesInput) -> AppliedClasses:
        """Idempotent: objects already as wanted are left alone."""
        raise NotImplementedError
