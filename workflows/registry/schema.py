"""The model registry's schema: one manifest per model version, stored as JSON in S3.

Pure pydantic (no I/O), so workflows, activities, the CLI and tests share one definition. The
manifest carries ``schema_version`` so that the format can evolve: a reader refuses a version it
does not know instead of misreading it.

Whole-set digest: ``sha256`` over the UTF-8 text made of one line ``"<path> <sha256>\\n"`` per
file, files sorted by path (byte order). It names the exact set of files and their content, so
two manifests with the same digest describe the same weights, whatever order they were listed in.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, model_validator

from workflows.core.batching_settings import SweepRecord
from workflows.core.verdicts import GoldenVerdict
from workflows.core.versions import (
    MODEL_NAME_PATTERN,
    SHA256_PATTERN,
    Canary,
    Deprecated,
    ModelName,
    SemVer,
    Serving,
    Stable,
    Status,
    Testing,
    checked_semver,
)

SCHEMA_VERSION = 1


def parse_ref(ref: str) -> tuple[str, str | None]:
    """``"llama@1.2.0"`` -> ``("llama", "1.2.0")``; ``"llama"`` -> ``("llama", None)``."""
    model, sep, version = ref.partition("@")
    if not re.match(MODEL_NAME_PATTERN, model):
        raise ValueError(f"bad model name in {ref!r} (letters, digits, '.', '_', '-')")
    if sep:
        checked_semver(version)
        return model, version
    return model, None


# --- quantization: a discriminated union on "method" -------------------------------------------


class NoQuantization(BaseModel):
    method: Literal["none"] = "none"

    def label(self) -> str:
        return "none"


class Gguf(BaseModel):
    method: Literal["gguf"] = "gguf"
    variant: str = Field(pattern=r"^(I?Q[1-8](_[A-Z0-9]+)*|F16|BF16|F32)$", description="e.g. Q4_K_M, Q8_0, F16")

    def label(self) -> str:
        return f"gguf:{self.variant}"


class Awq(BaseModel):
    method: Literal["awq"] = "awq"
    bits: Literal[4, 8] = 4
    group_size: int | None = Field(None, gt=0)

    def label(self) -> str:
        return f"awq:{self.bits}"


class Gptq(BaseModel):
    method: Literal["gptq"] = "gptq"
    bits: Literal[2, 3, 4, 8] = 4
    group_size: int | None = Field(None, gt=0)

    def label(self) -> str:
        return f"gptq:{self.bits}"


Quantization = Annotated[Union[NoQuantization, Gguf, Awq, Gptq], Field(discriminator="method")]


def parse_quantization(text: str) -> NoQuantization | Gguf | Awq | Gptq:
    """CLI spelling: ``none``, ``gguf:Q4_K_M``, ``awq:4``, ``gptq:8``."""
    method, _, arg = text.partition(":")
    if method == "none":
        return NoQuantization()
    if method == "gguf":
        return Gguf(variant=arg)
    if method in ("awq", "gptq"):
        if not arg.isdigit():
            raise ValueError(f"{method} needs the bits, e.g. {method}:4")
        return (Awq if method == "awq" else Gptq)(bits=int(arg))
    raise ValueError(f"unknown quantization {text!r}: none | gguf:VARIANT | awq:BITS | gptq:BITS")


# --- status: a discriminated union on "state" --------------------------------------------------


# The deployment key of a status set without naming a deployment (by hand, or in a manifest
# written before status was per deployment): it stands for "some deployment, not recorded".
ANY_DEPLOYMENT = "*"


class StatusChange(BaseModel):
    status: Status = Field(description="the version's overall status after the change")
    at: datetime
    reason: str = ""
    deployment: str | None = Field(None, description="NAMESPACE/NAME the change was about, if one")


# --- benchmark, files, manifest ----------------------------------------------------------------


class BenchmarkResult(BaseModel):
    """One benchmark run, written by the rollout's warm-up (or by hand)."""

    tokens_per_second: float = Field(ge=0)
    p50_latency_seconds: float = Field(ge=0)
    p99_latency_seconds: float = Field(ge=0)
    gpu_memory_gib: float | None = Field(None, ge=0)
    dataset: str = Field(min_length=1, description="what was sent, e.g. 'warm-up' or 'sharegpt-1k'")
    measured_at: datetime
    requests: int | None = Field(None, ge=0)
    errors: int | None = Field(None, ge=0)
    image: str | None = Field(None, description="serving image the numbers were measured with")
    deployment: str | None = Field(None, description="NAMESPACE/NAME it ran in")
    golden: GoldenVerdict | None = Field(None, description="the golden-set gate's verdict at this warm-up")
    batching: SweepRecord | None = Field(None, description="the warm-up's batching sweep and the setting it kept")


