"""The model registry in S3, beside the weights: manifests, indexes, checksums, retention deletes.

``Registry`` is the store (used by the CLI, the demo and the golden sets as well);
``RegistryActivities`` (registry_activities.py) are the activities of workflows/registry/contract.py
on top of it and of the cluster's Deployments.

Layout in the weights bucket (``TIDEPLANE_WEIGHTS_BUCKET``)::

    registry/models.json                      the model names (ModelsIndex)
    registry/<model>/index.json               every version's summary (ModelIndex)
    registry/<model>/<version>/manifest.json  the source of truth (Manifest)
    weights/<model>/<version>/<digest>/<path> weights uploaded by ``register`` from local files,
                                              under their whole-set digest (content-addressed)

Listing reads models.json and one index per model: O(models) GETs, never a bucket scan.

Every write is a compare-and-swap with S3 conditional writes: ``If-None-Match: *`` to create,
``If-Match: <ETag>`` to replace; on 412/409 the writer re-reads, re-applies its change and
retries, so two concurrent writers never lose an update. Registering publishes by the manifest's
create alone: uploads go to the digest's own keys first, so a losing register of other weights
never overwrites the winner's bytes (and removes its own). The manifest is written first; the
index is then brought up to date from it (an entry is only replaced by a higher manifest
revision), so a crash in between leaves a stale index entry that the next write or retry repairs.
moto 5.2.5 honours both headers on put_object (tests/activities/registry/test_registry.py checks it), but its
threaded server checks the condition and stores without a lock in between, so on moto two
writes racing within microseconds could in principle both pass; S3 itself is atomic.
"""

from __future__ import annotations

import hashlib
import random
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Collection, TypeVar

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError
from pydantic import BaseModel

from activities.clients.s3 import (
    CHUNK_BYTES,
    NOT_FOUND,
    BucketNotAllowed,
    ObjectChanged,
    S3Client,
    error_code,
    parse_s3_uri,
    require_allowed_bucket,
)
from workflows.core.versions import Canary, Deprecated, Stable, Testing, semver_key
from workflows.registry.contract import DeleteWeightsResult
from workflows.registry.schema import (
    ANY_DEPLOYMENT,
    AdapterOf,
    BenchmarkResult,
    Manifest,
    ManifestFile,
    ModelIndex,
    ModelsIndex,
    NoQuantization,
    StatusChange,
    VersionSummary,
    Weights,
    place,
    set_digest,
    summarize,
)

PREFIX = "registry"
MODELS_KEY = f"{PREFIX}/models.json"
T = TypeVar("T", bound=BaseModel)
AnyStatus = Testing | Canary | Stable | Deprecated


class RegistryError(Exception):
    """Bad input or state (unknown version, checksum mismatch...): retrying cannot help."""


class NotFound(RegistryError):
    pass


class ChecksumMismatch(RegistryError):
    pass


