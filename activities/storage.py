"""S3 side of the rollout: stage model weights into the model cache that serving pods mount.

Weights are tens of GiB, so staging hashes while it downloads (no second pass over the data)
and survives a crash or retry without fetching again what it already verified: each file is
fetched in ranged chunks into ``<file>.partial`` and a sidecar ``<file>.partial.json`` records
the object's ETag and the SHA-256 of every chunk written. A retry re-reads the local prefix
(checking each chunk against its recorded digest, which also rebuilds the running file hash)
and fetches only from the first unverified byte. hashlib state cannot be serialised, which is
why the prefix is re-hashed from local disk rather than carried in the checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import time
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from workers.config import settings
from workflows.rollout.activities import STAGE_WEIGHTS, StagedWeights, StageWeightsInput, WeightFile

CHUNK_BYTES = 8 * 1024 * 1024
PARALLEL_FETCHES = 4  # chunks in flight; they are hashed and written strictly in order
_NOT_FOUND = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}


@functools.cache
def _client(endpoint_url: str | None, region: str):
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        config=Config(
            connect_timeout=5,
            read_timeout=60,
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=PARALLEL_FETCHES * 2,
        ),
    )


def s3_client():
    """The process's S3 client for the current settings (boto3 clients are thread-safe)."""
    s = settings()
    return _client(s.aws_endpoint_url, s.aws_region)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/path/key`` -> ``("bucket", "path/key")``; ValueError when not an S3 object URI."""
    parsed = urlparse(uri)
    key = parsed.path.lstrip("/")
    if parsed.scheme != "s3" or not parsed.netloc or not key or key.endswith("/"):
        raise ValueError(f"expected s3://bucket/key, got {uri!r}")
    return parsed.netloc, key


def _safe_component(value: str, field: str) -> str:
    if not value or value in {".", ".."} or "/" in value or "\\" in value:
        raise ApplicationError(f"{field} {value!r} cannot be a directory name in the model cache", non_retryable=True)
    return value


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class _Progress:
    """Bytes staged across all files, reported as heartbeat details (survive into the next attempt)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.resumed = 0
        self.files: dict[str, int] = {}

    def advance(self, uri: str, offset: int, nbytes: int) -> None:
        self.done += nbytes
        self.files[uri] = offset
        activity.heartbeat({"bytes_done": self.done, "bytes_total": self.total, "verified": self.files})


def _head(client, bucket: str, key: str) -> dict:
    """HEAD the object; a missing bucket or key fails the rollout, naming it."""
    try:
        return client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if _error_code(exc) not in _NOT_FOUND:
            raise
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if _error_code(exc) in _NOT_FOUND:
            raise ApplicationError(f"weights bucket {bucket!r} not found (s3://{bucket}/{key})", non_retryable=True) from None
        raise
    raise ApplicationError(f"weights object not found: s3://{bucket}/{key}", non_retryable=True)


def _resume_prefix(partial: Path, sidecar: Path, etag: str, hasher) -> list[str]:
    """Re-hash the verified local prefix; return its chunk digests (empty: start from zero).

    The prefix is trusted only if the object is unchanged (same ETag) and every chunk on disk
    still has the digest recorded when it was fetched; the file is truncated after the last good
    chunk, so a torn write at crash time costs one chunk, not the file.
    """
    try:
        state = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        state = None
    if not partial.exists() or not state or state.get("etag") != etag or state.get("chunk_bytes") != CHUNK_BYTES:
        partial.unlink(missing_ok=True)
        return []
    good: list[str] = []
    with partial.open("rb") as f:
        for expected in state.get("chunks", []):
            data = f.read(CHUNK_BYTES)
            if hashlib.sha256(data).hexdigest() != expected:
                break
            hasher.update(data)
            good.append(expected)
    with partial.open("r+b") as f:
        f.truncate(min(len(good) * CHUNK_BYTES, partial.stat().st_size))
    return good


def _write_sidecar(sidecar: Path, etag: str, chunks: list[str]) -> None:
    tmp = sidecar.with_suffix(".tmp")
    tmp.write_text(json.dumps({"etag": etag, "chunk_bytes": CHUNK_BYTES, "chunks": chunks}))
    os.replace(tmp, sidecar)


def _fetch(client, bucket: str, key: str, etag: str, start: int, end: int) -> bytes:
    """One ranged GET, pinned to the ETag so a changed object cannot be spliced into the file."""
    try:
        resp = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=etag)
    except ClientError as exc:
        if _error_code(exc) in {"PreconditionFailed", "412"}:
            raise ApplicationError(f"s3://{bucket}/{key} changed during staging (ETag {etag}); restarting") from None
        raise
    with resp["Body"] as body:
        data = body.read()
    if len(data) != end - start:
        raise ApplicationError(f"short read of s3://{bucket}/{key} bytes {start}-{end - 1}: got {len(data)}")
    return data


