"""The model registry against a real moto S3 server, spoken to over HTTP by boto3."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.clients.kube import KubeClient
from activities.clients.s3 import S3Client
from activities.registry.store import ChecksumMismatch, NotFound, Registry, RegistryError
from activities.registry.registry_activities import RegistryActivities
from workers.cli import registry as registry_cli
from workers.config import Settings
from workflows.core import search_attributes
from workflows.registry import contract as ra
from workflows.registry.contract import DeleteWeightsInput, ListVersionsInput
from workflows.registry.schema import (
    AdapterOf,
    BenchmarkResult,
    Gguf,
    Manifest,
    parse_quantization,
    parse_ref,
    set_digest,
)
from workflows.core.versions import (
    Canary,
    Deprecated,
    Stable,
    Testing as StatusTesting,
    semver_key,
)

MiB = 1024 * 1024
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
# S3's smallest multipart part is 5 MiB: a 11 MiB file goes up in three parts.
SMALL_PARTS = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=4)


def s3_client() -> S3Client:
    return S3Client(os.environ["AWS_ENDPOINT_URL"], "us-east-1")


@pytest.fixture
def bucket(moto_url):
    name = f"models-{uuid.uuid4().hex[:12]}"
    s3_client().boto.create_bucket(Bucket=name)
    return name


@pytest.fixture
def registry(bucket):
    return Registry(s3_client(), bucket, transfer=SMALL_PARTS)


@pytest.fixture
def activities(bucket, kube_api):
    """The activities as the worker builds them: an S3 client, a cluster (the emulator), the bucket."""
    return RegistryActivities(s3_client(), KubeClient(kube_api), bucket)


@pytest.fixture(scope="module")
async def temporal():
    """A Temporal dev server's client: delete_registry_weights asks visibility for running rollouts."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        data_converter=pydantic_data_converter,
        search_attributes=list(search_attributes.ALL),
        ui=False,
    )
    try:
        yield env.client
    finally:
        await env.shutdown()


