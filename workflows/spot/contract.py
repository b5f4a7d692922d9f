"""The contract between the spot workflows and the activities that act for them (activities/spot/).

Pydantic inputs/outputs and three contract classes, in a module with no I/O imports so the
workflows reference them deterministically:

- ``SpotActivities``: SQS (notices), Kubernetes (nodes, serving pods, evictions, the on-demand
  fallback Deployments) and EC2 Auto Scaling (the on-demand pool);
- ``SpotMixActivities``: the spot pools' room and the split's Deployments, for a scaling loop
  with a spot mix (workflows/spot/mix.py);
- ``SpotWorkflowStarts``: the workflows one workflow starts that outlive it (through the
  activity's own Temporal client), needing no other client;
- ``SpotNotifyActivities``: a failover's notice to people (an Event on each affected Deployment,
  the optional webhook).

Activity names are a stable API (recorded histories refer to them). Every activity is idempotent.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.common import RetryPolicy

from workflows.core.naming import DeploymentRef
from workflows.spot.events import SpotNotice
from workflows.spot.mix import DomainNow, SpotDomain

# How the spot workflows call these: most calls are short and give up after a few tries (the
# workflow decides what then); the watcher's long poll retries for as long as SQS is away.
CALL_TIMEOUT = timedelta(seconds=30)
QUICK_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10), maximum_attempts=5)
PATIENT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))


class FailoverPolicy(BaseModel):
    """How a failover runs; passed from the watcher to every SpotReclaim it starts."""

    on_demand_pool_asg: str | None = Field(
        None, description="Auto Scaling group of the on-demand GPU pool (None: capacity exists or Karpenter adds it)"
    )
    capacity_type: str = Field("on-demand", description="karpenter.sh/capacity-type of replacement nodes")
    drain_margin_seconds: float = Field(30, ge=0, description="drain this long before the deadline even if replacements are not Ready")
    poll_seconds: float = Field(5, gt=0)
    rebalance_hold_seconds: float | None = Field(
        None, gt=0,
        description="keep a rebalance pre-warm this long waiting for an interruption"
        " (None: the stabilisation delay, workflows.spot.policy.rebalance_hold)",
    )
    restore_timeout_seconds: float = Field(1800, gt=0, description="after the drain, measure the gap at most this long")
    stabilisation_seconds: float = Field(300, ge=0, description="spot healthy this long before moving back")
    max_stabilisation_seconds: float = Field(3600, ge=0)
    return_to_spot: bool = True


class ReceiveNoticesInput(BaseModel):
    queue_url: str | None = Field(None, description="None: the worker's spot queue (TIDEPLANE_SPOT_QUEUE_URL)")
    wait_seconds: int = Field(20, ge=0, le=20, description="SQS long-poll wait")
    max_messages: int = Field(10, ge=1, le=10)
    visibility_timeout_seconds: int = Field(60, ge=0, description="until an undeleted message is delivered again")


class ReceivedMessage(BaseModel):
    message_id: str
    receipt_handle: str
    notice: SpotNotice | None = None
    error: str | None = Field(None, description="why the body is malformed")


class ReceivedBatch(BaseModel):
    messages: list[ReceivedMessage] = Field(default_factory=list)


class DeleteMessageInput(BaseModel):
    queue_url: str | None = None
    receipt_handle: str


class StartReclaimInput(BaseModel):
    notice: SpotNotice
    policy: FailoverPolicy = Field(default_factory=FailoverPolicy)


class StartedWorkflow(BaseModel):
    workflow_id: str


class FindNodeInput(BaseModel):
    instance_id: str


class SpotNode(BaseModel):
    """The Kubernetes node of a spot instance, as found by its ``spec.providerID``."""

    name: str | None = Field(None, description="None: no node has this instance's provider ID")
    pool: str | None = Field(None, description="its node pool (karpenter.sh/nodepool)")
    capacity_type: str | None = None
    zone: str | None = None
    unschedulable: bool = False


class UnschedulableInput(BaseModel):
    node: str
    unschedulable: bool = True


class NodeRef(BaseModel):
    node: str


class ServingPod(BaseModel):
    namespace: str
    name: str
    deployment: str = Field(description="the versioned Deployment, e.g. chat-v1-3-0")
    ready: bool


class PodsOnNode(BaseModel):
    pods: list[ServingPod] = Field(default_factory=list)


class ClaimFallbackInput(BaseModel):
    deployment: DeploymentRef = Field(description="the spot Deployment: name is the versioned name, e.g. chat-v1-3-0")
    claimant: str = Field(description="instance ID whose lost replicas this claim replaces")
    replicas: int = Field(ge=0, description="0 removes the claim")
    capacity_type: str = "on-demand"


class FallbackClaims(BaseModel):
    """A spot Deployment's on-demand fallback Deployment: its replicas, the sum of per-instance claims."""

    name: str
    replicas: int
    claims: dict[str, int] = Field(default_factory=dict)


