"""stage_weights against a real S3 endpoint (moto server over HTTP), run in ActivityEnvironment.

RolloutActivities has its S3Client pointed at moto and its model cache in a temporary directory.

Interruptions are real failures of the HTTP exchange: a botocore ``before-send`` hook on the
activity's own client records every ranged GET and cuts the connection for chosen ranges, the
way a network drop or a killed worker would end an attempt halfway.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re

import boto3
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.clients.s3 import CHUNK_BYTES
from activities.rollout.model_cache import staging_lock
from activities.rollout.rollout_activities import RolloutActivities
from workflows.rollout.contract import StageWeightsInput
from workflows.core.versions import WeightFile

CHUNK = CHUNK_BYTES
SIZE = 2 * CHUNK + 4 * 1024 * 1024 + 123  # three chunks, the last one short


class NetworkCut(Exception):
    """Raised by the hook in place of the bytes of a range (not retried by botocore)."""


class GetObjectLog:
    """Ranges the activity asked S3 for; ranges starting at or after ``cut_from`` fail."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.cut_from: int | None = None

    def __call__(self, request, **_):
        start, end = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", request.headers["Range"].decode()).groups())
        if self.cut_from is not None and start >= self.cut_from:
            raise NetworkCut(f"connection reset fetching bytes {start}-{end}")
        self.ranges.append((start, end))

    @property
    def bytes(self) -> int:
        return sum(end - start + 1 for start, end in self.ranges)


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "models"


@pytest.fixture
def rollout(moto_url, cache, make_rollout) -> RolloutActivities:
    return make_rollout(s3_endpoint=moto_url, model_cache_dir=cache)


@pytest.fixture
def gets(rollout):
    log = GetObjectLog()
    rollout.s3.boto.meta.events.register("before-send.s3.GetObject", log)
    return log


@pytest.fixture(scope="module")
def weights(moto_url):
    """One multi-chunk object in a fresh bucket: (bucket, key, data, sha256)."""
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    bucket = "stage-test"
    s3.create_bucket(Bucket=bucket)
    data = os.urandom(SIZE)
    key = "llama/1.3.0/model.safetensors"
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    return bucket, key, data, hashlib.sha256(data).hexdigest()


def _input(uri: str, sha256: str, version: str = "1.3.0") -> StageWeightsInput:
    return StageWeightsInput(model="llama", version=version, files=[WeightFile(uri=uri, sha256=sha256)])


def _env(heartbeats: list) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: heartbeats.append(details[0])
    return env


def test_stage_verifies_and_is_idempotent(weights, cache, gets, rollout):
    bucket, key, data, digest = weights
    beats: list = []
    result = _env(beats).run(rollout.stage_weights, _input(f"s3://{bucket}/{key}", digest))

    staged = cache / "llama" / "1.3.0" / "model.safetensors"
    assert result.path == str(staged.parent)
    assert result.size_bytes == SIZE and result.resumed_bytes == 0
    assert hashlib.sha256(staged.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in staged.parent.iterdir()) == ["model.safetensors", "model.safetensors.sha256"]
    assert gets.bytes == SIZE and len(gets.ranges) == 3
    done = [b["bytes_done"] for b in beats]
    assert done == sorted(done) and done[-1] == SIZE and len(done) >= 3

    gets.ranges.clear()
    again = _env([]).run(rollout.stage_weights, _input(f"s3://{bucket}/{key}", digest))
    assert gets.ranges == [] and again.resumed_bytes == SIZE and again.path == result.path


def test_interrupted_download_resumes_without_refetching_verified_bytes(weights, cache, gets, rollout):
    bucket, key, data, digest = weights
    req = _input(f"s3://{bucket}/{key}", digest, version="resume")
    beats: list = []
    env = _env(beats)
    gets.cut_from = 2 * CHUNK
    with pytest.raises(NetworkCut):
        env.run(rollout.stage_weights, req)
    assert gets.bytes == 2 * CHUNK
    partial = cache / "llama" / "resume" / "model.safetensors.partial"
    assert partial.stat().st_size == 2 * CHUNK
    assert beats[-1]["bytes_done"] == 2 * CHUNK

    # The retry (attempt 2, with the last heartbeat) fetches only what was never verified.
    gets.ranges.clear()
    gets.cut_from = None
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[beats[-1]])
    result = env.run(rollout.stage_weights, req)
    assert result.resumed_bytes == 2 * CHUNK
    assert gets.ranges == [(2 * CHUNK, SIZE - 1)]
    assert gets.bytes == SIZE - 2 * CHUNK
    assert (cache / "llama" / "resume" / "model.safetensors").read_bytes() == data
    assert not partial.exists()