def weights_dir(tmp_path, big: bool = False, seed: bytes = b"w"):
    root = tmp_path / f"weights-{seed.decode()}"
    (root / "tokenizer").mkdir(parents=True)
    (root / "config.json").write_bytes(b'{"arch": "llama"}' + seed)
    (root / "tokenizer" / "tokenizer.json").write_bytes(b"{}" * 100 + seed)
    size = 11 * MiB if big else 1000
    (root / "model.safetensors").write_bytes(hashlib.sha256(seed).digest() * (size // 32))
    return root


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_register_list_show_deprecate(registry, tmp_path):
    root = weights_dir(tmp_path, big=True)
    manifest = registry.register("llama-3-8b", "1.2.0", str(root), Gguf(variant="Q4_K_M"), "vllm/vllm-openai:v0.6.3", at=T0)

    shown = registry.show("llama-3-8b", "1.2.0")
    assert shown == manifest
    assert shown.status == StatusTesting() and [h.reason for h in shown.history] == ["registered"]
    assert shown.weights.location == f"s3://{registry.bucket}/weights/llama-3-8b/1.2.0/{shown.weights.digest}/"
    files = {f.path: f for f in shown.weights.files}
    assert set(files) == {"config.json", "model.safetensors", "tokenizer/tokenizer.json"}
    for path, f in files.items():
        assert f.sha256 == sha(root / path) and f.size_bytes == (root / path).stat().st_size
    assert files["model.safetensors"].etag.endswith('-3"'), "an 11 MiB file in 5 MiB parts is a 3-part upload"
    lines = "".join(f"{p} {files[p].sha256}\n" for p in sorted(files))
    assert shown.weights.digest == hashlib.sha256(lines.encode()).hexdigest() == set_digest(shown.weights.files)
    assert shown.weights.size_bytes == sum(f.size_bytes for f in files.values())
    body = registry.s3.boto.get_object(Bucket=registry.bucket, Key=f"weights/llama-3-8b/1.2.0/{shown.weights.digest}/model.safetensors")["Body"]
    assert hashlib.sha256(body.read()).hexdigest() == files["model.safetensors"].sha256
    assert registry.resolve("llama-3-8b", "1.2.0", verify=True) == manifest, "ranged, parallel re-hash agrees"

    registry.register("llama-3-8b", "1.3.0", str(weights_dir(tmp_path, seed=b"x")), at=T0)
    registry.register("qwen2.5-7b", "0.1.0-rc.1", str(weights_dir(tmp_path, seed=b"q")), at=T0)
    listed = [(v.model, v.version, v.status.state, v.quantization) for v in registry.list_versions()]
    assert listed == [
        ("llama-3-8b", "1.2.0", "testing", "gguf:Q4_K_M"),
        ("llama-3-8b", "1.3.0", "testing", "none"),
        ("qwen2.5-7b", "0.1.0-rc.1", "testing", "none"),
    ]

    # Registering the same weights again is a no-op; other weights under the same version are refused.
    assert registry.register("llama-3-8b", "1.2.0", str(root), at=T0 + timedelta(days=1)) == manifest
    with pytest.raises(RegistryError, match="already registered with other weights"):
        registry.register("llama-3-8b", "1.2.0", str(weights_dir(tmp_path, seed=b"z")))

    deprecated = registry.deprecate("llama-3-8b", "1.2.0", "replaced", at=T0 + timedelta(days=2))
    assert deprecated.status.state == "deprecated" and deprecated.status.since == T0 + timedelta(days=2)
    assert [h.status.state for h in deprecated.history] == ["testing", "deprecated"]
    summary = registry.list_versions(["llama-3-8b"])[0]
    assert summary.status == deprecated.status and summary.revision == deprecated.revision == 2

    with pytest.raises(NotFound, match="llama-3-8b@9.9.9 is not in the registry"):
        registry.show("llama-3-8b", "9.9.9")


def test_register_points_at_existing_s3_weights(registry):
    s3 = registry.s3.boto
    blobs = {"shard-1.safetensors": os.urandom(17 * MiB + 17), "config.json": b"{}"}
    for name, data in blobs.items():
        s3.put_object(Bucket=registry.bucket, Key=f"hub/mistral/{name}", Body=data)
    # The S3 client's 8 MiB ranges: the big shard is hashed from three parallel ranged GETs, in order.
    manifest = registry.register("mistral-7b", "0.3.0", f"s3://{registry.bucket}/hub/mistral/", at=T0)
    assert manifest.weights.location == f"s3://{registry.bucket}/hub/mistral/"
    assert {f.path: f.sha256 for f in manifest.weights.files} == {
        name: hashlib.sha256(data).hexdigest() for name, data in blobs.items()
    }
    with pytest.raises(NotFound, match="no objects under"):
        registry.register("mistral-7b", "0.4.0", f"s3://{registry.bucket}/hub/nothing-here/")


def test_status_moves_and_benchmarks(registry, tmp_path):
    for version, seed in (("1.0.0", b"a"), ("1.1.0", b"b")):
        registry.register("llama", version, str(weights_dir(tmp_path, seed=seed)), at=T0)
    registry.set_status("llama", "1.0.0", Stable(since=T0), "first deploy", T0)
    t1 = T0 + timedelta(hours=1)
    registry.set_status("llama", "1.1.0", Canary(percent=1, since=t1), "canary", t1)
    again, _ = registry.set_status("llama", "1.1.0", Canary(percent=1, since=t1 + timedelta(minutes=1)), "retry")
    assert len(again.history) == 2, "a retried status change records one history entry"
    t2 = t1 + timedelta(minutes=30)
    five, _ = registry.set_status("llama", "1.1.0", Canary(percent=5, since=t2), "step", t2)
    assert five.status == Canary(percent=5, since=t1), "canary 'since' is when it became a canary"

    bench = BenchmarkResult(
        tokens_per_second=812.5, p50_latency_seconds=0.4, p99_latency_seconds=1.9, gpu_memory_gib=17.2,
        dataset="warm-up", measured_at=t1, requests=20, errors=0,
    )
    registry.record_benchmark("llama", "1.1.0", bench)
    assert registry.record_benchmark("llama", "1.1.0", bench).benchmarks == [bench], "recorded once"

    t3 = t2 + timedelta(hours=2)
    promoted, demoted = registry.set_status("llama", "1.1.0", Stable(since=t3), "promoted", t3)
    assert demoted == ["1.0.0"] and promoted.status == Stable(since=t3)
    old = registry.show("llama", "1.0.0")
    assert old.status.state == "deprecated" and old.history[-1].reason == "superseded by llama@1.1.0"
    summaries = {v.version: v for v in registry.list_versions(["llama"])}
    assert summaries["1.0.0"].stable_until == t3 and summaries["1.1.0"].status.state == "stable"


def test_concurrent_registers_of_one_version_keep_the_winners_bytes(registry, tmp_path):
    """Two registers of llama@1.0.0 with different weights: both upload before either publishes;
    one manifest wins, the other is refused, and the winner's files still verify."""
    a_dir, b_dir = weights_dir(tmp_path, seed=b"a"), weights_dir(tmp_path, seed=b"b")
    b_uploaded, a_published = threading.Event(), threading.Event()

    def writer(before, after=lambda: None) -> Registry:
        """A registry whose manifest PutObject calls ``before`` first and ``after`` once it returned."""
        w = Registry(s3_client(), registry.bucket)

        def before_call(params, context, **_):
            if params["url_path"].endswith("/manifest.json"):
                context["tp_manifest"] = True
                before()

        w.s3.boto.meta.events.register("before-call.s3.PutObject", before_call)
        w.s3.boto.meta.events.register("after-call.s3.PutObject", lambda context, **_: context.get("tp_manifest") and after())
        return w

    # A publishes only once B has uploaded everything; B publishes only after A did (and loses).
    a = writer(lambda: b_uploaded.wait(30), after=a_published.set)
    b = writer(lambda: (b_uploaded.set(), a_published.wait(30)))
    with ThreadPoolExecutor(2) as pool:
        won = pool.submit(a.register, "llama", "1.0.0", str(a_dir), at=T0)
        lost = pool.submit(b.register, "llama", "1.0.0", str(b_dir), at=T0)
        manifest = won.result()
        with pytest.raises(RegistryError, match="already registered with other weights"):
            lost.result()
    assert registry.resolve("llama", "1.0.0", verify=True) == manifest, "show --verify passes after the race"
    assert {f.path: f.sha256 for f in manifest.weights.files}["model.safetensors"] == sha(a_dir / "model.safetensors")
    listed = registry.s3.boto.list_objects_v2(Bucket=registry.bucket, Prefix="weights/")["Contents"]
    assert {o["Key"] for o in listed} == {_split_key(manifest.weights.uri(f.path)) for f in manifest.weights.files}, (
        "the loser's uploads are removed, the winner's are untouched"
    )


def _split_key(uri: str) -> str:
    return uri.split("/", 3)[3]


def test_status_is_per_deployment(registry, tmp_path, capsys):
    """Issue 16: a first deploy of an older version elsewhere must not deprecate the stable one."""
    for version, seed in (("1.0.0", b"a"), ("1.3.0", b"b"), ("1.4.0", b"c")):
        registry.register("m", version, str(weights_dir(tmp_path, seed=seed)), at=T0)
    t = [T0 + timedelta(hours=h) for h in range(8)]
    registry.set_status("m", "1.3.0", Stable(since=t[1]), "first deploy", t[1], deployment="prod/chat")
    _, replaced = registry.set_status("m", "1.0.0", Stable(since=t[2]), "first deploy", t[2], deployment="prod/batch")
    assert replaced == [], "nothing else served on prod/batch"
    assert registry.show("m", "1.3.0").status == Stable(since=t[1]), "still serving 100 % of prod/chat"

    # Canary on one deployment while stable on another: stable overall, canary recorded where it is.
    registry.set_status("m", "1.3.0", Canary(percent=5, since=t[3]), "canary at 5 %", t[3], deployment="prod/batch")
    both = registry.show("m", "1.3.0")
    assert both.status == Stable(since=t[1])
    assert both.deployments == {"prod/chat": Stable(since=t[1]), "prod/batch": Canary(percent=5, since=t[3])}

    # 1.3.0 promoted on prod/batch: 1.0.0 serves nowhere now and is deprecated (superseded by a newer one).
    _, replaced = registry.set_status("m", "1.3.0", Stable(since=t[4]), "promoted", t[4], deployment="prod/batch")
    old = registry.show("m", "1.0.0")
    assert replaced == ["1.0.0"] and old.status.state == "deprecated" and old.deployments == {}
    assert old.history[-1].reason == "superseded on prod/batch by m@1.3.0" and old.retired == {"prod/batch": t[4]}

    # A rollback of 1.4.0's canary on prod/chat deprecates it; an older version going stable on a
    # deployment never reads as "superseded".
    registry.set_status("m", "1.4.0", Canary(percent=1, since=t[5]), "canary", t[5], deployment="prod/chat")
    rolled, _ = registry.set_status("m", "1.4.0", Deprecated(since=t[6]), "rolled back", t[6], deployment="prod/chat")
    assert rolled.status == Deprecated(since=t[6]) and rolled.deployments == {}
    registry.set_status("m", "1.0.0", Stable(since=t[7]), "downgrade", t[7], deployment="prod/chat")
    newer = registry.show("m", "1.3.0")
    assert newer.status == Stable(since=t[1]) and set(newer.deployments) == {"prod/batch"}
    assert newer.history[-1].reason == "replaced on prod/chat by the older m@1.0.0"
    summary = {v.version: v for v in registry.list_versions(["m"])}["1.3.0"]
    assert summary.retired == {"prod/chat": t[7]} and set(summary.deployments) == {"prod/batch"}

    # Deprecating by hand a version that still serves is refused, naming where.
    settings = Settings(weights_bucket=registry.bucket)
    assert registry_cli.main(["registry", "deprecate", "m@1.3.0"], settings) == 1
    assert capsys.readouterr().err == (
        "tideplane: error: m@1.3.0 still serves on prod/batch: it becomes deprecated when no deployment serves it\n"
    )
    assert registry_cli.main(["registry", "list", "m"], settings) == 0
    listed = capsys.readouterr().out
    assert "stable since 2026-11-01 13:00 (stable on prod/batch)" in listed
    assert "stable since 2026-11-01 19:00 (stable on prod/chat)" in listed, "1.0.0, on prod/chat since the downgrade"


def test_manifests_written_before_per_deployment_status_still_load(registry, tmp_path):
    """A stored manifest without ``deployments``/``retired`` reads as serving on an unrecorded deployment."""
    registry.register("m", "1.0.0", str(weights_dir(tmp_path)), at=T0)
    registry.set_status("m", "1.0.0", Stable(since=T0), "first deploy", T0)
    key = registry.manifest_key("m", "1.0.0")
    stored = json.loads(registry.s3.boto.get_object(Bucket=registry.bucket, Key=key)["Body"].read())
    for field in ("deployments", "retired"):
        stored.pop(field)
    for entry in stored["history"]:
        entry.pop("deployment")
    registry.s3.boto.put_object(Bucket=registry.bucket, Key=key, Body=json.dumps(stored).encode())
    old = registry.show("m", "1.0.0")
    assert old.status == Stable(since=T0) and old.deployments == {"*": Stable(since=T0)}
    # A rollout elsewhere leaves it stable; a stable set without a deployment replaces it as before.
    registry.register("m", "1.1.0", str(weights_dir(tmp_path, seed=b"n")), at=T0)
    registry.set_status("m", "1.1.0", Stable(since=T0), "first deploy", T0, deployment="prod/chat")
    assert registry.show("m", "1.0.0").status.state == "stable"


def test_conditional_write_refuses_a_stale_etag(registry, tmp_path):
    registry.register("llama", "1.0.0", str(weights_dir(tmp_path)), at=T0)
    key = registry.manifest_key("llama", "1.0.0")
    stale, etag = registry.read_document(key, Manifest)
    registry.deprecate("llama", "1.0.0", at=T0)  # another writer gets in first
    assert registry._put(key, stale, etag) is False
    assert registry._put(key, stale, None) is False, "If-None-Match: * refuses to overwrite"
    assert registry.show("llama", "1.0.0").status.state == "deprecated"


def test_two_concurrent_writers_lose_nothing(registry, tmp_path):
    registry.register("llama", "2.0.0", str(weights_dir(tmp_path)), at=T0)
    n = 12
    start = threading.Barrier(2)
    conflicts = []

    def count_conflicts(http_response, **_):
        if http_response.status_code in (409, 412):
            conflicts.append(1)

    def benchmarks():
        writer = Registry(s3_client(), registry.bucket)
        writer.s3.boto.meta.events.register("after-call.s3.PutObject", count_conflicts)
        start.wait()
        for i in range(n):
            writer.record_benchmark("llama", "2.0.0", BenchmarkResult(
                tokens_per_second=100 + i, p50_latency_seconds=0.1, p99_latency_seconds=0.5,
                dataset=f"run-{i}", measured_at=T0 + timedelta(minutes=i),
            ))

    def statuses():
        writer = Registry(s3_client(), registry.bucket)
        writer.s3.boto.meta.events.register("after-call.s3.PutObject", count_conflicts)
        start.wait()
        for i in range(1, n + 1):
            at = T0 + timedelta(minutes=i)
            writer.set_status("llama", "2.0.0", Canary(percent=i, since=at), f"step {i}", at)

    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(benchmarks), pool.submit(statuses)]:
            f.result()

    manifest = registry.show("llama", "2.0.0")
    assert sorted(b.dataset for b in manifest.benchmarks) == sorted(f"run-{i}" for i in range(n))
    assert [h.reason for h in manifest.history] == ["registered", *(f"step {i}" for i in range(1, n + 1))]
    assert manifest.status.percent == n
    assert manifest.revision == 1 + 2 * n, "every write landed exactly once"
    assert registry.list_versions(["llama"])[0].revision == manifest.revision, "the index caught up"
    print(f"{len(conflicts)} compare-and-swap conflicts retried")


def test_manifest_validation_errors_name_the_field(registry, tmp_path):
    good = registry.register("llama", "1.0.0", str(weights_dir(tmp_path)), at=T0).model_dump(mode="json")

    def error(change) -> str:
        """The first error's field path and message, as pydantic reports it."""
        data = Manifest.model_validate(good).model_dump(mode="json")
        change(data)
        with pytest.raises(ValidationError) as exc:
            Manifest.model_validate(data)
        first = exc.value.errors()[0]
        return ".".join(map(str, first["loc"])) + ": " + first["msg"]

    assert error(lambda d: d.update(version="1.0")).startswith("version: Value error, not a semantic version")
    assert error(lambda d: d["weights"]["files"][0].update(sha256="abc")).startswith("weights.files.0.sha256:")
    assert error(lambda d: d["weights"]["files"][0].update(sha256="0" * 64)).startswith("weights: Value error, digest:")
    assert error(lambda d: d["weights"].update(size_bytes=1)).startswith("weights: Value error, size_bytes:")
    assert error(lambda d: d.update(quantization={"method": "int3"})).startswith("quantization: Input tag 'int3'")
    assert error(lambda d: d.update(quantization={"method": "gguf"})).startswith("quantization.gguf.variant: Field required")
    assert error(lambda d: d.update(quantization={"method": "gptq", "bits": 5})).startswith("quantization.gptq.bits:")
    canary = {"state": "canary", "percent": 150, "since": "2026-11-01T00:00:00Z"}
    assert error(lambda d: d.update(status=canary)).startswith("status.canary.percent:")
    assert error(lambda d: d.update(status={"state": "stable"})).startswith("status.stable.since: Field required")
    assert error(lambda d: d.update(schema_version=2)).startswith("schema_version: Input should be 1")
    assert error(lambda d: d.update(model="bad/name")).startswith("model: String should match pattern")
    # A retried rollout passes JSON through the temporal CLI: the contract models validate too.
    with pytest.raises(ValidationError, match="status.canary.percent"):
        ra.SetRegistryStatusInput.model_validate({"model": "m", "version": "1.0.0", "status": {"state": "canary", "percent": -1, "since": "2026-11-01T00:00:00Z"}})


def test_semver_and_refs():
    for ok in ("0.0.1", "1.2.3", "10.20.30", "1.0.0-rc.1", "1.0.0-alpha.beta+exp.sha.5114f85", "1.0.0+20130313144700"):
        assert parse_ref(f"llama@{ok}") == ("llama", ok)
    for bad in ("1.2", "v1.2.3", "01.2.3", "1.2.3-", "1.2.3-01", "1.2.3.4", "latest", ""):
        with pytest.raises(ValueError, match="semantic version"):
            parse_ref(f"llama@{bad}")
    assert parse_ref("llama") == ("llama", None)
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.2.0", "1.10.0", "2.0.0"]
    assert sorted(reversed(ordered), key=semver_key) == ordered
    assert parse_quantization("gguf:Q4_K_M") == Gguf(variant="Q4_K_M")
    with pytest.raises(ValueError, match="unknown quantization"):
        parse_quantization("int3")


def test_tampered_weights_are_caught(registry, tmp_path, activities):
    root = weights_dir(tmp_path)
    registry.register("llama", "1.0.0", str(root), at=T0)
    assert registry.resolve("llama", "1.0.0", verify=True).version == "1.0.0"
    key = _split_key(registry.show("llama", "1.0.0").weights.uri("model.safetensors"))
    original = (root / "model.safetensors").read_bytes()
    registry.s3.boto.put_object(Bucket=registry.bucket, Key=key, Body=bytes(reversed(original)))  # same size

    env = ActivityEnvironment()
    with pytest.raises(ApplicationError, match="model.safetensors changed since registration") as exc:
        env.run(activities.resolve_registry_weights, ra.RegistryWeightsInput(model="llama", version="1.0.0"))
    assert exc.value.non_retryable

    # A manifest without ETags (e.g. written by hand) is still caught by the full sha256 check.
    registry._update_manifest("llama", "1.0.0", lambda m: [f.__setattr__("etag", None) for f in m.weights.files] and True)
    assert registry.resolve("llama", "1.0.0").version == "1.0.0", "a HEAD alone cannot see same-size edits"
    with pytest.raises(ChecksumMismatch, match=f"expected {sha(root / 'model.safetensors')}, actual"):
        registry.resolve("llama", "1.0.0", verify=True)

    registry.s3.boto.delete_object(Bucket=registry.bucket, Key=key)
    with pytest.raises(ApplicationError, match="missing weights file"):
        env.run(activities.resolve_registry_weights, ra.RegistryWeightsInput(model="llama", version="1.0.0"))


async def test_activities_for_rollout_and_retention(registry, tmp_path, activities, temporal):
    registry.register("llama", "1.0.0", str(weights_dir(tmp_path)), at=T0)
    env = ActivityEnvironment(client=temporal)
    resolved = env.run(activities.resolve_registry_weights, ra.RegistryWeightsInput(model="llama", version="1.0.0"))
    location = registry.show("llama", "1.0.0").weights.location
    assert {f.uri for f in resolved.files} == {
        f"{location}{p}" for p in ("config.json", "model.safetensors", "tokenizer/tokenizer.json")
    }
    t1 = T0 + timedelta(hours=1)
    status = ra.SetRegistryStatusInput(model="llama", version="1.0.0", status=Canary(percent=1, since=t1), at=t1)
    assert env.run(activities.set_registry_status, status).status == Canary(percent=1, since=t1)
    bench = BenchmarkResult(tokens_per_second=50, p50_latency_seconds=1, p99_latency_seconds=2, dataset="warm-up", measured_at=t1)
    env.run(activities.record_registry_benchmark, ra.RecordRegistryBenchmarkInput(model="llama", version="1.0.0", benchmark=bench))
    assert registry.show("llama", "1.0.0").benchmarks == [bench]
    with pytest.raises(ApplicationError, match="llama@3.0.0 is not in the registry") as exc:
        env.run(activities.set_registry_status, status.model_copy(update={"version": "3.0.0"}))
    assert exc.value.non_retryable

    delete = DeleteWeightsInput(model="llama", version="1.0.0", reason="old", at=t1)
    refused = await env.run(activities.delete_registry_weights, delete)
    assert not refused.deleted and "canary now, not deprecated" in refused.reason
    registry.deprecate("llama", "1.0.0", at=t1)
    done = await env.run(activities.delete_registry_weights, delete)
    assert done.deleted and done.files == 3
    assert (await env.run(activities.delete_registry_weights, delete)).deleted, "idempotent"
    left = registry.s3.boto.list_objects_v2(Bucket=registry.bucket, Prefix="weights/").get("KeyCount")
    assert left == 0
    listed = env.run(activities.list_registry_versions, ListVersionsInput())
    assert listed.versions[0].weights_deleted_at == t1
    with pytest.raises(ApplicationError, match="weights were deleted by retention"):
        env.run(activities.resolve_registry_weights, ra.RegistryWeightsInput(model="llama", version="1.0.0"))
    with pytest.raises(ApplicationError, match="cannot become canary: its weights were deleted"):
        env.run(activities.set_registry_status, status)


async def test_deleting_weights_heartbeats_and_resumes_after_the_last_deleted_key(bucket, tmp_path, kube_api, temporal):
    """Issue 20: a worker lost mid-delete is noticed by the heartbeat timeout, and the retry
    starts after the last batch the first attempt reported."""
    root = tmp_path / "shards"
    root.mkdir()
    for i in range(5):
        (root / f"shard-{i}.safetensors").write_bytes(b"w%d" % i)
    activities = RegistryActivities(s3_client(), KubeClient(kube_api), bucket)
    registry = activities.registry
    registry.delete_batch = 2
    registry.register("llama", "1.0.0", str(root), at=T0)
    registry.deprecate("llama", "1.0.0", at=T0)
    prefix = registry.show("llama", "1.0.0").weights.location.split("/", 3)[3]
    asked: list[list[str]] = []

    def crash_after_the_first_batch(params, **_):
        asked.append(sorted(o["Key"] for o in params["Delete"]["Objects"]))
        if len(asked) == 2 and crash:
            raise ConnectionError("worker lost")

    registry.s3.boto.meta.events.register("provide-client-params.s3.DeleteObjects", crash_after_the_first_batch)
    delete = DeleteWeightsInput(model="llama", version="1.0.0", reason="old", at=T0)
    beats: list = []
    env = ActivityEnvironment(client=temporal)
    env.on_heartbeat = lambda *details: beats.append(details)
    crash = True
    with pytest.raises(ConnectionError):
        await env.run(activities.delete_registry_weights, delete)
    assert beats[-1] == (f"{prefix}shard-1.safetensors",), "the last deleted key, as heartbeat details"

    crash, asked[:] = False, []
    env.info = dataclasses.replace(env.info, heartbeat_details=list(beats[-1]), attempt=2)
    done = await env.run(activities.delete_registry_weights, delete)
    assert done.deleted and asked == [
        [f"{prefix}shard-2.safetensors", f"{prefix}shard-3.safetensors"], [f"{prefix}shard-4.safetensors"],
    ], "the retry skips the batch that went"
    assert registry.s3.boto.list_objects_v2(Bucket=bucket, Prefix="weights/").get("KeyCount") == 0


async def test_weights_outside_the_allowed_buckets_are_refused(bucket, tmp_path, kube_api, capsys, temporal):
    """TIDEPLANE_WEIGHTS_BUCKETS: registering, resolving and retention's deletes stay inside it."""
    s3 = s3_client()
    hub = f"hub-{uuid.uuid4().hex[:8]}"
    s3.boto.create_bucket(Bucket=hub)
    s3.boto.put_object(Bucket=hub, Key="mistral/model.safetensors", Body=b"weights")
    assert registry_cli.main(["registry", "register", "mistral@1.0.0", f"s3://{hub}/mistral/"], Settings(weights_bucket=bucket)) == 1
    assert capsys.readouterr().err == (
        f"tideplane: error: register source: bucket '{hub}' is not an allowed weights bucket (TIDEPLANE_WEIGHTS_BUCKETS: {bucket})\n"
    )

    Registry(s3, bucket, allowed_buckets=[hub]).register("mistral", "1.0.0", f"s3://{hub}/mistral/", at=T0)
    Registry(s3, bucket).deprecate("mistral", "1.0.0", at=T0)
    # The bucket is no longer allowed: a rollout cannot resolve it and retention leaves it alone.
    activities = RegistryActivities(s3, KubeClient(kube_api), bucket, weights_buckets=[])
    env = ActivityEnvironment(client=temporal)
    with pytest.raises(ApplicationError, match=f"mistral@1.0.0 weights.location: bucket '{hub}' is not an allowed") as err:
        env.run(activities.resolve_registry_weights, ra.RegistryWeightsInput(model="mistral", version="1.0.0"))
    assert err.value.non_retryable
    refused = await env.run(activities.delete_registry_weights, DeleteWeightsInput(model="mistral", version="1.0.0", reason="old", at=T0))
    assert not refused.deleted and f"bucket '{hub}' is not an allowed weights bucket" in refused.reason
    assert s3.boto.list_objects_v2(Bucket=hub)["KeyCount"] == 1, "nothing deleted outside the allowed buckets"


def test_cli(tmp_path, bucket, capsys):
    settings = Settings(weights_bucket=bucket)  # what the CLI reads from TIDEPLANE_WEIGHTS_BUCKET
    root = weights_dir(tmp_path)
    assert registry_cli.main(["registry", "register", "phi-3@1.0.0", str(root), "--quantization", "awq:4", "--image", "vllm:0.6"], settings) == 0
    captured = capsys.readouterr()
    assert "registered phi-3@1.0.0: 3 files" in captured.out and captured.err == "", "no progress line in CI logs"
    assert registry_cli.main(["registry", "list"], settings) == 0
    assert "phi-3" in (out := capsys.readouterr().out) and "awq:4" in out and "testing" in out
    assert registry_cli.main(["registry", "show", "phi-3@1.0.0", "--verify"], settings) == 0
    captured = capsys.readouterr()
    assert Manifest.model_validate_json(captured.out).image == "vllm:0.6" and "verified" in captured.err
    assert registry_cli.main(["registry", "deprecate", "phi-3@1.0.0"], settings) == 0
    assert "phi-3@1.0.0: deprecated since" in capsys.readouterr().out
    assert registry_cli.main(["registry", "show", "phi-3@2.0.0"], settings) == 1
    assert "phi-3@2.0.0 is not in the registry" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="semantic version"):
        registry_cli.main(["registry", "deprecate", "phi-3@2"], settings)