class ReleaseFallbackInput(BaseModel):
    deployment: DeploymentRef = Field(description="the spot Deployment (versioned name)")


class PoolInput(BaseModel):
    asg: str


class PoolState(BaseModel):
    desired: int
    base: int
    claimants: list[str] = Field(default_factory=list)


class PodRef(BaseModel):
    namespace: str
    name: str


class EvictInput(BaseModel):
    pods: list[PodRef]


class EvictResult(BaseModel):
    evicted: list[str] = Field(default_factory=list)
    gone: list[str] = Field(default_factory=list)
    blocked: list[str] = Field(default_factory=list, description="namespace/name refused by a PodDisruptionBudget (429)")


class CountsInput(BaseModel):
    deployments: list[DeploymentRef] = Field(description="spot Deployments (versioned names)")


class ReplicaCounts(BaseModel):
    namespace: str
    name: str
    desired: int
    ready: int
    fallback_desired: int = 0
    fallback_ready: int = 0

    @property
    def short(self) -> bool:
        return self.ready + self.fallback_ready < self.desired


class CountsResult(BaseModel):
    counts: list[ReplicaCounts]


class ReturnToSpotInput(BaseModel):
    deployment: DeploymentRef = Field(description="the spot Deployment (versioned name)")
    policy: FailoverPolicy = Field(default_factory=FailoverPolicy)
    healthy_since: datetime | None = Field(None, description="carried over by continue-as-new")
    flaps: int = 0


class SpotDomainsInput(BaseModel):
    domains: list[SpotDomain] = Field(description="the mix's domains, each a spot node pool")


class SpotDomainsNow(BaseModel):
    domains: list[DomainNow] = Field(default_factory=list)


class ApplySpotMixInput(BaseModel):
    deployment: DeploymentRef = Field(description="the logical deployment")
    version: str
    total: int = Field(ge=0, description="the loop's replica target, recorded on the versioned Deployment")
    spot: dict[str, int] = Field(description="spot node pool -> replicas (0: none there)")
    on_demand: int = Field(ge=0, description="the on-demand base, claimed on the version's fallback Deployment")
    capacity_type: str = "on-demand"


class AppliedSpotMix(BaseModel):
    deployments: dict[str, int] = Field(default_factory=dict, description="Deployment name -> replicas written")
    own: int = Field(
        0, description="replicas left on the versioned Deployment: it goes down only by what the pools and the base hold Ready"
    )


NOTIFY_SPOT_FAILOVER = "notify_spot_failover"


class FailoverNotice(BaseModel):
    """What one Deployment's failover did, for the people who run it: ``seq`` numbers the run's
    notices, so (run_id, seq) is its key and a retried delivery writes the same Event."""

    namespace: str = Field(min_length=1)
    deployment: str = Field(min_length=1, description="the Kubernetes Deployment whose replicas moved (the Event's object)")
    instance_id: str = Field(min_length=1)
    node: str = Field(min_length=1)
    pool: str | None = None
    capacity_type: str = Field(description="where the replacements went (karpenter.sh/capacity-type)")
    replicas_moved: int = Field(ge=0)
    replacement_ready_seconds: float | None = Field(None, description="first notice -> all replacements Ready")
    capacity_gap_seconds: float = Field(ge=0, description="the run's: seconds during which some affected Deployment was short")
    workflow_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    temporal_namespace: str = Field(min_length=1, description="for the web UI link")
    seq: int = Field(ge=1)


