"""S3 (or moto): one boto3 client per worker, the one ``s3://`` URI parser, and the one ranged
read that streams an object in order while fetching chunks in parallel (staging weights into
the model cache and checksumming registry files both hash through it)."""

from __future__ import annotations

import concurrent.futures
import hashlib
from collections import deque
from typing import Callable, Collection, Iterator
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

CHUNK_BYTES = 8 * 1024 * 1024
PARALLEL_FETCHES = 4  # ranges in flight per object; they are returned strictly in order
NOT_FOUND = frozenset({"404", "NoSuchKey", "NoSuchBucket", "NotFound"})


class ObjectChanged(Exception):
    """A ranged read could not return the object as it was when first seen (rewritten, or cut short)."""


def parse_s3_uri(uri: str, prefix: bool = False) -> tuple[str, str]:
    """``s3://bucket/path/key`` -> ``("bucket", "path/key")``; ValueError when not an S3 object URI.

    ``prefix=True`` also accepts ``s3://bucket/``, ``s3://bucket/dir/`` (a folder of objects).
    """
    parsed = urlparse(uri)
    key = parsed.path.lstrip("/")
    if parsed.scheme != "s3" or not parsed.netloc or (not prefix and (not key or key.endswith("/"))):
        raise ValueError(f"expected s3://bucket/{'prefix' if prefix else 'key'}, got {uri!r}")
    return parsed.netloc, key


class BucketNotAllowed(ValueError):
    """An s3:// location outside the buckets weights may come from (TIDEPLANE_WEIGHTS_BUCKETS)."""


def require_allowed_bucket(bucket: str, allowed: Collection[str] | None, what: str) -> None:
    """Refuse ``bucket`` unless it is in ``allowed`` (None: no restriction), naming it and ``what`` used it."""
    if allowed is not None and bucket not in allowed:
        raise BucketNotAllowed(
            f"{what}: bucket {bucket!r} is not an allowed weights bucket "
            f"(TIDEPLANE_WEIGHTS_BUCKETS: {', '.join(sorted(allowed))})"
        )


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3Client:
    """The worker's S3 client (boto3 clients are thread-safe: one per process is enough)."""

    def __init__(
        self,
        endpoint_url: str | None,
        region: str,
        max_pool_connections: int = 32,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
    ) -> None:
        """Credentials: boto3's default chain (environment, IRSA, instance profile) unless given."""
        self.boto = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=Config(
                connect_timeout=5,
                read_timeout=60,
                retries={"max_attempts": 5, "mode": "standard"},
                max_pool_connections=max_pool_connections,
            ),
        )

    def read_range(self, bucket: str, key: str, etag: str, start: int, end: int) -> bytes:
        """Bytes ``start..end-1``, pinned to the ETag so a changed object cannot be spliced in."""
        try:
            resp = self.boto.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=etag)
        except ClientError as exc:
            if error_code(exc) in {"PreconditionFailed", "412"}:
                raise ObjectChanged(f"s3://{bucket}/{key} changed while being read (ETag {etag})") from None
            raise
        with resp["Body"] as body:
            data = body.read()
        if len(data) != end - start:
            raise ObjectChanged(f"short read of s3://{bucket}/{key} bytes {start}-{end - 1}: got {len(data)}")
        return data

    def stream(
        self, bucket: str, key: str, etag: str, size: int, start: int = 0,
        chunk: int = CHUNK_BYTES, parallel: int = PARALLEL_FETCHES,
    ) -> Iterator[bytes]:
        """The object from ``start`` in ``chunk``-sized pieces, in order, ``parallel`` ranges in flight."""
        ranges = iter([(s, min(s + chunk, size)) for s in range(start, size, chunk)])
        with concurrent.futures.ThreadPoolExecutor(parallel, thread_name_prefix="s3-range") as pool:
            window = deque(pool.submit(self.read_range, bucket, key, etag, *r) for _, r in zip(range(parallel), ranges))
            try:
                while window:
                    data = window.popleft().result()
                    if (r := next(ranges, None)) is not None:
                        window.append(pool.submit(self.read_range, bucket, key, etag, *r))
                    yield data
            finally:
                for fut in window:
                    fut.cancel()

    def sha256(self, bucket: str, key: str, progress: Callable[[int], object] = lambda n: None) -> tuple[str, str]:
        """(sha256 hex, ETag) of an object, streamed (never held whole in memory); ClientError
        with a NOT_FOUND code when it does not exist, ObjectChanged when rewritten meanwhile."""
        head = self.boto.head_object(Bucket=bucket, Key=key)
        digest = hashlib.sha256()
        for data in self.stream(bucket, key, head["ETag"], head["ContentLength"]):
            digest.update(data)
            progress(len(data))
        return digest.hexdigest(), head["ETag"]
