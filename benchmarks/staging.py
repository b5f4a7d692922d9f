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
import time
from pathlib import Path
from typing import TextIO

import boto3
from temporalio.testing import ActivityEnvironment

from benchmarks.scaling import markdown_table as _table
from benchmarks.scaling import write_csv
from infra.sandbox.ports import free_port, wait_for_port
from workers.progress import ProgressLine
from workers.wording import counted
from workflows.rollout.activities import StageWeightsInput, WeightFile

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
    from activities.rollout import RolloutActivities, ServingPods

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


def markdown_table(table: list[dict]) -> str:
    return _table(table, COLUMNS)