class SpotActivities:
    """What the spot workflows ask of SQS, Kubernetes and EC2 Auto Scaling (activities/spot/spot_activities.py)."""

    @activity.defn(name="receive_spot_notices")
    def receive_spot_notices(self, req: ReceiveNoticesInput) -> ReceivedBatch:
        """Long-poll the queue; each message comes back parsed (or with why it is malformed)."""
        raise NotImplementedError

    @activity.defn(name="delete_spot_message")
    def delete_spot_message(self, req: DeleteMessageInput) -> None:
        raise NotImplementedError

    @activity.defn(name="find_spot_node")
    def find_spot_node(self, req: FindNodeInput) -> SpotNode:
        raise NotImplementedError

    @activity.defn(name="set_node_unschedulable")
    def set_node_unschedulable(self, req: UnschedulableInput) -> None:
        raise NotImplementedError

    @activity.defn(name="serving_pods_on_node")
    def serving_pods_on_node(self, req: NodeRef) -> PodsOnNode:
        raise NotImplementedError

    @activity.defn(name="claim_spot_fallback")
    def claim_spot_fallback(self, req: ClaimFallbackInput) -> FallbackClaims:
        """Set (not add) one instance's claim of on-demand replicas; 0 withdraws it."""
        raise NotImplementedError

    @activity.defn(name="release_spot_fallback")
    def release_spot_fallback(self, req: ReleaseFallbackInput) -> FallbackClaims:
        """Withdraw every claim; returns what was released."""
        raise NotImplementedError

    @activity.defn(name="evict_pods")
    def evict_pods(self, req: EvictInput) -> EvictResult:
        raise NotImplementedError

    @activity.defn(name="spot_replica_counts")
    def spot_replica_counts(self, req: CountsInput) -> CountsResult:
        raise NotImplementedError

    @activity.defn(name="sync_on_demand_pool")
    def sync_on_demand_pool(self, req: PoolInput) -> PoolState:
        raise NotImplementedError


class SpotMixActivities:
    """What a scaling loop with a spot mix asks of the spot pools and the cluster (activities/spot/spot_mix_activities.py)."""

    @activity.defn(name="read_spot_domains")
    def read_spot_domains(self, req: SpotDomainsInput) -> SpotDomainsNow:
        """Each domain's spot pool now: obtainable (its group may grow) and how many replicas it holds at most."""
        raise NotImplementedError

    @activity.defn(name="apply_spot_mix")
    def apply_spot_mix(self, req: ApplySpotMixInput) -> AppliedSpotMix:
        """Write the split: one spot Deployment per pool, the on-demand base claim, the total on the version."""
        raise NotImplementedError


class SpotWorkflowStarts:
    """Workflows the spot workflows start that outlive them (activities/spot/spot_workflow_starts.py)."""

    @activity.defn(name="start_spot_reclaim")
    async def start_spot_reclaim(self, req: StartReclaimInput) -> StartedWorkflow:
        """Signal-with-start the instance's SpotReclaim."""
        raise NotImplementedError

    @activity.defn(name="start_return_to_spot")
    async def start_return_to_spot(self, req: ReturnToSpotInput) -> StartedWorkflow:
        """Start the Deployment's ReturnToSpot unless one runs."""
        raise NotImplementedError


class SpotNotifyActivities:
    """How SpotReclaim tells people (activities/spot/failover_notices.py). Best effort: the workflow
    logs a failed delivery and goes on."""

    @activity.defn(name=NOTIFY_SPOT_FAILOVER)
    def notify_spot_failover(self, notice: FailoverNotice) -> None:
        """Write the notice's Event on the Deployment (an existing one counts as written), then post the webhook if one is set."""
        raise NotImplementedError