def _stage_file(client, pool, wf: WeightFile, dest: Path, head: dict, progress: _Progress) -> None:
    bucket, key = parse_s3_uri(wf.uri)
    size = head["ContentLength"]
    etag = head["ETag"]
    partial = dest.with_name(dest.name + ".partial")
    sidecar = dest.with_name(dest.name + ".partial.json")
    hasher = hashlib.sha256()
    chunks = _resume_prefix(partial, sidecar, etag, hasher)
    offset = min(len(chunks) * CHUNK_BYTES, size)
    if offset:
        activity.logger.info("resuming %s at byte %d of %d (verified by an earlier attempt)", wf.uri, offset, size)
    progress.resumed += offset
    progress.advance(wf.uri, offset, offset)

    ranges = [(s, min(s + CHUNK_BYTES, size)) for s in range(offset, size, CHUNK_BYTES)]
    with partial.open("ab") as out:
        window: list[concurrent.futures.Future] = []
        pending = iter(ranges)
        for _ in range(PARALLEL_FETCHES):
            if (r := next(pending, None)) is not None:
                window.append(pool.submit(_fetch, client, bucket, key, etag, *r))
        try:
            while window:
                data = window.pop(0).result()
                if (r := next(pending, None)) is not None:
                    window.append(pool.submit(_fetch, client, bucket, key, etag, *r))
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
                hasher.update(data)
                chunks.append(hashlib.sha256(data).hexdigest())
                _write_sidecar(sidecar, etag, chunks)
                offset += len(data)
                progress.advance(wf.uri, offset, len(data))
        finally:
            for fut in window:
                fut.cancel()

    actual = hasher.hexdigest()
    if actual != wf.sha256:
        partial.unlink(missing_ok=True)
        sidecar.unlink(missing_ok=True)
        raise ApplicationError(
            f"checksum mismatch for {wf.uri}: expected sha256 {wf.sha256}, actual {actual}",
            {"uri": wf.uri, "expected": wf.sha256, "actual": actual},
            type="ChecksumMismatch",
            non_retryable=True,
        )
    os.replace(partial, dest)
    _verified_marker(dest).write_text(f"{actual} {size}\n")
    sidecar.unlink(missing_ok=True)


def _verified_marker(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


def _already_staged(dest: Path, wf: WeightFile) -> int | None:
    """Size of a file staged and verified by an earlier run against this digest, else None."""
    try:
        digest, size = _verified_marker(dest).read_text().split()
        if digest == wf.sha256 and dest.stat().st_size == int(size):
            return int(size)
    except (OSError, ValueError):
        pass
    return None


@contextlib.contextmanager
def _staging_lock(directory: Path):
    """One attempt at a time per version: an attempt Temporal timed out may still be writing."""
    with (directory.parent / f".{directory.name}.staging.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ApplicationError(f"{directory} is being staged by another attempt; retrying later") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@activity.defn(name=STAGE_WEIGHTS)
def stage_weights(req: StageWeightsInput) -> StagedWeights:
    """Download and verify every weights file into ``<model_cache_dir>/<model>/<version>/``."""
    started = time.monotonic()
    directory = settings().model_cache_dir / _safe_component(req.model, "model") / _safe_component(req.version, "version")
    targets: dict[str, WeightFile] = {}
    for wf in req.files:
        try:
            _, key = parse_s3_uri(wf.uri)
        except ValueError as exc:
            raise ApplicationError(str(exc), non_retryable=True) from None
        name = PurePosixPath(key).name
        if name in targets:
            raise ApplicationError(f"two weights files would both be staged as {name!r}: {targets[name].uri}, {wf.uri}", non_retryable=True)
        targets[name] = wf

    previous = activity.info().heartbeat_details
    if previous:
        activity.logger.info("retrying staging; last attempt reported %s", previous[0])

    client = s3_client()
    staged = {name: _already_staged(directory / name, wf) for name, wf in targets.items()}
    heads = {name: _head(client, *parse_s3_uri(wf.uri)) for name, wf in targets.items() if staged[name] is None}
    total = sum(size for size in staged.values() if size is not None) + sum(h["ContentLength"] for h in heads.values())
    progress = _Progress(total)
    directory.mkdir(parents=True, exist_ok=True)
    with _staging_lock(directory), concurrent.futures.ThreadPoolExecutor(PARALLEL_FETCHES, thread_name_prefix="stage") as pool:
        for name, wf in targets.items():
            if staged[name] is not None:
                progress.resumed += staged[name]
                progress.advance(wf.uri, staged[name], staged[name])
                continue
            _stage_file(client, pool, wf, directory / name, heads[name], progress)
    return StagedWeights(
        path=str(directory),
        size_bytes=total,
        resumed_bytes=progress.resumed,
        seconds=time.monotonic() - started,
    )


ACTIVITIES = [stage_weights]