class BaseNotRegistered(RegistryError):
    """An adapter names a base model version the registry does not hold."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _split(uri: str, prefix: bool = False) -> tuple[str, str]:
    try:
        return parse_s3_uri(uri, prefix=prefix)
    except ValueError as exc:
        raise RegistryError(str(exc)) from None


class BucketRefused(RegistryError):
    pass


def _conflict(exc: ClientError) -> bool:
    """A lost compare-and-swap race (412), a concurrent conditional write (409), or the object
    vanished under an If-Match."""
    return error_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409")


def _missing(exc: ClientError) -> bool:
    return error_code(exc) in NOT_FOUND


class Registry:
    """The registry in one bucket. Thread-safe (boto3 clients are); one per process is enough."""

    def __init__(
        self,
        s3: S3Client,
        bucket: str,
        transfer: TransferConfig | None = None,
        cas_attempts: int = 100,
        delete_batch: int = 1000,
        allowed_buckets: Collection[str] | None = None,
    ):
        """``allowed_buckets``: where registered weights may live (default: ``bucket`` only)."""
        self.s3 = s3
        self.allowed_buckets = frozenset(allowed_buckets or ()) | {bucket}
        self.delete_batch = delete_batch
        self.bucket = bucket
        self.transfer = transfer or TransferConfig(
            multipart_threshold=CHUNK_BYTES, multipart_chunksize=CHUNK_BYTES, max_concurrency=8, use_threads=True
        )
        self.cas_attempts = cas_attempts

    def _allowed(self, uri: str, what: str) -> tuple[str, str]:
        """(bucket, key prefix) of a weights location in an allowed bucket; BucketRefused otherwise."""
        bucket, key = _split(uri, prefix=True)
        try:
            require_allowed_bucket(bucket, self.allowed_buckets, what)
        except BucketNotAllowed as exc:
            raise BucketRefused(str(exc)) from None
        return bucket, key

    # --- keys ----------------------------------------------------------------------------------

    @staticmethod
    def manifest_key(model: str, version: str) -> str:
        return f"{PREFIX}/{model}/{version}/manifest.json"

    @staticmethod
    def index_key(model: str) -> str:
        return f"{PREFIX}/{model}/index.json"

    # --- compare-and-swap ------------------------------------------------------------------------

    def read_document(self, key: str, cls: type[T]) -> tuple[T | None, str | None]:
        try:
            obj = self.s3.boto.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _missing(exc):
                return None, None
            raise
        return cls.model_validate_json(obj["Body"].read()), obj["ETag"]

    def _put(self, key: str, value: BaseModel, etag: str | None) -> bool:
        """Write if the object is still at ``etag`` (None: still absent); False if it moved."""
        cond = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        try:
            self.s3.boto.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=value.model_dump_json(indent=1).encode(),
                ContentType="application/json",
                **cond,
            )
        except ClientError as exc:
            if _conflict(exc):
                return False
            raise
        return True

    def update_document(self, key: str, cls: type[T], change: Callable[[T | None], T | None]) -> T | None:
        """Read-modify-write until it sticks. ``change`` gets a fresh copy each attempt and
        returns the new value, or None to leave the object as it is (then the current value is
        returned)."""
        for attempt in range(self.cas_attempts):
            current, etag = self.read_document(key, cls)
            new = change(current.model_copy(deep=True) if current is not None else None)
            if new is None:
                return current
            if self._put(key, new, etag):
                return new
            time.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))
        raise RuntimeError(f"s3://{self.bucket}/{key}: gave up after {self.cas_attempts} conflicting writes")

    def _update_manifest(self, model: str, version: str, change: Callable[[Manifest], bool]) -> Manifest:
        """Apply ``change`` (returns whether it changed anything) to a manifest, then sync the index."""

        def apply(manifest: Manifest | None) -> Manifest | None:
            if manifest is None:
                raise NotFound(f"{model}@{version} is not in the registry")
            if not change(manifest):
                return None
            manifest.revision += 1
            return manifest

        manifest = self.update_document(self.manifest_key(model, version), Manifest, apply)
        self._sync_index(manifest)
        return manifest

    def _sync_index(self, manifest: Manifest) -> None:
        summary = summarize(manifest)

        def upsert(index: ModelIndex | None) -> ModelIndex | None:
            index = index or ModelIndex(model=manifest.model)
            old = index.versions.get(manifest.version)
            if old is not None and old.revision >= summary.revision:
                return None
            index.versions[manifest.version] = summary
            return index

        self.update_document(self.index_key(manifest.model), ModelIndex, upsert)

    def _add_model(self, model: str) -> None:
        def add(models: ModelsIndex | None) -> ModelsIndex | None:
            models = models or ModelsIndex()
            if model in models.models:
                return None
            models.models = sorted([*models.models, model])
            return models

        self.update_document(MODELS_KEY, ModelsIndex, add)

    # --- reading ---------------------------------------------------------------------------------

    def list_models(self) -> list[str]:
        models, _ = self.read_document(MODELS_KEY, ModelsIndex)
        return models.models if models else []

    def list_versions(self, models: list[str] | None = None) -> list[VersionSummary]:
        """Summaries of every version of ``models`` (all models by default), in semver order."""
        names = self.list_models() if models is None else models
        with ThreadPoolExecutor(max_workers=8) as pool:
            indexes = list(pool.map(lambda m: self.read_document(self.index_key(m), ModelIndex)[0], names))
        out: list[VersionSummary] = []
        for index in indexes:
            if index is not None:
                out.extend(sorted(index.versions.values(), key=lambda s: semver_key(s.version)))
        return out

    def show(self, model: str, version: str) -> Manifest:
        manifest, _ = self.read_document(self.manifest_key(model, version), Manifest)
        if manifest is None:
            raise NotFound(f"{model}@{version} is not in the registry")
        return manifest

    # --- registering -----------------------------------------------------------------------------

    def register(
        self,
        model: str,
        version: str,
        source: str,
        quantization=None,
        image: str | None = None,
        at: datetime | None = None,
        progress: Callable[[int], None] = lambda n: None,
        adapter: AdapterOf | None = None,
    ) -> Manifest:
        """Register ``model@version`` with weights from a local file/directory (uploaded,
        multipart and parallel) or from objects already in S3 (checksummed by streaming them).

        Registering the same weights again returns the existing manifest; different weights
        under an existing version are refused (versions are immutable). ``adapter``: the files
        are a LoRA adapter of that base version, which must be registered (checked first).
        """
        at = at or _now()
        if adapter is not None:
            self._require_base(adapter)
        key = self.manifest_key(model, version)
        upload: list[tuple[Path, str]] = []
        if source.startswith("s3://"):
            location, files = self._checksum_s3(source, progress)
        else:
            paths, files = self._checksum_local(Path(source), progress)
            # Content-addressed: other weights for the same version never land on these keys.
            prefix = f"weights/{model}/{version}/{set_digest(files)}/"
            location = f"s3://{self.bucket}/{prefix}"
            upload = [(p, prefix + f.path) for p, f in zip(paths, files)]
        weights = Weights(
            location=location, files=files, digest=set_digest(files), size_bytes=sum(f.size_bytes for f in files)
        )
        existing, _ = self.read_document(key, Manifest)
        uploaded: list[str] = []
        if existing is None and upload:
            etags = self._upload(upload, progress)
            uploaded = list(etags)
            weights.files = [f.model_copy(update={"etag": etags[k]}) for f, (_, k) in zip(files, upload)]
        manifest = Manifest(
            model=model,
            version=version,
            weights=weights,
            adapter=adapter,
            quantization=quantization or NoQuantization(),
            image=image,
            status=Testing(),
            history=[StatusChange(status=Testing(), at=at, reason="registered")],
            created_at=at,
            updated_at=at,
        )
        if existing is None and not self._put(key, manifest, None):
            existing, _ = self.read_document(key, Manifest)
        if existing is not None:
            if existing.weights.digest != weights.digest:
                self._delete_keys(self.bucket, uploaded)  # this attempt's own, unpublished bytes
                raise RegistryError(
                    f"{model}@{version} is already registered with other weights "
                    f"(digest {existing.weights.digest}, these are {weights.digest}): register a new version"
                )
            manifest = existing
        self._sync_index(manifest)
        self._add_model(model)
        return manifest

    def _require_base(self, adapter: AdapterOf) -> None:
        """An adapter's base version must be in the registry, as a model, not an adapter."""
        base, _ = self.read_document(self.manifest_key(adapter.base_model, adapter.base_version), Manifest)
        if base is None:
            raise BaseNotRegistered(f"adapter.base_version: {adapter.base_ref} is not in the registry (register the base model first)")
        if base.adapter is not None:
            raise BaseNotRegistered(f"adapter.base_model: {adapter.base_ref} is itself an adapter, not a base model")

    def _checksum_local(self, root: Path, progress) -> tuple[list[Path], list[ManifestFile]]:
        """The files under ``root`` (or the one file) and their manifest entries."""
        if not root.exists():
            raise RegistryError(f"no such file or directory: {root}")
        paths = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        if not paths:
            raise RegistryError(f"no files under {root}")
        base = root if root.is_dir() else root.parent
        with ThreadPoolExecutor(max_workers=4) as pool:
            digests = list(pool.map(lambda p: _sha256_file(p, progress), paths))
        files = [
            ManifestFile(path=p.relative_to(base).as_posix(), sha256=d, size_bytes=p.stat().st_size)
            for p, d in zip(paths, digests)
        ]
        return paths, files

    def _delete_keys(self, bucket: str, keys: list[str], batch_done: Callable[[str], None] = lambda key: None) -> None:
        """Delete objects in batches of ``delete_batch`` (S3 takes 1000 at most), in order;
        ``batch_done`` gets the last key of each deleted batch (a caller resumes after it)."""
        for i in range(0, len(keys), self.delete_batch):
            batch = keys[i : i + self.delete_batch]
            resp = self.s3.boto.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            if resp.get("Errors"):
                raise RuntimeError(f"delete failed for {resp['Errors'][:3]}")
            batch_done(batch[-1])

    def _upload(self, items: list[tuple[Path, str]], progress) -> dict[str, str]:
        """Upload files (multipart, parts in parallel, several files at once); key -> ETag."""

        def one(item: tuple[Path, str]) -> tuple[str, str]:
            path, key = item
            self.s3.boto.upload_file(str(path), self.bucket, key, Config=self.transfer, Callback=progress)
            return key, self.s3.boto.head_object(Bucket=self.bucket, Key=key)["ETag"]

        with ThreadPoolExecutor(max_workers=4) as pool:
            return dict(pool.map(one, items))

    def _checksum_s3(self, uri: str, progress) -> tuple[str, list[ManifestFile]]:
        """Files under an s3:// prefix (or one object), each hashed by streaming it."""
        bucket, key = self._allowed(uri, "register source")
        objects: list[tuple[str, int]] = []
        if key and not key.endswith("/"):
            try:
                head = self.s3.boto.head_object(Bucket=bucket, Key=key)
                objects = [(key, head["ContentLength"])]
                prefix = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
            except ClientError as exc:
                if not _missing(exc):
                    raise
                key += "/"
        if not objects:
            prefix = key
            pages = self.s3.boto.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            objects = [(o["Key"], o["Size"]) for page in pages for o in page.get("Contents", [])]
        if not objects:
            raise NotFound(f"no objects under {uri}")
        with ThreadPoolExecutor(max_workers=4) as pool:
            hashed = list(pool.map(lambda o: self._sha256(bucket, o[0], progress), objects))
        files = [
            ManifestFile(path=k[len(prefix):], sha256=digest, size_bytes=size, etag=etag)
            for (k, size), (digest, etag) in zip(objects, hashed)
        ]
        return f"s3://{bucket}/{prefix}", files

    def _sha256(self, bucket: str, key: str, progress) -> tuple[str, str]:
        """(sha256, ETag) of an object, streamed by the S3 client's ranged reads pinned to its ETag."""
        try:
            return self.s3.sha256(bucket, key, progress)
        except ClientError as exc:
            if _missing(exc):
                raise NotFound(f"missing object s3://{bucket}/{key}") from None
            raise
        except ObjectChanged as exc:
            raise ChecksumMismatch(str(exc)) from None

    # --- status, benchmarks ----------------------------------------------------------------------

    def set_status(
        self,
        model: str,
        version: str,
        status: AnyStatus,
        reason: str = "",
        at: datetime | None = None,
        demote_previous: bool = True,
        deployment: str | None = None,
    ) -> tuple[Manifest, list[str]]:
        """Record ``status`` of a version on ``deployment`` (None: on no recorded deployment, as
        by hand); see ``schema.place``. A new stable takes the model's other versions off that
        deployment (unless ``demote_previous`` is False): each becomes deprecated once it serves
        nowhere. Returns the manifest and the versions it took off the deployment."""
        at = at or _now()
        where = deployment or ANY_DEPLOYMENT

        def move(manifest: Manifest) -> bool:
            if status.state in ("canary", "stable") and manifest.weights.deleted_at is not None:
                raise RegistryError(f"{manifest.ref} cannot become {status.state}: its weights were deleted by retention")
            named = sorted(d for d in manifest.deployments if d != ANY_DEPLOYMENT)
            if deployment is None and status.state == "deprecated" and named:
                raise RegistryError(
                    f"{manifest.ref} still serves on {', '.join(named)}: it becomes deprecated when no deployment serves it"
                )
            return place(manifest, where, status, at, reason)

        manifest = self._update_manifest(model, version, move)
        replaced: list[str] = []
        if status.state == "stable" and demote_previous:
            for other in self.list_versions([model]):
                legacy = not other.deployments and other.status.state in ("canary", "stable")  # index entry from before
                if other.version == version or not (where in other.deployments or (legacy and where == ANY_DEPLOYMENT)):
                    continue
                newer = semver_key(version) > semver_key(other.version)
                on = "" if where == ANY_DEPLOYMENT else f" on {where}"
                why = f"superseded{on} by {model}@{version}" if newer else f"replaced{on} by the older {model}@{version}"
                self._update_manifest(
                    model,
                    other.version,
                    lambda m, why=why: where in m.deployments and place(m, where, Deprecated(since=at), at, why),
                )
                replaced.append(other.version)
        return manifest, replaced

    def deprecate(self, model: str, version: str, reason: str = "", at: datetime | None = None) -> Manifest:
        at = at or _now()
        return self.set_status(model, version, Deprecated(since=at), reason or "deprecated", at)[0]

    def record_benchmark(self, model: str, version: str, result: BenchmarkResult) -> Manifest:
        """Append a benchmark; the same run recorded twice (a retried activity) is kept once."""

        def add(manifest: Manifest) -> bool:
            if result in manifest.benchmarks:
                return False
            manifest.benchmarks.append(result)
            manifest.updated_at = max(manifest.updated_at, result.measured_at)
            return True

        return self._update_manifest(model, version, add)

    # --- for the rollout: resolve and verify -----------------------------------------------------

    def resolve(self, model: str, version: str, verify: bool = False, progress=lambda n: None) -> Manifest:
        """The manifest of a version whose weights are present and untouched.

        Each file is checked with a HEAD (size and ETag as registered) — a rewritten file is
        caught without reading it; ``verify`` also streams every file through sha256.
        """
        manifest = self.show(model, version)
        if manifest.weights.deleted_at is not None:
            raise NotFound(f"{manifest.ref}: weights were deleted by retention at {manifest.weights.deleted_at}")
        self._allowed(manifest.weights.location, f"{manifest.ref} weights.location")
        for f in manifest.weights.files:
            bucket, key = _split(manifest.weights.uri(f.path))
            try:
                head = self.s3.boto.head_object(Bucket=bucket, Key=key)
            except ClientError as exc:
                if _missing(exc):
                    raise NotFound(f"{manifest.ref}: missing weights file s3://{bucket}/{key}") from None
                raise
            if head["ContentLength"] != f.size_bytes or (f.etag and head["ETag"] != f.etag):
                raise ChecksumMismatch(
                    f"{manifest.ref}: s3://{bucket}/{key} changed since registration "
                    f"(size {head['ContentLength']} vs {f.size_bytes}, ETag {head['ETag']} vs {f.etag})"
                )
            if verify:
                actual, _ = self._sha256(bucket, key, progress)
                if actual != f.sha256:
                    raise ChecksumMismatch(
                        f"{manifest.ref}: s3://{bucket}/{key} sha256 mismatch: expected {f.sha256}, actual {actual}"
                    )
        return manifest

    # --- retention -------------------------------------------------------------------------------

    def delete_weights(
        self,
        model: str,
        version: str,
        reason: str,
        at: datetime | None = None,
        resume_after: str | None = None,
        deleted_up_to: Callable[[str], None] = lambda key: None,
    ) -> DeleteWeightsResult:
        """Delete a deprecated version's weight files and mark the manifest (kept, as history).

        The manifest is marked first, conditionally on the version still being deprecated, so
        no rollout can resolve weights that are about to go; a retry after a crash finds the
        mark and finishes deleting. Keys go in sorted order, ``deleted_up_to`` gets the last key
        of every deleted batch, and a retry passes it back as ``resume_after`` to skip what went.
        """
        at = at or _now()
        refused: list[str] = []

        def mark(manifest: Manifest) -> bool:
            try:
                self._allowed(manifest.weights.location, f"{manifest.ref} weights.location")  # never delete elsewhere
            except BucketRefused as exc:
                refused.append(str(exc))
                return False
            if manifest.weights.deleted_at is not None:
                return False
            if manifest.status.state != "deprecated":
                refused.append(f"{manifest.ref} is {manifest.status.state} now, not deprecated")
                return False
            manifest.weights.deleted_at = at
            manifest.history.append(StatusChange(status=manifest.status, at=at, reason=f"weights deleted: {reason}"))
            manifest.updated_at = at
            return True

        manifest = self._update_manifest(model, version, mark)
        if refused:
            return DeleteWeightsResult(deleted=False, reason=refused[0])
        bucket, _ = _split(manifest.weights.location, prefix=True)
        keys = sorted(_split(manifest.weights.uri(f.path))[1] for f in manifest.weights.files)
        self._delete_keys(bucket, [k for k in keys if resume_after is None or k > resume_after], deleted_up_to)
        return DeleteWeightsResult(
            deleted=True, reason=reason, files=len(manifest.weights.files), bytes=manifest.weights.size_bytes
        )


def _sha256_file(path: Path, progress) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while data := fh.read(CHUNK_BYTES):
            digest.update(data)
            progress(len(data))
    return digest.hexdigest()





