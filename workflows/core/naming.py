"""Names, labels and IDs shared by workflows, activities and the sandbox.

Pure functions only: workflows import this module. Keeping every derived name here means the
workflow ID of a rollout, the Kubernetes objects it creates and the labels the fleet simulator
and Prometheus queries select on can never drift apart.
"""

from __future__ import annotations

import hashlib
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
# On a namespace: tideplane may serve there (the worker refuses others); the scrape path follows it.
LABEL_SERVING_NAMESPACE = "tideplane.io/serving"
# The workflow that owns a logical deployment's objects (on its HTTPRoute during a rollout, on the
# version Deployments a scaling loop scales): its workflow ID, which continue-as-new keeps.
ANNOTATION_OWNER = "tideplane.io/owner"
# On the HTTPRoute: the version the rollout made stable (written with every route change it makes).
# The scaling loop scales this version and a rollout starts beside it; never inferred from a sort.
ANNOTATION_STABLE_VERSION = "tideplane.io/stable-version"
# A version's replicas beside its own Deployment (read as one model by activities/core/deployments.py's
# version_replicas; written by the spot capability): one spot Deployment per pool of a spot mix
# (labelled with the versioned name and, on its pods, the pool), and the on-demand fallback
# ``<name>-od`` whose replicas are the sum of claims (SpotReclaim's per instance, the mix's base).
LABEL_SPOT_MIX_FOR = "tideplane.io/spot-mix-for"
LABEL_SPOT_POOL = "tideplane.io/spot-pool"
LABEL_FALLBACK_FOR = "tideplane.io/fallback-for"
ANNOTATION_SPOT_CLAIMS = "tideplane.io/spot-claims"  # JSON {claimant: replicas}
# On the versioned Deployment under a spot mix: the loop's total (its own replicas are 0).
ANNOTATION_SPOT_MIX_TARGET = "tideplane.io/spot-mix-target"
SPOT_MIX_CLAIMANT = "spot-mix"  # the claimant under which the mix's on-demand base sits on the fallback
# ApplicationError type of a refusal: another workflow owns the deployment (ANNOTATION_OWNER).
DEPLOYMENT_OWNED = "DeploymentOwned"

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


# A version is written into the ``app.kubernetes.io/version`` label: it must be a valid label value.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Versions whose object name is the plain slug (dots become hyphens): reversible, so names stay
# distinct, and the names of every dotted version (``1.3.0`` -> ``chat-v1-3-0``) stay what they were.
_PLAIN_VERSION = re.compile(r"^[a-z0-9]+(\.[a-z0-9]+)*$")
_HASH_MARK = "--"  # never in a plain name (no empty dot-separated part), so hashed names cannot collide with one


def _checked_version(version: str) -> str:
    if not _LABEL_VALUE.match(version):
        raise ValueError(
            f"version must be a Kubernetes label value (1-63 of A-Z a-z 0-9 - _ ., starting and ending"
            f" alphanumeric), got {version!r}"
        )
    return version


# The version field of a workflow input: it becomes a label value and part of object names.
VersionLabel = Annotated[str, AfterValidator(_checked_version)]


def _checked_model(model: str) -> str:
    if not _LABEL_VALUE.match(model):
        raise ValueError(
            f"model must be a Kubernetes label value (1-63 of A-Z a-z 0-9 - _ ., starting and ending"
            f" alphanumeric): it labels every pod as {LABEL_MODEL}; write a Hugging Face id like org/name"
            " as org.name or name"
        )
    return model


# The model field of a workflow input: it becomes the tideplane.io/model label value (a name with a
# space, a slash or 64 characters would stage weights for hours and then be refused by the API server).
ModelLabel = Annotated[str, AfterValidator(_checked_model)]


def version_slug(version: str) -> str:
    """A version as it may appear in a Kubernetes object name: ``1.3.0+rc1`` -> ``1-3-0-rc1``."""
    return re.sub(r"[^a-z0-9]+", "-", version.lower()).strip("-")


def fallback_name(name: str) -> str:
    """The on-demand fallback Deployment of the Deployment ``name``."""
    return f"{name[:60].rstrip('-')}-od"


def versioned_name(name: str, version: str) -> str:
    """Name of the Deployment and Service that serve one version of a logical deployment.

    Injective over versions: a dotted lowercase version keeps its readable name (``chat-v1-3-0``);
    any other (``1.3.0-rc.1``, ``1.3.0-rc-1``, ``1.3.0-RC1``), or one whose name would pass 63
    characters, gets the slug cut to fit plus ``--`` and a hash of the exact version, so two
    versions that differ only in punctuation or case never share (and overwrite) one object.
    """
    plain = f"{name}-v{version_slug(version)}"
    if _PLAIN_VERSION.match(version) and len(plain) <= 63:
        return plain
    digest = hashlib.sha256(version.encode()).hexdigest()[:10]
    return f"{plain[: 63 - len(_HASH_MARK) - len(digest)].rstrip('-')}{_HASH_MARK}{digest}"


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


MODEL_ROLLOUT_WORKFLOW = "ModelRollout"  # the workflow type (registry retention lists its running executions)


def rollout_workflow_id(deployment: str) -> str:
    namespace, name = split_deployment(deployment)
    return f"rollout/{namespace}/{name}"


def workflow_link(ui: str, namespace: str, workflow_id: str) -> str:
    """A workflow's page in the Temporal web UI at ``ui`` (the CLI prints it, notifications carry it)."""
    escaped = "".join(c if c.isascii() and (c.isalnum() or c in "-._~") else "".join(f"%{b:02X}" for b in c.encode()) for c in workflow_id)
    return f"{ui.rstrip('/')}/namespaces/{namespace}/workflows/{escaped}"  # urllib's quote(safe=""), no I/O module


def scaling_workflow_id(deployment: str) -> str:
    namespace, name = split_deployment(deployment)
    return f"scaling/{namespace}/{name}"


def node_pool_workflow_id(pool: str) -> str:
    """The NodePoolScaling loop of one GPU node pool (= its Auto Scaling group)."""
    return f"nodepool/{pool}"


def shared_pool_workflow_id(pool: str) -> str:
    """The SharedPoolScaling loop of the models sharing one GPU pool."""
    return f"sharedpool/{pool}"


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
# Token metering (TokenMetering, daily) and quotas (ApplyTokenQuotas, a Schedule per quota file's route).
TOKEN_METERING_WORKFLOW_ID = "token-metering/daily"
TOKEN_METERING_SCHEDULE_ID = "token-metering-daily"
QUOTA_SCHEDULE_PREFIX = "token-quotas"


def quota_schedule_id(namespace: str, route: str) -> str:
    """The Schedule that keeps a route's token quotas applied (``tideplane quotas apply``)."""
    return f"{QUOTA_SCHEDULE_PREFIX}/{namespace}/{route}"


def spot_reclaim_workflow_id(instance_id: str) -> str:
    """One SpotReclaim per spot instance: every notice about the instance joins that workflow."""
    return f"spot-reclaim/{instance_id}"


def return_to_spot_workflow_id(namespace: str, name: str) -> str:
    """One ReturnToSpot per spot Deployment: it serves every reclaim that claimed replacements for it."""
    return f"return-to-spot/{namespace}/{name}"


def traffic_policy_name(route: str) -> str:
    """The one Envoy Gateway BackendTrafficPolicy tideplane keeps on an HTTPRoute: the queue limit and
    the token quotas share it, because Envoy Gateway applies only the oldest policy targeting a route."""
    return f"{route}-backend-traffic"
