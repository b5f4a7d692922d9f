"""Weights pre-staged onto a 3-node pool, peer to peer, by a real ModelRollout in the sandbox; then
a release that changes one of its 30 files moves only that file; a version's token reads that version only.

Nothing is stubbed: a ``tideplane worker`` process runs the rollouts (started with the temporal
CLI's JSON), the staging Jobs are created in the API emulator, and each sandbox node's agent runs
its staging pod with the real staging code into that node's cache directory, reading chunks from
the other nodes' chunk servers (with its version's token) and from moto. Figures are read back from the rollout's status
(each pod's termination-message report), the nodes' chunk servers and the CLI's listing.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from activities.clients.kube import KubeClient
from activities.node_cache.access import TOKEN_ENV, version_token
from infra.sandbox.nodes import aws_clients
from infra.sandbox.worker_identity import enable_serving_namespace
from tests.e2e.rollout.test_rollout import temporal_start
from tests.e2e.worker_process import WorkerProcess
from tests.sandbox_fixtures import TEST_CONFIG, wait_for
from workers.cli.node_cache import cache_rows
from workflows.core.naming import LABEL_APP, LABEL_VERSION, NODE_POOL, rollout_workflow_id
from workflows.rollout.types import Outcome, RolloutResult, RolloutStatus
from workflows.node_cache.contract import LABEL_COMPONENT, NODE_CACHE_JOB_COMPONENT, NODE_CACHE_URL_ANNOTATION
from workflows.node_cache.chunks import cached_version_label
from workflows.rollout.client import rollout_result

NS, NAME, MODEL = "e2e-node-cache", "chat", "e2e-cache-llm"
POOL, POOL_NODES = "gpu-on-demand", 3
FILES, FILE_BYTES = 30, 128 * 1024
SIZE = FILES * FILE_BYTES


def shard(version: str, i: int, changed: set[int]) -> bytes:
    """Shard ``i`` of a release; those in ``changed`` differ from 1.0.0's."""
    return random.Random(f"{version}/{i}" if i in changed else f"base/{i}").randbytes(FILE_BYTES)


def write_weights(directory: Path, version: str, changed: set[int]) -> None:
    """30 shards."""
    directory.mkdir(parents=True)
    for i in range(FILES):
        (directory / f"model-{i:05d}-of-{FILES:05d}.safetensors").write_bytes(shard(version, i, changed))


def rollout(version: str, min_nodes: int) -> dict:
    return {
        "deployment": f"{NS}/{NAME}", "model": MODEL, "version": version, "image": "vllm/vllm-openai:v0.6.3",
        "gpus_per_replica": 1, "replicas": 1, "steps": [{"weight": 100, "window_seconds": 10}],
        "warm_up": {"requests": 2, "deadline_seconds": 60}, "scale_down_delay_seconds": 1,
        "prestage": {"pool": POOL, "min_nodes": min_nodes, "poll_seconds": 0.5, "timeout_seconds": 60},
    }


def pool_nodes(core: client.CoreV1Api) -> list:
    return [n for n in core.list_node(label_selector=f"{NODE_POOL}={POOL}").items
            if (n.metadata.annotations or {}).get(NODE_CACHE_URL_ANNOTATION)]


def served_bytes(core: client.CoreV1Api) -> int:
    """What the pool's chunk servers served to peers, from their Prometheus endpoints."""
    total = 0
    for node in pool_nodes(core):
        text = httpx.get(node.metadata.annotations[NODE_CACHE_URL_ANNOTATION] + "/metrics").text
        total += int(float(re.search(r"^tideplane_node_cache_served_bytes_total\{.*\} (\S+)$", text, re.M).group(1)))
    return total


async def roll_out(sandbox, temporal, version: str, min_nodes: int) -> tuple[RolloutResult, RolloutStatus]:
    started = await asyncio.to_thread(temporal_start, sandbox.urls["temporal"], rollout(version, min_nodes))
    assert started.returncode == 0, started.stderr
    handle = temporal.get_workflow_handle(rollout_workflow_id(f"{NS}/{NAME}"), result_type=RolloutResult)
    result = await asyncio.wait_for(rollout_result(handle), 60)
    return result, await handle.query("status", result_type=RolloutStatus)


@pytest.fixture(scope="module")
async def pool(sandbox, kube, registry, tmp_path_factory):
    """The pool at 3 nodes (a third instance joins through the Auto Scaling group), a serving
    namespace, both releases registered, and a worker."""
    _, autoscaling = aws_clients(sandbox.env["AWS_ENDPOINT_URL"])
    autoscaling.set_desired_capacity(AutoScalingGroupName=POOL, DesiredCapacity=POOL_NODES)
    enable_serving_namespace(kube, NS)
    weights = tmp_path_factory.mktemp("weights")
    write_weights(weights / "1.0.0", "1.0.0", set())
    write_weights(weights / "1.1.0", "1.1.0", {17})
    for version in ("1.0.0", "1.1.0"):
        await asyncio.to_thread(registry.register, MODEL, version, str(weights / version), image="vllm/vllm-openai:v0.6.3")
    worker = WorkerProcess(sandbox.env, tmp_path_factory.mktemp("node-cache-worker") / "worker.log")
    worker.start()
    core = client.CoreV1Api(kube)
    await wait_for(lambda: len(pool_nodes(core)) == POOL_NODES, 30, "3 pool nodes with their cache agents")
    yield core
    worker.stop()