def test_register_on_a_terminal_shows_progress(tmp_path, bucket, monkeypatch):
    """Issue 16: `registry register` of large weights reports bytes, rate and ETA as it goes."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    root = weights_dir(tmp_path, big=True)
    assert registry_cli.main(["registry", "register", "big@1.0.0", str(root)], Settings(weights_bucket=bucket)) == 0
    lines = terminal.getvalue()
    assert lines.startswith("\rregister big@1.0.0: ") and lines.endswith("\n")
    final = lines.rstrip("\n").rsplit("\r", 1)[-1]
    # 11 MiB of weights, read twice (checksummed, then uploaded)
    assert final.startswith("register big@1.0.0: [####################] 22.0 MiB of 22.0 MiB (100 %)") and "MiB/s" in final, final


def test_listing_many_models_reads_only_the_indexes(registry, tmp_path):
    models, versions = 12, 20
    src = tmp_path / "tiny.bin"
    src.write_bytes(b"x" * 64)

    def register(i: int) -> None:
        for v in range(versions):
            registry.register(f"model-{i:02d}", f"1.{v}.0", str(src), at=T0)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(register, range(models)))

    calls: dict[str, int] = {}
    counter = lambda event_name, **_: calls.__setitem__(event_name.split(".")[-1], calls.get(event_name.split(".")[-1], 0) + 1)  # noqa: E731
    registry.s3.boto.meta.events.register("before-call.s3", counter)
    started = time.perf_counter()
    listed = registry.list_versions()
    elapsed = time.perf_counter() - started
    assert len(listed) == models * versions
    assert calls == {"GetObject": 1 + models}, "models.json + one index per model, no bucket listing"
    assert elapsed < 2.0, f"listing took {elapsed:.2f}s"


def test_lora_adapters_are_registered_against_a_registered_base_version(tmp_path, bucket, capsys):
    """An adapter's files are checksummed like a model's and its base recorded; a base version the
    registry lacks is refused naming the field, and manifests from before adapters load as models."""
    settings = Settings(weights_bucket=bucket)
    registry = registry_cli.open_registry(settings)
    assert registry_cli.main(["registry", "register", "sql-lora@1.0.0", str(weights_dir(tmp_path, seed=b"a")),
                              "--base", "llama@1.0.0"], settings) == 1
    assert "adapter.base_version: llama@1.0.0 is not in the registry" in capsys.readouterr().err
    assert registry.list_models() == [], "nothing registered for the refused adapter"
    registry.register("llama", "1.0.0", str(weights_dir(tmp_path)), at=T0)
    adapter_files = weights_dir(tmp_path, seed=b"b")
    assert registry_cli.main(["registry", "register", "sql-lora@1.0.0", str(adapter_files), "--base", "llama@1.0.0"], settings) == 0
    assert "LoRA adapter of llama@1.0.0" in capsys.readouterr().out
    adapter = registry.resolve("sql-lora", "1.0.0", verify=True)
    assert adapter.adapter is not None and adapter.adapter.base_ref == "llama@1.0.0"
    assert {f.path: f.sha256 for f in adapter.weights.files}["config.json"] == sha(adapter_files / "config.json")
    with pytest.raises(RegistryError, match="adapter.base_model: sql-lora@1.0.0 is itself an adapter"):
        registry.register("sql-lora-2", "1.0.0", str(adapter_files), adapter=AdapterOf(base_model="sql-lora", base_version="1.0.0"))
    base = registry.show("llama", "1.0.0")
    assert base.adapter is None
    assert Manifest.model_validate({k: v for k, v in json.loads(base.model_dump_json()).items() if k != "adapter"}) == base