class ManifestFile(BaseModel):
    path: str = Field(pattern=r"^[^/].*$", description="relative to the weights location")
    sha256: str = Field(pattern=SHA256_PATTERN)
    size_bytes: int = Field(ge=0)
    etag: str | None = Field(None, description="S3 ETag at registration: a cheap tamper check on resolve")

    @model_validator(mode="after")
    def _relative(self) -> ManifestFile:
        if ".." in self.path.split("/") or "\\" in self.path:
            raise ValueError(f"path must stay inside the weights location: {self.path!r}")
        return self


def set_digest(files: list[ManifestFile]) -> str:
    """The whole-set digest (see the module docstring)."""
    lines = "".join(f"{f.path} {f.sha256}\n" for f in sorted(files, key=lambda f: f.path.encode()))
    return hashlib.sha256(lines.encode()).hexdigest()


class Weights(BaseModel):
    location: str = Field(pattern=r"^s3://[^/]+/.*$", description="s3://bucket/prefix/ the file paths are under")
    files: list[ManifestFile] = Field(min_length=1)
    digest: str = Field(pattern=SHA256_PATTERN, description="sha256 over the sorted 'path sha256' lines")
    size_bytes: int = Field(ge=0)
    deleted_at: datetime | None = Field(None, description="set by retention once the files are gone")

    @model_validator(mode="after")
    def _consistent(self) -> Weights:
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError("files: duplicate paths")
        if self.digest != set_digest(self.files):
            raise ValueError("digest: does not match the files' sha256 (see the schema module's docstring)")
        if self.size_bytes != sum(f.size_bytes for f in self.files):
            raise ValueError("size_bytes: not the sum of the files' sizes")
        return self

    def uri(self, path: str) -> str:
        return self.location.rstrip("/") + "/" + path


class AdapterOf(BaseModel):
    """The base model version a LoRA adapter was trained on: vLLM loads it only beside that base."""

    base_model: ModelName
    base_version: SemVer

    @property
    def base_ref(self) -> str:
        return f"{self.base_model}@{self.base_version}"


class Manifest(BaseModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    model: ModelName
    version: SemVer
    revision: int = Field(1, ge=1, description="incremented on every write; orders index updates")
    weights: Weights
    adapter: AdapterOf | None = Field(None, description="set for a LoRA adapter: the base model version it applies to")
    quantization: Quantization = Field(default_factory=NoQuantization)
    image: str | None = Field(None, description="serving image the version was validated with")
    benchmarks: list[BenchmarkResult] = Field(default_factory=list)
    status: Status = Field(default_factory=Testing, description="overall: derived from deployments while it serves")
    deployments: dict[str, Serving] = Field(
        default_factory=dict, description="NAMESPACE/NAME -> canary or stable there (see ``place``)"
    )
    retired: dict[str, datetime] = Field(
        default_factory=dict, description="NAMESPACE/NAME -> when it last stopped being stable there"
    )
    history: list[StatusChange] = Field(default_factory=list)
    created_at: datetime
    updated_at: datetime

    @model_validator(mode="after")
    def _unrecorded_deployment(self) -> Manifest:
        """A manifest from before per-deployment status serves where it said, on an unrecorded deployment."""
        if not self.deployments and isinstance(self.status, (Canary, Stable)):
            self.deployments = {ANY_DEPLOYMENT: self.status}
        return self

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.version}"


def transition(manifest: Manifest, status: Testing | Canary | Stable | Deprecated, at: datetime, reason: str) -> bool:
    """Move ``manifest`` to ``status`` in place, recording history; False if it is already there.

    A canary keeps its ``since`` when only its percent changes, and a repeated call with the
    same status is a no-op, so an activity that retries does not write a second history entry.
    """
    current = manifest.status
    if current.state == status.state:
        if not isinstance(status, Canary) or status.percent == current.percent:
            return False
        status = status.model_copy(update={"since": current.since})
    manifest.status = status
    manifest.history.append(StatusChange(status=status, at=at, reason=reason))
    manifest.updated_at = at
    return True