def test_corrupted_local_chunk_is_fetched_again(weights, cache, gets, rollout):
    """A chunk whose bytes on disk no longer match its recorded digest is not trusted."""
    bucket, key, data, digest = weights
    req = _input(f"s3://{bucket}/{key}", digest, version="torn")
    gets.cut_from = 2 * CHUNK
    with pytest.raises(NetworkCut):
        _env([]).run(rollout.stage_weights, req)
    partial = cache / "llama" / "torn" / "model.safetensors.partial"
    with partial.open("r+b") as f:
        f.seek(CHUNK + 10)
        f.write(b"\x00" if data[CHUNK + 10] else b"\x01")

    gets.ranges.clear()
    gets.cut_from = None
    result = _env([]).run(rollout.stage_weights, req)
    assert result.resumed_bytes == CHUNK
    assert gets.ranges[0][0] == CHUNK and gets.bytes == SIZE - CHUNK
    assert (cache / "llama" / "torn" / "model.safetensors").read_bytes() == data


def test_object_replaced_between_attempts_restarts_from_zero(moto_url, cache, gets, rollout):
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    s3.create_bucket(Bucket="replaced")
    first = os.urandom(2 * CHUNK + 1)
    s3.put_object(Bucket="replaced", Key="w.bin", Body=first)
    gets.cut_from = CHUNK
    with pytest.raises(NetworkCut):
        _env([]).run(rollout.stage_weights, _input("s3://replaced/w.bin", hashlib.sha256(first).hexdigest()))

    second = os.urandom(2 * CHUNK + 1)
    s3.put_object(Bucket="replaced", Key="w.bin", Body=second)
    gets.ranges.clear()
    gets.cut_from = None
    result = _env([]).run(rollout.stage_weights, _input("s3://replaced/w.bin", hashlib.sha256(second).hexdigest()))
    assert result.resumed_bytes == 0 and gets.bytes == len(second)
    assert (cache / "llama" / "1.3.0" / "w.bin").read_bytes() == second


def test_checksum_mismatch_is_non_retryable_and_deletes_the_file(weights, cache, gets, rollout):
    bucket, key, data, digest = weights
    wrong = "0" * 64
    with pytest.raises(ApplicationError) as err:
        _env([]).run(rollout.stage_weights, _input(f"s3://{bucket}/{key}", wrong, version="bad"))
    assert err.value.non_retryable and err.value.type == "ChecksumMismatch"
    assert wrong in str(err.value) and digest in str(err.value)
    assert list((cache / "llama" / "bad").iterdir()) == []


def test_missing_key_and_bucket_are_non_retryable_and_named(weights, cache, gets, rollout):
    bucket, _, _, digest = weights
    with pytest.raises(ApplicationError) as err:
        _env([]).run(rollout.stage_weights, _input(f"s3://{bucket}/llama/9.9.9/missing.safetensors", digest))
    assert err.value.non_retryable and f"s3://{bucket}/llama/9.9.9/missing.safetensors" in str(err.value)

    with pytest.raises(ApplicationError) as err:
        _env([]).run(rollout.stage_weights, _input("s3://no-such-bucket/w.bin", digest))
    assert err.value.non_retryable and "no-such-bucket" in str(err.value)
    assert gets.ranges == []


def test_a_second_concurrent_attempt_waits_for_the_first(weights, cache, gets, rollout):
    """An attempt Temporal timed out may still be writing: a retry must not write beside it."""
    bucket, key, _, digest = weights
    directory = cache / "llama" / "locked"
    directory.mkdir(parents=True)
    with staging_lock(directory):
        with pytest.raises(ApplicationError) as err:
            _env([]).run(rollout.stage_weights, _input(f"s3://{bucket}/{key}", digest, version="locked"))
    assert not err.value.non_retryable and "another attempt" in str(err.value)
    assert gets.ranges == []
    assert _env([]).run(rollout.stage_weights, _input(f"s3://{bucket}/{key}", digest, version="locked")).size_bytes == SIZE


def test_bad_uri_is_non_retryable(cache, rollout):
    with pytest.raises(ApplicationError) as err:
        _env([]).run(rollout.stage_weights, _input("https://example.com/w.bin", "0" * 64))
    assert err.value.non_retryable and "https://example.com/w.bin" in str(err.value)


def test_an_image_not_allowed_is_refused_before_anything_is_read(weights, cache, moto_url, make_rollout):
    """The rollout's first activity judges the serving image too: a refused image stages nothing."""
    bucket, key, _, digest = weights
    strict = make_rollout(s3_endpoint=moto_url, model_cache_dir=cache, image_prefixes=["docker.io/vllm/vllm-openai"])
    log = GetObjectLog()
    strict.s3.boto.meta.events.register("before-send.s3.GetObject", log)
    refused = _input(f"s3://{bucket}/{key}", digest).model_copy(update={"image": "evil.example.com/miner:1"})
    with pytest.raises(ApplicationError) as err:
        _env([]).run(strict.stage_weights, refused)
    assert err.value.non_retryable and err.value.type == "ImageNotAllowed"
    assert "image 'evil.example.com/miner:1' is not from an allowed registry (TIDEPLANE_IMAGE_PREFIXES: docker.io/vllm/vllm-openai)" in str(err.value)
    assert log.ranges == [] and not (cache / "llama").exists()
    allowed = refused.model_copy(update={"image": "vllm/vllm-openai:v0.6.3"})
    assert _env([]).run(strict.stage_weights, allowed).size_bytes == SIZE