async def test_a_pool_pre_staged_peer_to_peer_reads_the_model_from_s3_once(sandbox, temporal, pool):
    served_before = served_bytes(pool)
    result, status = await roll_out(sandbox, temporal, "1.0.0", min_nodes=POOL_NODES)
    assert result.outcome is Outcome.PROMOTED, result.reason
    reports = [n.report for n in status.nodes]
    assert [n.state for n in status.nodes] == ["staged"] * POOL_NODES and all(reports)
    origin, peers = sum(r.origin_bytes for r in reports), sum(r.peer_bytes for r in reports)
    assert origin == SIZE, f"{origin} bytes read from S3 for a {SIZE}-byte model on {POOL_NODES} nodes"
    assert peers == (POOL_NODES - 1) * SIZE and served_bytes(pool) - served_before == peers
    rows = cache_rows(KubeClient(pool.api_client), "http://{node_ip}:8470", token=sandbox.env[TOKEN_ENV])
    held = {(r["node"], r["version"], r["bytes"]) for r in rows if r["version"] == f"{MODEL}@1.0.0"}
    assert {n for n, _, size in held if size == SIZE} == {n.metadata.name for n in pool_nodes(pool)}

    # The replica loads the version from its node's cache: the node is labelled as holding it, so the
    # load is from local disk, shorter than the S3 load (the sandbox's default profile's load_seconds).
    (replica,) = pool.list_namespaced_pod(NS, label_selector=f"{LABEL_APP}={NAME},{LABEL_VERSION}=1.0.0").items
    assert pool.read_node(replica.spec.node_name).metadata.labels.get(cached_version_label(MODEL, "1.0.0")) == "true"
    events = pool.list_namespaced_event(NS, field_selector=f"involvedObject.name={replica.metadata.name}").items
    (weights,) = [e.message for e in events if e.reason == "ColdStart" and e.message.startswith("weights ")]
    assert weights.endswith(f"loaded from the node cache /var/cache/tideplane/node-cache/versions/{MODEL}/1.0.0 (local disk)")
    assert float(weights.split(" ")[1].rstrip("s:")) < TEST_CONFIG["profiles"]["default"]["load_seconds"]

    # Each node's staging Job pulled the serving image first: every pool node lists it (those without
    # a replica too, as one back from a warm pool would), and the replica found it there.
    image = rollout("1.0.0", POOL_NODES)["image"]
    for node in pool_nodes(pool):
        assert image in {name for i in node.status.images or [] for name in i.names}, node.metadata.name
    (part,) = [e.message for e in events if e.reason == "ColdStart" and e.message.startswith("image ")]
    assert part == "image 0s: present on the node"


async def test_a_release_changing_one_file_moves_only_that_file(sandbox, temporal, pool):
    result, status = await roll_out(sandbox, temporal, "1.1.0", min_nodes=POOL_NODES)
    assert result.outcome is Outcome.PROMOTED, result.reason
    reports = [n.report for n in status.nodes]
    assert sum(r.origin_bytes for r in reports) == FILE_BYTES  # shard 17, from S3 once
    assert sum(r.origin_bytes + r.peer_bytes for r in reports) == POOL_NODES * FILE_BYTES
    assert all(r.reused_bytes == SIZE - FILE_BYTES for r in reports)

    def scraped() -> dict[tuple[str, str], float]:
        """What Prometheus scraped from the nodes' chunk servers (file_sd targets the agents write)."""
        query = f'tideplane_node_cache_bytes{{model="{MODEL}"}}'
        found = httpx.get(f"{sandbox.urls['prometheus']}/api/v1/query", params={"query": query}).json()["data"]["result"]
        return {(r["metric"]["node"], r["metric"]["version"]): float(r["value"][1]) for r in found}

    nodes = {n.metadata.name for n in pool_nodes(pool)}
    expected = {(n, v): float(SIZE) for n in nodes for v in ("1.0.0", "1.1.0")}
    await wait_for(lambda: scraped() == expected, 15, "Prometheus to scrape both versions on the 3 nodes")


async def test_a_nodes_chunks_go_only_to_a_token_of_their_version(sandbox, pool):
    """Both releases on every node now: each staging pod was handed its own version's token (never
    the node cache's secret), and with 1.0.0's token a node's chunk server shows 1.0.0 only and
    refuses 1.1.0's changed shard (403); without a token it answers 401."""
    secret = sandbox.env[TOKEN_ENV]
    staging = pool.list_namespaced_pod(NS, label_selector=f"{LABEL_COMPONENT}={NODE_CACHE_JOB_COMPONENT}").items
    tokens = {e.value for p in staging for e in p.spec.containers[0].env or [] if e.name == TOKEN_ENV}
    assert tokens == {version_token(secret, MODEL, v) for v in ("1.0.0", "1.1.0")}
    url = pool_nodes(pool)[0].metadata.annotations[NODE_CACHE_URL_ANNOTATION]
    as_old = {"Authorization": f"Bearer {version_token(secret, MODEL, '1.0.0')}"}
    assert list(httpx.get(f"{url}/index", headers=as_old).json()["versions"]) == [f"{MODEL}@1.0.0"]
    new_shard = hashlib.sha256(shard("1.1.0", 17, {17})).hexdigest()
    assert httpx.get(f"{url}/chunks/{new_shard}", headers=as_old).status_code == 403
    old_shard = hashlib.sha256(shard("1.0.0", 17, set())).hexdigest()
    assert httpx.get(f"{url}/chunks/{old_shard}", headers=as_old).content == shard("1.0.0", 17, set())
    assert [httpx.get(url + path).status_code for path in ("/index", f"/chunks/{old_shard}")] == [401, 401]
