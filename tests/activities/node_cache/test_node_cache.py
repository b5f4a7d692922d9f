"""Staging onto nodes' caches (activities/node_cache/) against moto over HTTP, with each node's
chunk server on a real port, asking the node cache's secret or a version's token as in production:
peers share chunks, every chunk is verified, a delta moves only what changed, a corrupt peer is
refused, a version's token reads that version only."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import boto3
import httpx
import pytest

from activities.clients.s3 import S3Client
from activities.node_cache.access import version_token
from activities.node_cache.chunk_server import ChunkServer, cache_metrics, node_cache_index
from activities.node_cache.cache import NodeCache
from activities.node_cache.stager import NodeCacheStager
from workflows.core.versions import WeightFile
from workflows.node_cache.contract import NodeCacheRequest, Peer

BUCKET = "node-cache-test"
SECRET = "node-cache-secret"
FILE_BYTES = 64 * 1024


@pytest.fixture
def s3(moto_url) -> S3Client:
    client = S3Client(moto_url, "us-east-1")
    client.boto.create_bucket(Bucket=BUCKET)
    return client


def upload(s3: S3Client, version: str, contents: list[bytes]) -> list[WeightFile]:
    files = []
    for i, data in enumerate(contents):
        key = f"m/{version}/model-{i:05d}.safetensors"
        s3.boto.put_object(Bucket=BUCKET, Key=key, Body=data)
        files.append(WeightFile(uri=f"s3://{BUCKET}/{key}", sha256=hashlib.sha256(data).hexdigest()))
    return files


class Node:
    def __init__(self, root: Path, name: str, s3: S3Client) -> None:
        self.name = name
        self.cache = NodeCache(root / name)
        self.server = ChunkServer(("127.0.0.1", 0), self.cache, name, secret=SECRET)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.s3 = s3

    def stage(self, req: NodeCacheRequest):
        """As the version's staging pod does: with that version's token only."""
        return NodeCacheStager(self.cache, self.s3, token=version_token(SECRET, req.model, req.version)).stage(req)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def nodes(tmp_path, s3):
    made = [Node(tmp_path, f"node-{i}", s3) for i in range(3)]
    yield made
    for node in made:
        node.close()


def stage_all(nodes: list[Node], model: str, version: str, files: list[WeightFile]) -> list:
    reports: list = [None] * len(nodes)
    errors: list = []

    def run(i: int, node: Node) -> None:
        req = NodeCacheRequest(
            model=model, version=version, files=files, node=node.name, stagers=[n.name for n in nodes],
            peers=[Peer(node=n.name, url=n.server.url) for n in nodes if n is not node], peer_wait_seconds=10,
        )
        try:
            reports[i] = node.stage(req)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, n)) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return reports


def test_three_nodes_read_the_model_from_s3_once_and_the_rest_from_each_other(s3, nodes):
    contents = [os.urandom(FILE_BYTES) for _ in range(12)]
    files = upload(s3, "1.0.0", contents)
    reports = stage_all(nodes, "m", "1.0.0", files)
    size = FILE_BYTES * 12
    assert sum(r.origin_bytes for r in reports) == size  # each chunk read from S3 by one node
    assert sum(r.peer_bytes for r in reports) == 2 * size  # the other two got it from a peer
    assert sum(n.server.served_bytes for n in nodes) == 2 * size
    for node in nodes:
        directory = node.cache.version_dir("m", "1.0.0")
        assert [(directory / f"model-{i:05d}.safetensors").read_bytes() for i in range(12)] == contents
        assert node.cache.read_index().versions["m@1.0.0"].size_bytes == size


def test_a_new_version_that_changes_one_file_moves_only_that_file(s3, nodes):
    contents = [os.urandom(FILE_BYTES) for _ in range(30)]
    stage_all(nodes, "m", "1.0.0", upload(s3, "1.0.0", contents))
    changed = [*contents[:29], os.urandom(FILE_BYTES)]
    reports = stage_all(nodes, "m", "1.1.0", upload(s3, "1.1.0", changed))
    assert sum(r.origin_bytes for r in reports) == FILE_BYTES
    assert sum(r.origin_bytes + r.peer_bytes for r in reports) == 3 * FILE_BYTES
    assert all(r.reused_bytes == 29 * FILE_BYTES for r in reports)
    last = nodes[0].cache.version_dir("m", "1.1.0") / "model-00029.safetensors"
    assert last.read_bytes() == changed[29] and os.stat(last).st_nlink == 2  # the chunk and the version's link


def test_a_peer_serving_other_bytes_is_refused_and_s3_read_instead(s3, tmp_path):
    data = os.urandom(FILE_BYTES)
    files = upload(s3, "2.0.0", [data])
    liar = Node(tmp_path, "liar", s3)
    honest = Node(tmp_path, "honest", s3)
    try:
        digest = files[0].sha256
        path = liar.cache.chunk_path(digest)  # the liar claims the chunk but holds other bytes
        path.parent.mkdir(parents=True)
        path.write_bytes(os.urandom(FILE_BYTES))
        path.with_name(digest + ".sha256").write_text(f"{digest} {FILE_BYTES}\n")
        liar.cache.add_chunk(digest, FILE_BYTES)
        req = NodeCacheRequest(model="m", version="2.0.0", files=files, node="honest", stagers=["honest"],
                               peers=[Peer(node="liar", url=liar.server.url)])
        report = honest.stage(req)
        assert (report.peer_bytes, report.origin_bytes) == (0, FILE_BYTES)
        assert (honest.cache.version_dir("m", "2.0.0") / "model-00000.safetensors").read_bytes() == data
    finally:
        liar.close()
        honest.close()


def test_the_chunk_server_shows_what_the_node_holds(s3, nodes):
    files = upload(s3, "3.0.0", [os.urandom(1000), os.urandom(2000)])
    stage_all(nodes[:1], "m", "3.0.0", files)
    text = httpx.get(f"{nodes[0].server.url}/metrics").text
    assert 'tideplane_node_cache_bytes{node="node-0",model="m",version="3.0.0"} 3000' in text
    assert text == cache_metrics("node-0", nodes[0].cache.read_index(), 0)
    assert httpx.get(f"{nodes[0].server.url}/chunks/{'0' * 64}", headers={"Authorization": f"Bearer {SECRET}"}).status_code == 404


def test_a_version_token_reads_that_version_only_and_no_token_reads_nothing(tmp_path, s3):
    """hostPort 8470 is reachable from the node network: a peer holding version A's token (all its
    staging pod gets) neither reads B's chunks (403) nor sees B in /index; a chunk both versions
    share is A's too; no token, a wrong or forged one is 401; the secret itself (the CLI) sees all;
    staging A from the holder with A's token still works."""
    shared, only_a, only_b = b"shared" * 1000, b"only-a" * 1000, b"only-b" * 1000
    files_a, files_b = upload(s3, "a", [shared, only_a]), upload(s3, "b", [shared, only_b])
    holder, fetcher = Node(tmp_path, "holder", s3), Node(tmp_path, "fetcher", s3)
    try:
        for version, files in (("a", files_a), ("b", files_b)):
            holder.stage(NodeCacheRequest(model="m", version=version, files=files, node="holder", stagers=["holder"]))
        token_a = version_token(SECRET, "m", "a")
        as_a = {"Authorization": f"Bearer {token_a}"}
        chunks = f"{holder.server.url}/chunks/"
        assert httpx.get(chunks + files_b[1].sha256, headers=as_a).status_code == 403
        assert httpx.get(chunks + files_a[1].sha256, headers=as_a).content == only_a
        assert httpx.get(chunks + files_a[0].sha256, headers=as_a).content == shared
        seen_by_a = node_cache_index(holder.server.url, token=token_a)
        assert list(seen_by_a.versions) == ["m@a"] and set(seen_by_a.chunks) == {f.sha256 for f in files_a}
        forged = "m@b:" + token_a.rpartition(":")[2]
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {forged}"}, {"Authorization": token_a}):
            for path in ("/index", f"/chunks/{files_a[1].sha256}"):
                assert httpx.get(holder.server.url + path, headers=headers).status_code == 401, (headers, path)
        assert set(node_cache_index(holder.server.url, token=SECRET).versions) == {"m@a", "m@b"}
        assert httpx.get(holder.server.url + "/healthz").status_code == 200

        report = fetcher.stage(NodeCacheRequest(
            model="m", version="a", files=files_a, node="fetcher", stagers=["holder", "fetcher"],
            peers=[Peer(node="holder", url=holder.server.url)], peer_wait_seconds=5))
        assert (report.peer_bytes, report.origin_bytes) == (len(shared) + len(only_a), 0)
    finally:
        holder.close()
        fetcher.close()
