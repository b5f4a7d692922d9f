"""ModelRollout's pre-staging onto the pool's nodes (input ``prestage``), on the time-skipping
server with the rollout's stubbed cluster (tests/workflows/rollout/test_rollout.py) plus scripted nodes."""

from __future__ import annotations

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError

from tests.workflows.rollout.test_rollout import Fleet, client, metered_env, rollout_input, run_rollout  # noqa: F401 - fixtures
from workflows.rollout.contract import ENSURE_VERSION, STAGE_WEIGHTS
from workflows.rollout.types import Outcome
from workflows.rollout.workflow import ModelRollout
from workflows.node_cache.contract import (
    NODE_STAGING_STATUS,
    START_NODE_STAGING,
    NodeCacheReport,
    NodeCacheProgress,
    NodeCacheStatus,
    StartNodeCacheInput,
)

NODES = ["node-a", "node-b", "node-c"]


class Nodes(Fleet):
    """The stubbed cluster, with nodes whose staging states follow a script, one entry per read."""

    def __init__(self, client, script: list[list[str]]) -> None:
        super().__init__(client, hook=self._status_when_starting)
        self.script = script
        self.reads = 0
        self.starting_status = None  # the status query as the version starts

    async def _status_when_starting(self, fleet, name, arg) -> None:
        if name == "describe_deployment" and self.starting_status is None:
            self.starting_status = await self.handle.query(ModelRollout.status)

    def activities(self):
        return [*super().activities(), self.start_node_staging, self.node_staging_status]

    def _status(self) -> NodeCacheStatus:
        states = self.script[min(self.reads, len(self.script) - 1)]
        self.reads += 1
        return NodeCacheStatus(nodes=[
            NodeCacheProgress(node=node, state=state, message="NoRoom: full" if state == "failed" else None,
                        report=NodeCacheReport(node=node, model="llama", version="1.3.0", size_bytes=100, origin_bytes=34,
                                               peer_bytes=66, reused_bytes=0, seconds=1.0) if state == "staged" else None)
            for node, state in zip(NODES, states)
        ])

    @activity.defn(name=START_NODE_STAGING)
    async def start_node_staging(self, input: StartNodeCacheInput) -> NodeCacheStatus:
        await self._record(START_NODE_STAGING, input)
        return self._status()

    @activity.defn(name=NODE_STAGING_STATUS)
    async def node_staging_status(self, input: StartNodeCacheInput) -> NodeCacheStatus:
        await self._record(NODE_STAGING_STATUS, input)
        return self._status()


async def test_the_canary_starts_once_enough_nodes_hold_the_weights_not_all(client):
    nodes = Nodes(client, [["pending"] * 3, ["staged", "staging", "pending"], ["staged", "staging", "staged"]])
    inp = rollout_input(prestage={"pool": "gpu-on-demand", "min_nodes": 2, "poll_seconds": 5})
    result = await run_rollout(nodes, inp)
    assert result.outcome is Outcome.PROMOTED
    names = nodes.names()
    assert names[:5] == [STAGE_WEIGHTS, START_NODE_STAGING, NODE_STAGING_STATUS, NODE_STAGING_STATUS, "describe_deployment"]
    assert names.index(ENSURE_VERSION) > names.index(NODE_STAGING_STATUS)
    started = nodes.calls[1][1]
    assert (started.pool, started.version, len(started.files)) == ("gpu-on-demand", "1.3.0", 1)
    shown = [(n.node, n.state, n.report.peer_bytes if n.report else None) for n in nodes.starting_status.nodes]
    assert shown == [("node-a", "staged", 66), ("node-b", "staging", None), ("node-c", "staged", 66)]
    ensured = next(arg for name, arg in nodes.calls if name == ENSURE_VERSION)
    assert ensured.node_cache_files == started.files, "the pods read the pre-staged version from their nodes' caches"


async def test_too_many_failed_nodes_fail_the_rollout_before_the_cluster_changes(client):
    nodes = Nodes(client, [["pending"] * 3, ["failed", "staging", "failed"]])
    with pytest.raises(WorkflowFailureError) as failure:
        await run_rollout(nodes, rollout_input(prestage={"min_nodes": 2}))
    assert "2 of 3 node(s) failed, 2 needed" in str(failure.value.cause) and "NoRoom: full" in str(failure.value.cause)
    assert ENSURE_VERSION not in nodes.names()


async def test_without_prestage_no_node_is_staged(client):
    nodes = Nodes(client, [["staged"] * 3])
    assert (await run_rollout(nodes, rollout_input())).outcome is Outcome.PROMOTED
    assert START_NODE_STAGING not in nodes.names()
    assert next(arg for name, arg in nodes.calls if name == ENSURE_VERSION).node_cache_files == [], "the shared model cache"
