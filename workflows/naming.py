"""Names, labels and IDs shared by workflows, activities and the sandbox.

Pure functions only: workflows import this module. Keeping every derived name here means the
workflow ID of a rollout, the Kubernetes objects it creates and the labels the fleet simulator
and Prometheus queries select on can never drift apart.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

TASK_QUEUE = "tideplane"

# Labels on every object tideplane creates (Deployment, its pod template, Service).
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "tideplane"
LABEL_APP = "app.kubernetes.io/name"  # the logical deployment, e.g. "chat"
LABEL_VERSION = "app.kubernetes.io/version"  # the model version, e.g. "1.3.0"
LABEL_MODEL = "tideplane.io/model"  # the model name, e.g. "llama-3-8b"
LABEL_CLASS = "tideplane.io/priority-class"  # realtime | batch

# Node labels as Karpenter / EKS set them.
NODE_CAPACITY_TYPE = "karpenter.sh/capacity-type"  # on-demand | spot
NODE_ZONE = "topology.kubernetes.io/zone"
NODE_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
NODE_POOL = "karpenter.sh/nodepool"
GPU_RESOURCE = "nvidia.com/gpu"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def split_deployment(ref: str) -> tuple[str, str]:
    """``"llm-serving/chat"`` -> ``("llm-serving", "chat")``; raises ValueError when malformed."""
    namespace, sep, name = ref.partition("/")
    if not sep or not _DNS_LABEL.match(namespace) or not _DNS_LABEL.match(name):
        raise ValueError(f"deployment must be NAMESPACE/NAME with DNS-label parts, got {ref!r}")
    return namespace, name


def _checked_deployment(ref: str) -> str:
    split_deployment(ref)
    return ref


# A NAMESPACE/NAME field of a workflow input: validated once here, named in the error by pydantic.
DeploymentName = Annotated[str, AfterValidator(_checked_deployment)]


def version_slug(version: str) -> str:
    """A version as it may appear in a Kubernetes object name: ``1.3.0+rc1`` -> ``1-3-0-rc1``."""
    return re.sub(r"[^a-z0-9]+", "-", version.lower()).strip("-")


def versioned_name(name: str, version: str) -> str:
    """Name of the Deployment and Service that serve one version of a logical deployment."""
    return f"{name}-v{version_slug(version)}"[:63].rstrip("-")


class DeploymentRef(BaseModel):
    """One logical deployment (``"llm-serving/chat"``): the one reference type activities take.

    Workflow inputs keep the ``"NAMESPACE/NAME"`` string users type (``DeploymentName``) and turn
    it into this with ``DeploymentRef.from_name``; the versions' Kubernetes objects are ``versioned``.
    """

    namespace: str
    name: str = Field(description="logical deployment name, e.g. 'chat'")

    @classmethod
    def from_name(cls, deployment: str) -> DeploymentRef:
        """``"llm-serving/chat"`` -> DeploymentRef; ValueError when malformed."""
        namespace, name = split_deployment(deployment)
        return cls(namespace=namespace, name=name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def versioned(self, version: str) -> str:
        """Name of the Deployment and Service that serve ``version`` of this deployment."""
        return versioned_name(self.name, version)


def rollout_workflow_id(deployment: str) -> str:
    namespace, name = split_deployment(deployment)
    return f"rollout/{namespace}/{name}"


def scaling_workflow_id(deployment: str) -> str:
    namespace, name = split_deployment(deployment)
    return f"scaling/{namespace}/{name}"


def node_pool_workflow_id(pool: str) -> str:
    """The NodePoolScaling loop of one GPU node pool (= its Auto Scaling group)."""
    return f"nodepool/{pool}"


FLOOR_SCHEDULE_PREFIX = "floor"  # Temporal Schedules of time-of-day floors (ScheduleFloor)
PREWARM_SCHEDULE_PREFIX = "prewarm"  # Temporal Schedules of predictive pre-warm (PredictivePrewarm)


def schedule_prefix(kind: str, deployment: str) -> str:
    """``floor/<namespace>/<name>`` or ``prewarm/<namespace>/<name>``: one deployment's schedules of a kind."""
    namespace, name = split_deployment(deployment)
    return f"{kind}/{namespace}/{name}"


def floor_schedule_id(deployment: str, entry_key: str) -> str:
    """The Schedule of one floor entry of a deployment's profile (``FloorEntry.key``)."""
    return f"{schedule_prefix(FLOOR_SCHEDULE_PREFIX, deployment)}/{entry_key}"


def prewarm_schedule_id(deployment: str) -> str:
    return schedule_prefix(PREWARM_SCHEDULE_PREFIX, deployment)


def scheduled_workflow_id(schedule_id: str) -> str:
    """The workflow a schedule starts (the server appends the action time)."""
    return f"{schedule_id}/run"


# The registry's daily retention (RegistryRetention) and the daily cost report (CostReport).
RETENTION_WORKFLOW_ID = "registry-retention"  # its scheduled runs; `tideplane registry retention` adds a timestamp
RETENTION_SCHEDULE_ID = "registry-retention-daily"
COST_REPORT_WORKFLOW_ID = "cost-report/daily"
COST_REPORT_SCHEDULE_ID = "cost-report-daily"


def spot_reclaim_workflow_id(instance_id: str) -> str:
    """One SpotReclaim per spot instance: every notice about the instance joins that workflow."""
    return f"spot-reclaim/{instance_id}"


def return_to_spot_workflow_id(namespace: str, name: str) -> str:
    """One ReturnToSpot per spot Deployment: it serves every reclaim that claimed replacements for it."""
    return f"return-to-spot/{namespace}/{name}"
