"""A model version as every capability names it: its model name and semantic version, its weight
files, the states the registry moves it through (testing, canary, stable, deprecated), and what the
cluster runs of it (``DeploymentState``: each version's replicas and route weight).

Pure pydantic: the rollout, the adapter rollout, the registry, the node cache and the scaling loop
share these types; the registry's manifest (workflows/registry/schema.py) is built from them.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, Field

# semver.org's recommended regular expression (2.0.0), anchored.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
# A model name is one S3 key segment and one Kubernetes label value: no "/", no "@".
MODEL_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


def checked_semver(value: str) -> str:
    if not _SEMVER.match(value):
        raise ValueError(f"not a semantic version (MAJOR.MINOR.PATCH[-pre][+build]): {value!r}")
    return value


SemVer = Annotated[str, AfterValidator(checked_semver)]
ModelName = Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]


def semver_key(version: str) -> tuple:
    """Sort key with semver precedence: 1.2.0-rc.1 < 1.2.0 < 1.10.0; build metadata ignored."""
    match = _SEMVER.match(version)
    if not match:
        raise ValueError(f"not a semantic version: {version!r}")
    major, minor, patch, pre, _build = match.groups()
    if pre is None:
        pre_key: tuple = ((1,),)  # a release sorts after all its pre-releases
    else:
        pre_key = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
        pre_key = ((0,), *pre_key)
    return (int(major), int(minor), int(patch), pre_key)


class Testing(BaseModel):
    state: Literal["testing"] = "testing"


class Canary(BaseModel):
    state: Literal["canary"] = "canary"
    percent: int = Field(ge=0, le=100, description="share of traffic the canary carries")
    since: datetime = Field(description="when the version became a canary")


class Stable(BaseModel):
    state: Literal["stable"] = "stable"
    since: datetime


class Deprecated(BaseModel):
    state: Literal["deprecated"] = "deprecated"
    since: datetime


Status = Annotated[Union[Testing, Canary, Stable, Deprecated], Field(discriminator="state")]
# Where a version serves on one deployment: a canary or the stable version.
Serving = Annotated[Union[Canary, Stable], Field(discriminator="state")]


class WeightFile(BaseModel):
    """One weights file of a version: where it is in S3 and its SHA-256."""

    uri: str = Field(description="s3://bucket/key of one weights file")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class VersionInfo(BaseModel):
    """One version of a logical deployment as the cluster runs it."""

    version: str
    model: str
    replicas: int
    ready_replicas: int
    route_weight: int
    lora_modules: dict[str, str] = Field(
        default_factory=dict, description="the LoRA adapters its pods load at start (served name -> path, --lora-modules)"
    )


class VersionReplicas(BaseModel):
    """How many replicas one version has, by pool: its own Deployment, one spot Deployment per pool
    of a spot mix, the mix's on-demand base (a claim on the version's fallback ``<name>-od``).
    Every reader (the rollout's describe, the loop's scale, the spot mix) reads this one model."""

    version: str
    own: int = Field(0, description="the versioned Deployment's spec.replicas (0 under a spot mix)")
    pools: dict[str, int] = Field(default_factory=dict, description="spot pool -> its mix Deployment's replicas")
    on_demand_base: int = Field(0, description="the spot mix's on-demand base (its claim on the fallback)")
    mix_total: int | None = Field(None, description="the loop's total under a spot mix (None: no spot mix)")
    ready: int = Field(0, description="Ready replicas over all of them (the fallback's included)")

    @property
    def mixed(self) -> bool:
        return self.mix_total is not None

    @property
    def total(self) -> int:
        """The version's size: the spot mix's total, else its own Deployment's replicas."""
        return self.mix_total if self.mix_total is not None else self.own

    @property
    def running(self) -> int:
        """Replicas asked of the cluster now, over every pool (what a retirement must bring to 0)."""
        return self.own + sum(self.pools.values()) + self.on_demand_base


class DeploymentState(BaseModel):
    """What is in the cluster now for one logical deployment."""

    route_exists: bool
    versions: list[VersionInfo] = Field(default_factory=list)
    stable_version: str | None = Field(
        None,
        description="the stable version as the rollout recorded it on the route (tideplane.io/stable-version), or the"
        " one version with the most traffic on a route that records none (None: nothing serves)",
    )

    @property
    def stable(self) -> VersionInfo | None:
        """The stable version (None on a first deploy). ``stable_version`` names it; a state read
        before it was recorded (an old history) falls back to the version with the most traffic."""
        if self.stable_version is not None:
            return next((v for v in self.versions if v.version == self.stable_version), None)
        serving = [v for v in self.versions if v.route_weight > 0]
        return max(serving, key=lambda v: v.route_weight) if serving else None
