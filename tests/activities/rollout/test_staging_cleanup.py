"""Where stage_weights may read weights and what it leaves when they go away (issue 20): only from
the allowed buckets, and a staging that cannot finish because its weights were deleted (e.g. by
retention) leaves no partial file in the model cache, whether they vanish mid-download or between
attempts. stage_weights against moto over HTTP, run in ActivityEnvironment."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.clients.s3 import CHUNK_BYTES
from activities.rollout.rollout_activities import RolloutActivities
from workflows.rollout.contract import StageWeightsInput
from workflows.core.versions import WeightFile


class NetworkCut(Exception):
    """Raised by a hook instead of sending a request: the attempt ends halfway."""


@pytest.fixture
def rollout(moto_url, tmp_path, make_rollout) -> RolloutActivities:
    return make_rollout(s3_endpoint=moto_url, model_cache_dir=tmp_path / "models")


@pytest.fixture
def weights(rollout):
    """A three-chunk object in a fresh bucket: (uri, sha256, bucket, key)."""
    bucket, key = f"stage-{uuid.uuid4().hex[:8]}", "llama/1.0.0/model.safetensors"
    rollout.s3.boto.create_bucket(Bucket=bucket)
    data = os.urandom(2 * CHUNK_BYTES + 123)
    rollout.s3.boto.put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}", hashlib.sha256(data).hexdigest(), bucket, key


def stage(rollout: RolloutActivities, uri: str, digest: str):
    return ActivityEnvironment().run(
        rollout.stage_weights, StageWeightsInput(model="llama", version="1.0.0", files=[WeightFile(uri=uri, sha256=digest)])
    )


def cache_files(rollout: RolloutActivities) -> list[str]:
    """Weights files in the cache, whole or partial (the staging lock file is not one)."""
    root = rollout.pods.model_cache_dir
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


def test_weights_deleted_mid_download_leave_no_partial_file(rollout, weights):
    uri, digest, bucket, key = weights
    ranges = []

    def delete_after_the_first_range(request, **_):
        ranges.append(request.headers["Range"])
        if len(ranges) == 2:  # the first range is in; the weights go now
            rollout.s3.boto.delete_object(Bucket=bucket, Key=key)

    rollout.s3.boto.meta.events.register("before-send.s3.GetObject", delete_after_the_first_range)
    with pytest.raises(ApplicationError, match=f"weights object not found: {uri}") as err:
        stage(rollout, uri, digest)
    assert err.value.non_retryable
    assert cache_files(rollout) == [], "no .partial or .partial.json left behind"


def test_weights_gone_before_a_retry_leave_no_partial_file(rollout, weights):
    uri, digest, bucket, key = weights
    cut = []

    def cut_after_the_first_range(request, **_):
        cut.append(1)
        if len(cut) > 1:
            raise NetworkCut("connection reset")

    rollout.s3.boto.meta.events.register("before-send.s3.GetObject", cut_after_the_first_range)
    with pytest.raises(NetworkCut):
        stage(rollout, uri, digest)
    assert any(name.endswith(".partial") for name in cache_files(rollout)), "an interrupted attempt keeps its bytes to resume"
    rollout.s3.boto.meta.events.unregister("before-send.s3.GetObject", cut_after_the_first_range)

    rollout.s3.boto.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ApplicationError, match=f"weights object not found: {uri}") as err:
        stage(rollout, uri, digest)
    assert err.value.non_retryable and cache_files(rollout) == []


def test_weights_outside_the_allowed_buckets_are_refused_naming_the_bucket(moto_url, tmp_path, make_rollout, weights):
    uri, digest, bucket, _ = weights
    rollout = make_rollout(s3_endpoint=moto_url, model_cache_dir=tmp_path / "models", weights_buckets=["tideplane-models"])
    sent = []
    rollout.s3.boto.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url))
    with pytest.raises(ApplicationError) as err:
        stage(rollout, uri, digest)
    assert err.value.non_retryable and err.value.type == "BucketNotAllowed"
    assert err.value.message == (
        f"weights {uri}: bucket {bucket!r} is not an allowed weights bucket (TIDEPLANE_WEIGHTS_BUCKETS: tideplane-models)"
    )
    assert sent == [], "nothing is read from a bucket that is not allowed (no checksum of it can leak)"
