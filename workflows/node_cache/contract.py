"""The contract between ModelRollout's pre-staging and the activities that stage onto nodes.

Pre-staging runs one Job per node of the target pool, in the rollout's namespace (activities/node_cache/node_cache_activities.py builds them); each
Job's pod runs ``tideplane node-cache stage --request JSON`` (a ``NodeCacheRequest``) on its node:
the resumable, verified staging code, into the node's chunk cache, fetching each missing chunk
from a peer that holds it and from S3 otherwise. Its ``NodeCacheReport`` comes back as the
container's termination message. Activity names are a stable API.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity

from workflows.core.versions import WeightFile
from workflows.node_cache.chunks import PATH_SEGMENT

START_NODE_STAGING = "start_node_staging"
NODE_STAGING_STATUS = "node_staging_status"

# The Node annotation a node's cache agent (DaemonSet pod, or the sandbox's node agent) publishes
# its chunk server under; without it the peer URL is the worker's template on the node's InternalIP.
NODE_CACHE_URL_ANNOTATION = "tideplane.io/node-cache-url"
# Label of the staging Jobs and their pods.
NODE_CACHE_JOB_COMPONENT = "node-cache-stage"
LABEL_COMPONENT = "tideplane.io/component"


class Peer(BaseModel):
    node: str
    url: str = Field(description="the node's chunk server, e.g. http://10.0.3.7:8470")


class NodeCacheRequest(BaseModel):
    """What one staging pod does (its ``--request``): stage a version into its node's cache."""

    model: str = Field(pattern=PATH_SEGMENT)
    version: str = Field(pattern=PATH_SEGMENT)
    files: list[WeightFile] = Field(min_length=1)
    node: str
    stagers: list[str] = Field(description="every node staging this version now: they share the origin reads")
    peers: list[Peer] = Field(default_factory=list, description="chunk servers of the other nodes")
    pinned: list[str] = Field(default_factory=list, description="model@version never evicted (stable, canary, previous)")
    capacity_bytes: int | None = Field(None, gt=0, description="the cache's size limit; None: unbounded")
    peer_wait_seconds: float = Field(30.0, ge=0, description="how long to wait for a peer's chunk before reading S3")


class NodeCacheReport(BaseModel):
    """A staging pod's result: where its bytes came from."""

    node: str
    model: str
    version: str
    size_bytes: int
    origin_bytes: int = Field(description="read from S3")
    peer_bytes: int = Field(description="read from other nodes' chunk servers")
    reused_bytes: int = Field(description="already in this node's cache (another version's chunks, or a retry)")
    evicted: list[str] = Field(default_factory=list)
    seconds: float


class NodeCacheSettings(BaseModel):
    """Rollout input ``prestage``: stage the version onto the pool's nodes before the canary starts."""

    model_config = ConfigDict(extra="forbid")

    pool: str | None = Field(None, description="node pool label value (karpenter.sh/nodepool); None: every GPU node")
    min_nodes: int = Field(1, ge=1, description="the rollout goes on once this many nodes hold the version (the rest finish behind)")
    timeout_seconds: float = Field(3600.0, gt=0, description="fail the rollout before any cluster change when min_nodes are not staged by then")
    poll_seconds: float = Field(5.0, gt=0)


class StartNodeCacheInput(BaseModel):
    namespace: str = Field(description="an enabled serving namespace (the rollout's): the Jobs run there")
    model: str
    version: str
    files: list[WeightFile] = Field(min_length=1)
    pool: str | None = None
    run_id: str = Field(description="the rollout's run: names its Jobs, so a new rollout of the version stages afresh")
    image: str | None = Field(
        None, description="the serving image: each node's Job pulls it first (an init container), so a replica scheduled"
        " there later, or the node back from a warm pool (a stopped instance keeps its disk), finds it on disk"
    )


class NodeCacheProgress(BaseModel):
    """One node's progress."""

    node: str
    state: Literal["pending", "staging", "staged", "failed"]
    report: NodeCacheReport | None = None
    message: str | None = None

    def describe(self) -> str:
        """One node in the web UI's current details."""
        if self.report is not None:
            r = self.report
            mib = 2**20
            return (f"{self.node} staged ({r.origin_bytes / mib:.0f} MiB from S3, {r.peer_bytes / mib:.0f} from peers,"
                    f" {r.reused_bytes / mib:.0f} reused)")
        return f"{self.node} {self.state}" + (f" ({self.message})" if self.state == "failed" and self.message else "")


class NodeCacheStatus(BaseModel):
    nodes: list[NodeCacheProgress] = Field(default_factory=list)

    def count(self, state: str) -> int:
        return sum(1 for n in self.nodes if n.state == state)


class NodeCacheActivities:
    """What pre-staging asks of the cluster (activities/node_cache/node_cache_activities.py)."""

    @activity.defn(name=START_NODE_STAGING)
    def start_node_staging(self, req: StartNodeCacheInput) -> NodeCacheStatus:
        """Create (idempotently) one staging Job per Ready node of the pool."""
        raise NotImplementedError

    @activity.defn(name=NODE_STAGING_STATUS)
    def node_staging_status(self, req: StartNodeCacheInput) -> NodeCacheStatus:
        """Each node's staging state, with its report once its pod has finished."""
        raise NotImplementedError
