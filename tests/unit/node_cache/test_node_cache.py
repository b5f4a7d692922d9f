"""The node cache's pure decisions (workflows/node_cache/chunks.py): what to fetch, what to evict, whom
to fetch from."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from benchmarks.node_cache import ORIGIN_BOUND, model_chunks, simulate_pool
from workers.cli.main import _parser
from workers.config import Settings
from workflows.core import telemetry
from workflows.node_cache.contract import NodeCacheRequest

from workflows.node_cache.chunks import (
    CachedVersion,
    CacheIndex,
    Chunk,
    chunks_to_fetch,
    eviction_plan,
    fetch_order,
    next_fetch,
    origin_fetcher,
    pick_peer,
    version_key,
)


def chunk(n: int, size: int = 10) -> Chunk:
    return Chunk(name=f"model-{n:05d}.safetensors", sha256=f"{n:064x}", size_bytes=size)


def cached(model: str, version: str, chunks: list[Chunk], last_used: float) -> tuple[str, CachedVersion]:
    return version_key(model, version), CachedVersion(model=model, version=version, chunks=chunks, last_used=last_used)


def index_of(*versions: tuple[str, CachedVersion]) -> CacheIndex:
    entries = dict(versions)
    return CacheIndex(versions=entries, chunks={c.sha256: c.size_bytes for v in entries.values() for c in v.chunks})


def test_a_version_sharing_28_of_30_files_fetches_the_2_that_changed():
    old = [chunk(i) for i in range(30)]
    new = old[:28] + [chunk(100), chunk(101)]
    index = index_of(cached("llama", "1.0.0", old, 1.0))
    assert chunks_to_fetch(index, new) == [chunk(100), chunk(101)]


def test_a_digest_listed_twice_is_fetched_once():
    assert chunks_to_fetch(CacheIndex(), [chunk(1), chunk(1).model_copy(update={"name": "copy"}), chunk(2)]) == [chunk(1), chunk(2)]


def test_eviction_takes_the_least_recently_used_unpinned_versions_until_the_new_one_fits():
    index = index_of(
        cached("a", "1.0.0", [chunk(1, 40)], last_used=1.0),   # oldest, but pinned (previous stable)
        cached("a", "1.1.0", [chunk(2, 40)], last_used=2.0),   # oldest unpinned: goes
        cached("b", "1.0.0", [chunk(3, 40)], last_used=3.0),   # newer: kept once there is room
    )
    plan = eviction_plan(index, [chunk(4, 40)], capacity_bytes=130, pinned={"a@1.0.0"})
    assert (plan.versions, plan.chunks, plan.fits) == (["a@1.1.0"], [chunk(2).sha256], True)


def test_a_chunk_another_kept_version_uses_stays_on_disk():
    shared = chunk(1, 50)
    index = index_of(cached("a", "1.0.0", [shared, chunk(2, 50)], 1.0), cached("a", "1.1.0", [shared, chunk(3, 50)], 2.0))
    plan = eviction_plan(index, [chunk(4, 50)], capacity_bytes=150, pinned={"a@1.1.0"})
    assert plan.versions == ["a@1.0.0"] and plan.chunks == [chunk(2).sha256] and plan.fits


def test_the_incoming_versions_own_chunks_already_held_count_once():
    index = index_of(cached("a", "1.0.0", [chunk(1, 90)], 1.0))
    plan = eviction_plan(index, [chunk(1, 90), chunk(2, 10)], capacity_bytes=100, pinned=set())
    assert plan.versions == [] and plan.fits  # 90 reused + 10 new = 100: nothing to evict


def test_pinned_versions_are_never_evicted_even_when_the_new_one_does_not_fit():
    index = index_of(cached("a", "1.0.0", [chunk(1, 80)], 1.0), cached("a", "0.9.0", [chunk(2, 80)], 0.5))
    plan = eviction_plan(index, [chunk(3, 80)], capacity_bytes=100, pinned={"a@1.0.0", "a@0.9.0"})
    assert plan.versions == [] and not plan.fits


def test_no_capacity_means_no_eviction():
    index = index_of(cached("a", "1.0.0", [chunk(1, 10**12)], 1.0))
    assert eviction_plan(index, [chunk(2, 10**12)], None, set()).versions == []


def test_each_chunk_has_one_origin_fetcher_and_the_nodes_share_them_evenly():
    nodes = [f"node-{i}" for i in range(8)]
    digests = [f"{i:064x}" for i in range(800)]
    owners = Counter(origin_fetcher(d, nodes) for d in digests)
    assert set(owners) == set(nodes) and min(owners.values()) > 60  # ~100 each
    assert all(origin_fetcher(d, list(reversed(nodes))) == origin_fetcher(d, nodes) for d in digests[:50])


def test_a_node_leaving_moves_only_its_own_chunks():
    nodes = [f"node-{i}" for i in range(5)]
    digests = [f"{i:064x}" for i in range(200)]
    before = {d: origin_fetcher(d, nodes) for d in digests}
    after = {d: origin_fetcher(d, nodes[:-1]) for d in digests}
    assert all(before[d] == after[d] for d in digests if before[d] != "node-4")


def test_a_node_fetches_from_another_holder_never_itself():
    assert pick_peer("ab" * 32, "node-1", ["node-1"]) is None
    assert pick_peer("ab" * 32, "node-1", ["node-1", "node-2"]) == "node-2"
    picks = Counter(pick_peer(f"{i:064x}", "node-0", ["node-1", "node-2", "node-3"]) for i in range(300))
    assert min(picks.values()) > 60  # spread over the holders


def test_the_next_fetch_is_a_held_chunk_from_a_peer_or_the_nodes_own_share_from_the_origin():
    stagers = ["node-a", "node-b"]
    missing = [chunk(i) for i in range(6)]
    mine = [c for c in missing if origin_fetcher(c.sha256, stagers) == "node-a"]
    theirs = [c for c in missing if c not in mine]
    assert mine and theirs
    pending = fetch_order(missing, "node-a", stagers)
    assert next_fetch(pending, "node-a", stagers, {}, stalled=False) == (mine[0], None)
    held = {theirs[0].sha256: ["node-b"]}
    assert next_fetch(pending, "node-a", stagers, held, stalled=False) == (mine[0], None)  # its origin share first
    # only the peer's share left, none served yet: wait, unless the peer has gone quiet for too long
    assert next_fetch(theirs, "node-a", stagers, {}, stalled=False) is None
    assert next_fetch(theirs, "node-a", stagers, {}, stalled=True) == (theirs[0], None)
    assert next_fetch(theirs, "node-a", stagers, held, stalled=False) == (theirs[0], "node-b")


def test_a_node_fetches_its_own_share_first():
    stagers = ["node-a", "node-b", "node-c"]
    missing = [chunk(i) for i in range(30)]
    order = fetch_order(missing, "node-b", stagers)
    mine = [c for c in missing if origin_fetcher(c.sha256, stagers) == "node-b"]
    assert order[: len(mine)] == mine and sorted(order, key=lambda c: c.name) == missing


def test_the_node_cache_metrics_follow_the_declared_conventions():
    names = [m.name for m in (*telemetry.METRICS, *telemetry.NODE_CACHE_METRICS)]
    assert len(names) == len(set(names))
    for m in telemetry.NODE_CACHE_METRICS:
        assert m.name.startswith("tideplane_node_cache_") and m.name.endswith("_total") == (m.kind == "counter")


def test_the_bench_transfer_model_reads_s3_once_with_peers_and_n_times_without():
    chunks = model_chunks(30 * 10**9)
    one = simulate_pool(1, chunks, ORIGIN_BOUND, p2p=False)
    alone = simulate_pool(4, chunks, ORIGIN_BOUND, p2p=False)
    shared = simulate_pool(4, chunks, ORIGIN_BOUND, p2p=True)
    size = sum(c.size_bytes for c in chunks)
    assert one["wall_s"] == pytest.approx(size / ORIGIN_BOUND.origin)  # S3-bound: size / egress
    assert (alone["origin_bytes"], alone["wall_s"]) == (4 * size, pytest.approx(4 * one["wall_s"]))
    assert (shared["origin_bytes"], shared["peer_bytes"]) == (size, 3 * size)
    assert one["wall_s"] < shared["wall_s"] < alone["wall_s"]


def test_the_node_cache_daemonset_runs_the_chunk_server_the_workers_peer_urls_point_at():
    rendered = subprocess.run(["kubectl", "kustomize", str(Path(__file__).parents[3] / "infra/k8s/node-cache")],
                              capture_output=True, text=True, check=True, timeout=60).stdout
    (daemonset,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    args = _parser().parse_args([a.replace("$(NODE_NAME)", "ip-10-0-0-1") for a in container["args"]])
    assert (args.command, args.action, args.node) == ("node-cache", "serve", "ip-10-0-0-1")
    template = Settings.model_fields["node_cache_peer_url_template"].default
    assert template.format(node_ip="10.0.0.1") == f"http://10.0.0.1:{container['ports'][0]['hostPort']}" == f"http://10.0.0.1:{args.port}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TIDEPLANE_NODE_CACHE_DIR"] == container["volumeMounts"][0]["mountPath"] == str(Settings.model_fields["node_cache_dir"].default)


def test_an_orphan_chunk_of_a_stager_in_flight_is_not_evicted():
    index = index_of(cached("a", "1.0.0", [chunk(1, 50)], 1.0))
    index.chunks[chunk(9).sha256] = 10  # fetched by another stager whose version is not recorded yet
    plan = eviction_plan(index, [chunk(2, 50)], capacity_bytes=60, pinned=set())
    assert (plan.versions, plan.chunks) == (["a@1.0.0"], [chunk(1).sha256])


def test_a_model_or_version_cannot_leave_the_cache_directory():
    files = [{"uri": "s3://b/k", "sha256": "ab" * 32}]
    with pytest.raises(ValueError):
        NodeCacheRequest(model="../etc", version="1.0.0", files=files, node="n", stagers=["n"])
    with pytest.raises(ValueError):
        NodeCacheRequest(model="llama", version="1.0.0/../../x", files=files, node="n", stagers=["n"])
    assert NodeCacheRequest(model="llama-3.1", version="1.0.0+build.5", files=files, node="n", stagers=["n"]).version