def serving_status(deployments: dict[str, Canary | Stable]) -> Canary | Stable | None:
    """The overall status of a version serving on ``deployments``: stable if stable anywhere,
    else a canary at its largest share; None where it serves nowhere."""
    stable = [s for s in deployments.values() if isinstance(s, Stable)]
    if stable:
        return Stable(since=min(s.since for s in stable))
    canaries = [s for s in deployments.values() if isinstance(s, Canary)]
    if canaries:
        return Canary(percent=max(c.percent for c in canaries), since=min(c.since for c in canaries))
    return None


def place(manifest: Manifest, deployment: str, status: Testing | Canary | Stable | Deprecated, at: datetime, reason: str) -> bool:
    """Record ``status`` of the version on one deployment, in place; False if nothing changed.

    Canary or stable puts it on the deployment; testing or deprecated takes it off. The overall
    status follows where it serves: stable if stable on any deployment, else canary; only a version
    that serves nowhere takes the testing or deprecated asked for. A deployment it stops being
    stable on is remembered in ``retired`` (the rollback window starts then).
    """
    current = manifest.deployments.get(deployment)
    if isinstance(status, (Canary, Stable)):
        if current is not None and current.state == status.state:
            if isinstance(status, Stable) or status.percent == current.percent:
                return False
            status = status.model_copy(update={"since": current.since})
        manifest.deployments[deployment] = status
    elif current is not None:
        del manifest.deployments[deployment]
    else:  # not on this deployment: the status applies only to a version that serves nowhere
        return not manifest.deployments and transition(manifest, status, at, reason)
    if isinstance(current, Stable) and not isinstance(status, Stable):
        manifest.retired[deployment] = at
    overall = serving_status(manifest.deployments) or status
    before = manifest.status
    if isinstance(overall, (Canary, Stable)) and before.state == overall.state:
        overall = overall.model_copy(update={"since": before.since})  # stable/canary since it first was, anywhere
    manifest.status = overall
    manifest.history.append(
        StatusChange(status=overall, at=at, reason=reason, deployment=None if deployment == ANY_DEPLOYMENT else deployment)
    )
    manifest.updated_at = at
    return True


# --- the indexes that make listing O(models) -----------------------------------------------------


class VersionSummary(BaseModel):
    """One version as the per-model index lists it (derived from its manifest)."""

    model: str
    version: str
    revision: int
    status: Status
    weights_location: str
    stable_until: datetime | None = Field(None, description="when it last stopped being stable")
    deployments: dict[str, Serving] = Field(default_factory=dict, description="where it serves (Manifest.deployments)")
    retired: dict[str, datetime] = Field(default_factory=dict, description="Manifest.retired")
    size_bytes: int
    quantization: str
    image: str | None = None
    created_at: datetime
    weights_deleted_at: datetime | None = None


def summarize(manifest: Manifest) -> VersionSummary:
    stable_until = None
    for before, after in zip(manifest.history, manifest.history[1:]):
        if before.status.state == "stable" and after.status.state != "stable":
            stable_until = after.at
    return VersionSummary(
        model=manifest.model,
        version=manifest.version,
        revision=manifest.revision,
        status=manifest.status,
        weights_location=manifest.weights.location,
        stable_until=stable_until,
        deployments=manifest.deployments,
        retired=manifest.retired,
        size_bytes=manifest.weights.size_bytes,
        quantization=manifest.quantization.label(),
        image=manifest.image,
        created_at=manifest.created_at,
        weights_deleted_at=manifest.weights.deleted_at,
    )


class ModelIndex(BaseModel):
    """``registry/<model>/index.json``: every version of one model, without the file lists."""

    schema_version: Literal[1] = SCHEMA_VERSION
    model: str
    versions: dict[str, VersionSummary] = Field(default_factory=dict)


class ModelsIndex(BaseModel):
    """``registry/models.json``: the model names, so a listing never scans the bucket."""

    schema_version: Literal[1] = SCHEMA_VERSION
    models: list[str] = Field(default_factory=list)
