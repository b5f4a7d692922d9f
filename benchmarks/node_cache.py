"""Staging benchmark: the ``stage_weights`` activity against a plain boto3 download of the same objects.

The bench starts its own moto S3 server, uploads a random weight set (``files`` objects,
``size_bytes`` in all), then times, best of ``repeats``: boto3's ``download_file`` (s3transfer,
multipart, no hashing) and ``stage_weights`` run through ``temporalio.testing.ActivityEnvironment``
(ranged chunks, SHA-256 while downloading, fsync + sidecar per chunk). Then it interrupts a
staging run at 50 % (a heartbeat that raises, as a worker crash would end the attempt) and times
the retry, which must fetch only the unverified half. Local files are deleted after each run, so
disk use stays at one copy of the weight set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import boto3
from temporalio.testing import ActivityEnvironment

from activities.clients.s3 import S3Client
from activities.node_cache.chunk_server import ChunkServer
from activities.node_cache.cache import NodeCache
from activities.node_cache.stager import NodeCacheStager
from benchmarks.scaling import markdown_table as _table
from benchmarks.scaling import write_csv
from infra.sandbox.ports import free_port, wait_for_port
from workers.cli.progress import ProgressLine
from workers.cli.wording import counted
from workflows.rollout.contract import StageWeightsInput
from workflows.core.versions import WeightFile
from workflows.node_cache.contract import NodeCacheRequest, Peer
from workflows.node_cache.chunks import Chunk, fetch_order, next_fetch

BUCKET = "tideplane-bench"
# The bench's own moto, given explicitly: a sourced sandbox env file (AWS_ENDPOINT_URL, AWS_*) must not redirect it.
MOTO_CREDENTIALS = {"region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
COLUMNS = ["measure", "value", "unit"]


class _RandomStream:
    """File-like random bytes of a fixed length, hashed as they are read (nothing kept in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = os.urandom(n)
        self.left -= n
        self.sha.update(data)
        return data


class Interrupted(Exception):
    """Raised from a heartbeat to end a staging attempt halfway, like a worker crash."""


def _upload(s3, files: int, size_bytes: int, progress: ProgressLine) -> list[WeightFile]:
    s3.create_bucket(Bucket=BUCKET)
    out = []
    per_file = size_bytes // files
    for i in range(files):
        stream = _RandomStream(per_file + (size_bytes % files if i == files - 1 else 0))
        key = f"bench/1.0.0/model-{i:05d}-of-{files:05d}.safetensors"
        s3.upload_fileobj(stream, BUCKET, key, Callback=progress)
        out.append(WeightFile(uri=f"s3://{BUCKET}/{key}", sha256=stream.sha.hexdigest()))
    progress.close()
    return out


def _boto3_download(s3, files: list[WeightFile], dest: Path, progress: ProgressLine) -> float:
    dest.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for wf in files:
        key = wf.uri.split("/", 3)[3]
        s3.download_file(BUCKET, key, str(dest / Path(key).name), Callback=progress)
    seconds = time.perf_counter() - started
    progress.close()
    return seconds


def _stager(endpoint: str, cache: Path):
    """The rollout activities with S3 at ``endpoint`` and the model cache at ``cache`` (the other clients unused)."""
    from kubernetes import client

    from activities.clients.kube import KubeClient
    from activities.clients.prometheus import PrometheusClient
    from activities.clients.s3 import S3Client
    from activities.clients.vllm import VllmClient
    from activities.rollout.rollout_activities import RolloutActivities
    from activities.rollout.serving_pods import ServingPods

    s3 = S3Client(
        endpoint, MOTO_CREDENTIALS["region_name"],
        access_key_id=MOTO_CREDENTIALS["aws_access_key_id"], secret_access_key=MOTO_CREDENTIALS["aws_secret_access_key"],
    )
    return RolloutActivities(
        KubeClient(client.ApiClient()), s3, PrometheusClient("http://127.0.0.1:9"),
        VllmClient(), ServingPods(model_cache_dir=cache), "inference-gateway", "http://{service}.{namespace}:8000",
    )


def _stage(stager, files: list[WeightFile], version: str, progress: ProgressLine, stop_at: int | None = None):
    """Run stage_weights once; ``stop_at`` bytes: end the attempt there (returns None)."""
    env = ActivityEnvironment()

    def beat(details) -> None:
        progress(details["bytes_done"] - progress.done)  # heartbeats carry the running total
        if stop_at is not None and details["bytes_done"] >= stop_at:
            raise Interrupted(f"interrupted at {details['bytes_done']} bytes")

    env.on_heartbeat = lambda *d: beat(d[0])
    started = time.perf_counter()
    try:
        result = env.run(stager.stage_weights, StageWeightsInput(model="bench", version=version, files=files))
    except Interrupted:
        return None, time.perf_counter() - started
    finally:
        progress.close()
    return result, time.perf_counter() - started


def run(
    out_dir: Path | None, size_bytes: int = 2 * 2**30, files: int = 4, repeats: int = 2, workdir: Path | None = None,
    progress_stream: TextIO | None = None,
) -> list[dict]:
    """Runs the bench; a progress line per phase (bytes, rate, ETA) on ``progress_stream``
    (default stderr) when it is a terminal, nothing otherwise."""

    def progress(what: str) -> ProgressLine:
        return ProgressLine(what, size_bytes, stream=progress_stream)

    work = Path(tempfile.mkdtemp(prefix="tideplane-staging-", dir=workdir))
    port = free_port()
    moto = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for_port(port)
        s3 = boto3.client("s3", endpoint_url=endpoint, **MOTO_CREDENTIALS)
        weights = _upload(s3, files, size_bytes, progress("upload to moto"))
        stager = _stager(endpoint, work / "cache")
        plain, staged = [], []
        for i in range(repeats):
            plain.append(_boto3_download(s3, weights, work / "plain", progress(f"boto3 download_file, run {i + 1}")))
            shutil.rmtree(work / "plain")
            result, seconds = _stage(stager, weights, f"run{i}", progress(f"stage_weights, run {i + 1}"))
            if result is None or result.size_bytes != size_bytes or result.resumed_bytes:
                raise RuntimeError(f"staging run {i} did not stage the whole set from scratch: {result}")
            staged.append(seconds)
            shutil.rmtree(work / "cache")
        _, first = _stage(stager, weights, "resume", progress("stage_weights, interrupted at 50 %"), stop_at=size_bytes // 2)
        resumed, second = _stage(stager, weights, "resume", progress("stage_weights, the retry"))
        if resumed is None or resumed.size_bytes != size_bytes:
            raise RuntimeError(f"the retry after the interruption did not finish: {resumed}")
        shutil.rmtree(work / "cache")
    finally:
        moto.terminate()
        moto.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    mib = size_bytes / 2**20
    table = [
        {"measure": "weight set", "value": f"{mib / 1024:.2f} GiB in {counted(files, 'file')}", "unit": ""},
        {"measure": "plain boto3 download_file (best)", "value": f"{mib / min(plain):.0f}", "unit": "MiB/s"},
        {"measure": "stage_weights, hashing + fsync (best)", "value": f"{mib / min(staged):.0f}", "unit": "MiB/s"},
        {"measure": "throughput ratio stage_weights / boto3 (goal >= 0.9)", "value": f"{min(plain) / min(staged):.2f}", "unit": ""},
        {"measure": "full staging", "value": f"{min(staged):.1f}", "unit": "s"},
        {"measure": "attempt interrupted at 50 %", "value": f"{first:.1f}", "unit": "s"},
        {"measure": "retry after the interruption", "value": f"{second:.1f}", "unit": "s"},
        {"measure": "bytes verified from disk, not fetched again", "value": f"{resumed.resumed_bytes / 2**20:.0f} of {mib:.0f}", "unit": "MiB"},
    ]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(out_dir / "staging.csv", table, COLUMNS)
        (out_dir / "staging.md").write_text(
            f"moto S3 server on 127.0.0.1 (same machine), repeats {repeats}, runs: boto3 {', '.join(f'{t:.1f}s' for t in plain)}; "
            f"stage_weights {', '.join(f'{t:.1f}s' for t in staged)}\n\n" + markdown_table(table) + "\n"
        )
    return table


def markdown_table(table: list[dict], columns: list[str] = COLUMNS) -> str:
    return _table(table, columns)


# ---- N nodes: peer-to-peer vs S3 alone (``tideplane bench staging --nodes N ...``) ------------------
#
# Two halves. *Measured*: N node stagers (activities/node_cache/stager.py, the staging pods' code) in
# threads of this process, each with its own cache directory and chunk server on a loopback port,
# stage a small 30-file model from the bench's moto; origin bytes are counted where S3 answers
# (every ranged read), not by the stagers. Wall times here are CPU-bound on a shared 2-core machine
# (hashing, moto), so they say little about a network. *Modelled*: the same pure decisions
# (workflows/node_cache/chunks.py ``fetch_order`` / ``next_fetch``) replayed in an event-driven transfer
# model with links of a real cluster (S3 egress shared by all readers, each node's NIC), which is
# where the wall-time goal is judged.

NODE_COLUMNS = ["part", "nodes", "mode", "model", "origin_bytes", "origin_x_model", "peer_bytes", "wall_s", "x_one_node"]
MODEL_FILES = 30


@dataclass(frozen=True)
class Links:
    """Bandwidths of the modelled cluster, bytes/s."""

    origin: float  # S3 to the cluster, shared by every concurrent reader (egress / endpoint limit)
    node: float  # one node's NIC, each way (a node reads one chunk at a time, as the stager does)


ORIGIN_BOUND = Links(origin=10e9 / 8, node=25e9 / 8)  # 10 Gbit/s from S3, 25 Gbit/s NICs
FAST_ORIGIN = Links(origin=100e9 / 8, node=25e9 / 8)  # sensitivity: S3 faster than any one NIC


def simulate_pool(nodes: int, chunks: list[Chunk], links: Links, p2p: bool) -> dict:
    """Wall time and origin/peer bytes for ``nodes`` staging ``chunks`` at once: each node runs the
    stager's decisions; rates are shared fairly (S3 among its readers, a node's uplink among its
    uploads) and constant between events, so time jumps from one completion to the next (exact)."""
    names = [f"node-{i}" for i in range(nodes)]
    held: dict[str, set[str]] = {n: set() for n in names}
    pending = {n: fetch_order(chunks, n, names) if p2p else list(chunks) for n in names}
    active: dict[str, list] = {}  # node -> [chunk, source (None: S3), bytes left]
    moved = {"origin": 0, "peer": 0}
    clock = 0.0
    while active or any(pending.values()):
        holders: dict[str, list[str]] = {}
        for n in names:
            for digest in held[n]:
                holders.setdefault(digest, []).append(n)
        for n in names:
            if n in active or not pending[n]:
                continue
            choice = next_fetch(pending[n], n, names if p2p else [n], holders if p2p else {}, stalled=False)
            if choice is not None:
                chunk, source = choice
                pending[n].remove(chunk)
                active[n] = [chunk, source, float(chunk.size_bytes)]
        readers = sum(1 for _, source, _ in active.values() if source is None)
        uploads = Counter(source for _, source, _ in active.values() if source is not None)
        rates = {n: min(links.node, links.origin / readers if source is None else links.node / uploads[source])
                 for n, (_, source, _) in active.items()}
        step = min(left / rates[n] for n, (_, _, left) in active.items())
        clock += step
        for n in list(active):
            chunk, source, left = active[n]
            left -= rates[n] * step
            if left <= 1e-6 * chunk.size_bytes:
                held[n].add(chunk.sha256)
                moved["peer" if source else "origin"] += chunk.size_bytes
                del active[n]
            else:
                active[n][2] = left
    return {"wall_s": clock, "origin_bytes": moved["origin"], "peer_bytes": moved["peer"]}


def model_chunks(size_bytes: int, files: int = MODEL_FILES) -> list[Chunk]:
    return [Chunk(name=f"model-{i:05d}.safetensors", sha256=hashlib.sha256(f"{size_bytes}/{i}".encode()).hexdigest(),
                  size_bytes=size_bytes // files) for i in range(files)]


class _CountingS3(S3Client):
    """The bench's S3 client, counting every byte S3 returns (the origin bytes, measured at the source)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read_bytes = 0
        self._lock = threading.Lock()

    def read_range(self, bucket: str, key: str, etag: str, start: int, end: int) -> bytes:
        data = super().read_range(bucket, key, etag, start, end)
        with self._lock:
            self.read_bytes += len(data)
        return data


def _stage_pool(s3: _CountingS3, root: Path, version: str, files: list[WeightFile], nodes: int, p2p: bool) -> dict:
    """N real stagers at once (threads), each with its cache and chunk server; S3's answered bytes counted."""
    names = [f"node-{i}" for i in range(nodes)]
    servers = {n: ChunkServer(("127.0.0.1", 0), NodeCache(root / n), n) for n in names}
    for server in servers.values():
        threading.Thread(target=server.serve_forever, daemon=True).start()
    before = s3.read_bytes
    reports, errors = [], []

    def stage(node: str) -> None:
        peers = [Peer(node=n, url=servers[n].url) for n in names if n != node] if p2p else []
        req = NodeCacheRequest(model="bench", version=version, files=files, node=node,
                               stagers=names if p2p else [node], peers=peers)
        try:
            reports.append(NodeCacheStager(servers[node].cache, s3).stage(req))
        except Exception as exc:  # noqa: BLE001 - re-raised below, with the node
            errors.append(f"{node}: {exc}")

    started = time.perf_counter()
    threads = [threading.Thread(target=stage, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    for server in servers.values():
        server.shutdown()
        server.server_close()
    if errors:
        raise RuntimeError(f"staging failed: {errors}")
    return {"wall_s": wall, "origin_bytes": s3.read_bytes - before, "peer_bytes": sum(r.peer_bytes for r in reports)}


def _upload_model(s3, version: str, contents: list[bytes]) -> list[WeightFile]:
    out = []
    for i, data in enumerate(contents):
        key = f"bench-nodes/{version}/model-{i:05d}-of-{len(contents):05d}.safetensors"
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
        out.append(WeightFile(uri=f"s3://{BUCKET}/{key}", sha256=hashlib.sha256(data).hexdigest()))
    return out


def run_nodes(
    out_dir: Path | None, nodes: list[int], measured_bytes: int = 60 * 2**20, modelled_bytes: int = 140 * 10**9,
    workdir: Path | None = None,
) -> list[dict]:
    """The N-node staging bench: measured (small model, this machine) and modelled (a 70B model's
    140 GB on ORIGIN_BOUND and FAST_ORIGIN links), with and without peer-to-peer, plus the delta
    case (one of 30 files changed). Writes staging_nodes.{csv,md,png} under ``out_dir``."""
    table: list[dict] = []

    def row(part: str, n: int, mode: str, size: int, got: dict, one: float | None) -> dict:
        entry = {
            "part": part, "nodes": n, "mode": mode, "model": _size(size), "origin_bytes": got["origin_bytes"],
            "origin_x_model": f"{got['origin_bytes'] / size:.2f}", "peer_bytes": got["peer_bytes"],
            "wall_s": f"{got['wall_s']:.2f}", "x_one_node": f"{got['wall_s'] / one:.2f}" if one else "",
        }
        table.append(entry)
        return entry

    for links, part in ((ORIGIN_BOUND, "modelled, S3 10 Gbit/s, NIC 25 Gbit/s"), (FAST_ORIGIN, "modelled, S3 100 Gbit/s, NIC 25 Gbit/s")):
        chunks = model_chunks(modelled_bytes)
        one = simulate_pool(1, chunks, links, p2p=False)["wall_s"]
        for n in nodes:
            for p2p in (False, True):
                row(part, n, "peer-to-peer" if p2p else "S3 alone", modelled_bytes, simulate_pool(n, chunks, links, p2p), one)

    work = Path(tempfile.mkdtemp(prefix="tideplane-staging-nodes-", dir=workdir))
    port = free_port()
    moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    part = f"measured here (moto + loopback, {_size(measured_bytes)} in {MODEL_FILES} files)"
    try:
        wait_for_port(port)
        boto = boto3.client("s3", endpoint_url=endpoint, **MOTO_CREDENTIALS)
        boto.create_bucket(Bucket=BUCKET)
        contents = [os.urandom(measured_bytes // MODEL_FILES) for _ in range(MODEL_FILES)]
        size = sum(len(c) for c in contents)
        v1 = _upload_model(boto, "1.0.0", contents)
        s3 = _CountingS3(endpoint, MOTO_CREDENTIALS["region_name"], access_key_id=MOTO_CREDENTIALS["aws_access_key_id"],
                         secret_access_key=MOTO_CREDENTIALS["aws_secret_access_key"])
        one = None
        for n in nodes:
            for p2p in (False, True):
                root = work / f"{n}-{p2p}"
                got = _stage_pool(s3, root, "1.0.0", v1, n, p2p)
                one = one or got["wall_s"]
                row(part, n, "peer-to-peer" if p2p else "S3 alone", size, got, one)
                if p2p and n == max(nodes):  # the delta: 1.1.0 changes one file, onto the same caches
                    changed = [*contents[:-1], os.urandom(len(contents[-1]))]
                    delta = _stage_pool(s3, root, "1.1.0", _upload_model(boto, "1.1.0", changed), n, p2p)
                    moved = row(part, n, "delta: 1 of 30 files changed", size, delta, None)
                    moved["model"] = f"{_size(size)}, changed file {_size(len(changed[-1]))}"
                shutil.rmtree(root)
    finally:
        moto.terminate()
        moto.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(out_dir / "staging_nodes.csv", table, NODE_COLUMNS)
        (out_dir / "staging_nodes.md").write_text(
            "Origin (S3) bytes and wall time for N nodes staging one model, with and without peer-to-peer"
            " (benchmarks/node_cache.py). Modelled rows replay the stager's decisions on the stated links;"
            " measured rows run the real stagers on this machine (CPU-bound wall times).\n\n"
            + _table(table, NODE_COLUMNS) + "\n"
        )
        plot_nodes(table, out_dir / "staging_nodes.png")
    return table


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.0f} GB" if nbytes >= 1e9 else f"{nbytes / 2**20:.0f} MiB"


def plot_nodes(table: list[dict], path: Path) -> None:
    """Wall time (x one node) and origin bytes (x model size) against N, per part and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (wall, origin) = plt.subplots(1, 2, figsize=(12, 4.8))
    for part in dict.fromkeys(r["part"] for r in table):
        for mode, style in (("S3 alone", "--"), ("peer-to-peer", "-")):
            rows = [r for r in table if r["part"] == part and r["mode"] == mode]
            if not rows:
                continue
            ns = [r["nodes"] for r in rows]
            label = f"{part.split(' (')[0]}: {mode}"
            wall.plot(ns, [float(r["x_one_node"]) for r in rows], style, marker="o", label=label)
            origin.plot(ns, [float(r["origin_x_model"]) for r in rows], style, marker="o", label=label)
    wall.axhline(2, color="red", lw=0.8, ls=":", label="goal: 8 nodes <= 2x one node")
    origin.axhline(1.2, color="red", lw=0.8, ls=":", label="goal: <= 1.2x model")
    wall.set(xlabel="nodes", ylabel="wall time / one node from S3", title="Wall time")
    origin.set(xlabel="nodes", ylabel="origin bytes / model size", title="Bytes read from S3")
    for ax in (wall, origin):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
