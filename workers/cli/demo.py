"""``tideplane demo``: bring the sandbox and the worker up, then tell the story.

The story is the part each feature extends (the rollout issue adds a rollout to watch in the
UI); what surrounds it — sandbox up if needed, worker in the background, where to look, how to
stop — stays here so ``make demo`` ends with the sandbox left running for exploration.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
from kubernetes import client
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowFailureError

from infra.sandbox.config import Demand, Profile
from infra.sandbox.knobs import set_demand, set_profile
from infra.sandbox.kubeclient import api_client, raw
from infra.sandbox.launcher import Sandbox
from infra.sandbox.worker_identity import enable_serving_namespace
from workers.cli import quality as quality_cli
from workers.cli import registry as registry_cli
from workers.cli.rollout import Snapshot, watch
from workers.client import connect
from workers.config import Settings, load_settings
from workflows.core.naming import (
    GPU_RESOURCE,
    NODE_CAPACITY_TYPE,
    NODE_POOL,
    NODE_ZONE,
    MANAGED_BY,
    TASK_QUEUE,
    rollout_workflow_id,
    split_deployment,
)
from workflows.quality.shadow import describe_pair
from workflows.rollout.types import RolloutInput, RolloutResult, Stage
from workflows.rollout.client import rollout_result, static_details, static_summary

WORKER_GRACE_SECONDS = 3.0


DEMO_DEPLOYMENT = "llm-serving/chat"
DEMO_MODEL = "llama-3-8b"
DEMO_IMAGE = "vllm/vllm-openai:v0.6.3"
DEMO_RPS = 8.0  # sandbox requests/s offered to the chat deployment
# A good release answers every request: the fleet draws 5xx per request, and at 1 % of 8 req/s a gate
# window holds ~16 requests, so even a 0.2 % error rate would fail the 1 % gate now and then.
GOOD = Profile(load_seconds=60, error_rate=0.0, ttft_seconds=0.15, tpot_seconds=0.025, capacity_rps=4)
# The release that "hallucinates on an edge case": a quarter of its answers fail.
BAD = GOOD.model_copy(update={"error_rate": 0.25})
# Quality gates (issue 21): fast and error-free, but wrong on the golden set's must-pass case
# (stopped at warm-up, never gets traffic); and one whose everyday answers drift from stable's
# (rolled back at 1 % by the shadow comparison of mirrored requests).
WRONG = GOOD.model_copy(update={"golden_failures": ["paracetamol"]})
DRIFTING = GOOD.model_copy(update={"drift": 0.3})
RELEASES = [
    ("1.0.0", GOOD, "first deploy"),
    ("1.1.0", GOOD, "a good release"),
    ("1.2.0", BAD, "a bad release"),
    ("1.3.0", WRONG, "fast, no errors, wrong on a must-pass golden case"),
    ("1.4.0", DRIFTING, "its answers drift from stable's"),
]
GOLDEN_SET = Path(__file__).resolve().parents[2] / "infra" / "sandbox" / "golden.yaml"
SHADOW = {"percent": 10, "thresholds": {"min_pairs": 20}}  # mirror 10 % of live requests to the canary
# The good release is held at 5 % by an operator and resumed, so the notices include a pause.
HELD_AT = {"1.1.0": 5}


def rollout_input(version: str) -> dict:
    """The demo's rollout: the default ladder 1 -> 5 -> 50 -> 100 % with windows compressed to
    seconds, weights resolved from the registry by model and version."""
    return {
        "deployment": DEMO_DEPLOYMENT,
        "model": DEMO_MODEL,
        "version": version,
        "image": DEMO_IMAGE,
        "gpus_per_replica": 1,
        "replicas": 3,
        "steps": [{"weight": w, "window_seconds": 15} for w in (1, 5, 50, 100)],
        "gate_interval_seconds": 5,
        "query_window_seconds": 15,
        "gates": {"min_requests": 5},
        "warm_up": {"requests": 8, "deadline_seconds": 180},
        "scale_down_delay_seconds": 10,
        "shadow": SHADOW,
    }


def _weights(sandbox: Sandbox, version: str) -> Path:
    """A small stand-in for a weights file, different per version (registered, then staged)."""
    path = sandbox.state_dir / "demo-weights" / version / "model.safetensors"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(random.Random(version).randbytes(4 * 1024 * 1024))
    return path


def _start_with_cli(sandbox: Sandbox, version: str) -> None:
    """Start the rollout exactly as a user would: with the temporal CLI."""
    argv = [
        str(Path(sys.executable).with_name("temporal")), "workflow", "start",
        "--address", sandbox.urls()["temporal"],
        "--type", "ModelRollout", "--task-queue", TASK_QUEUE,
        "--workflow-id", rollout_workflow_id(DEMO_DEPLOYMENT),
        "--input", json.dumps(rollout_input(version)),
        # what the web UI's workflow list shows without opening the run
        "--static-summary", static_summary(RolloutInput.model_validate(rollout_input(version))),
        "--static-details", static_details(RolloutInput.model_validate(rollout_input(version))),
    ]
    print("  $ temporal workflow start --type ModelRollout --task-queue tideplane \\\n"
          f"      --workflow-id {rollout_workflow_id(DEMO_DEPLOYMENT)} --input '{{\"version\": \"{version}\", ...}}'")
    subprocess.run(argv, check=True, capture_output=True, text=True)


async def _operator(*command: str) -> None:
    """Run ``tideplane rollout COMMAND`` as an operator types it, printing it and its answer."""
    print(f"  $ tideplane rollout {' '.join(command)}", flush=True)
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("tideplane")), "rollout", *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    answer, _ = await proc.communicate()
    print(f"  {answer.decode().strip()}", flush=True)


async def _follow(client: Client, hold_at: int | None = None) -> RolloutResult:
    """Follow the rollout with `tideplane rollout get --watch`'s view (redrawn in place on a
    terminal, a block per change otherwise), and once a verdict at 5 % or more is in, print what
    the web UI shows as the run's current details. With ``hold_at``, pause the rollout when it
    reaches that weight and resume it once the pause has taken effect (stage ``paused``: the
    rollout holds at its next checkpoint; a resume sent before that cancels a pause no one saw)."""
    handle = client.get_workflow_handle(rollout_workflow_id(DEMO_DEPLOYMENT), result_type=RolloutResult)
    print(f"  $ tideplane rollout get {DEMO_DEPLOYMENT} --watch", flush=True)
    details_shown = False
    hold = "to pause" if hold_at is not None else "done"

    async def current_details(snap: Snapshot) -> bool:
        nonlocal details_shown, hold
        status = snap.status
        if hold == "to pause" and status is not None and status.weight >= hold_at:
            await _operator("pause", DEMO_DEPLOYMENT, "--reason", f"an operator holds it at {hold_at} % to look at the dashboards")
            hold = "to resume"
            return True
        if hold == "to resume" and status is not None and status.stage is Stage.PAUSED:
            await _operator("resume", DEMO_DEPLOYMENT)
            hold = "done"
            return True
        verdict = status.last_verdict if status else None
        if not details_shown and verdict is not None and verdict.weight >= 5:
            meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
            print("  the web UI's current details now read:\n    " + meta.current_details.replace("\n\n", "\n    "), flush=True)
            details_shown = True
            return True
        return False

    await watch(handle, sys.stdout, each=current_details)
    return await rollout_result(handle)


def _outcome(result: RolloutResult) -> str:
    text = f"  => {result.outcome.value}: {result.reason}"
    if result.cold_start_seconds is not None:
        text += f"\n     cold start {result.cold_start_seconds:.1f}s"
    if result.benchmark:
        b = result.benchmark
        text += f"; warm-up benchmark {b.tokens_per_second:.0f} tokens/s, p50 {b.p50_latency_seconds:.2f}s, p99 {b.p99_latency_seconds:.2f}s"
    if result.golden is not None:
        text += f"\n     {result.golden.describe()}"
    if result.shadow is not None:
        text += f"\n     {result.shadow.describe()}"
        for pair in result.shadow.examples[:2]:
            text += f"\n       e.g. {describe_pair(pair)}"
    if result.route_reverted_seconds is not None:
        text += f"\n     traffic back on stable {result.route_reverted_seconds:.1f}s after the failing gate"
    return text


async def _rollouts(sandbox: Sandbox, config: Settings) -> None:
    client = await connect(config)
    for version, _, what in RELEASES:
        print(f"\nRolling out {DEMO_MODEL} {version} ({what}) to {DEMO_DEPLOYMENT}")
        _start_with_cli(sandbox, version)
        try:
            print(_outcome(await _follow(client, HELD_AT.get(version))))
        except WorkflowFailureError as exc:
            print(f"  => failed: {exc.cause}")


def _notices(sandbox: Sandbox, core: client.CoreV1Api, namespace: str, received_before: int) -> None:
    """What the rollouts told: the webhook receiver's messages of this demo, one line each, and the
    Kubernetes Events they wrote on the versions' Deployments (what ``kubectl describe`` lists)."""
    url = sandbox.urls()["webhook"] + "/messages"
    messages = httpx.get(url, timeout=10).json()[received_before:]
    print(f"\nThe webhook receiver got {len(messages)} notices:\n$ curl -s {url}")
    for message in messages:
        print(f"  {message.get('text')}" + (f"  {message['link']}" if message.get("link") else ""))
    events = [e for e in core.list_namespaced_event(namespace).items if e.reporting_component == MANAGED_BY]
    print(f"\nand the Events on the Deployments ($ kubectl --kubeconfig {sandbox.kubeconfig} describe deployment -n {namespace}):")
    for event in sorted(events, key=lambda e: str(e.last_timestamp or e.metadata.creation_timestamp or "")):
        print(f"  {event.involved_object.name:<12} {event.type:<8} {event.reason:<18} {event.message}")


def _fresh_namespace(core: client.CoreV1Api, namespace: str) -> None:
    """Start the story from an empty namespace, so ``make demo`` can be run again."""
    try:
        core.delete_namespace(namespace)
        print(f"\nDeleted namespace {namespace} left by an earlier demo run")
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    enable_serving_namespace(core.api_client, namespace)


def story(sandbox: Sandbox) -> None:
    """The headline: five rollouts of one deployment: a first deploy, a good release, then three
    stopped by their gates: errors (at 1 %), a wrong must-pass answer (at warm-up, no traffic) and
    drifting answers (at 1 %, by the shadow comparison)."""
    os.environ.update(sandbox.env())  # for the temporal CLI and boto3 the story runs too
    config = load_settings()
    api = api_client(sandbox.urls()["kubeapi"])
    core = client.CoreV1Api(api)
    nodes = raw(core.list_node(_preload_content=False))["items"]
    print(f"\nThe emulated cluster has {len(nodes)} nodes:")
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        labels = node["metadata"]["labels"]
        gpus = node["status"]["allocatable"].get(GPU_RESOURCE, "0")
        print(f"  {node['metadata']['name']:<36} pool={labels.get(NODE_POOL):<14} {labels.get(NODE_CAPACITY_TYPE):<9} {labels.get(NODE_ZONE)}  gpus={gpus}")

    namespace, _ = split_deployment(DEMO_DEPLOYMENT)
    _fresh_namespace(core, namespace)
    registry = registry_cli.open_registry(config)
    print(f"\nRegistering {DEMO_MODEL} {', '.join(v for v, _, _ in RELEASES)} in the model registry (S3) and declaring how each behaves")
    for version, profile, _ in RELEASES:
        registry.register(DEMO_MODEL, version, str(_weights(sandbox, version)), image=DEMO_IMAGE)
        set_profile(api, DEMO_MODEL, version, profile)
    print(f"$ tideplane registry golden set {DEMO_MODEL} {GOLDEN_SET.relative_to(GOLDEN_SET.parents[2])}")
    print(f"  {quality_cli.store_golden(registry, DEMO_MODEL, str(GOLDEN_SET))}")
    set_demand(api, DEMO_DEPLOYMENT, Demand(rps=DEMO_RPS))
    received_before = len(httpx.get(sandbox.urls()["webhook"] + "/messages", timeout=10).json())
    asyncio.run(_rollouts(sandbox, config))
    _notices(sandbox, core, namespace, received_before)

    print(f"\nThe registry now says:\n$ tideplane registry list {DEMO_MODEL}")
    registry_cli.main(["registry", "list", DEMO_MODEL], config)
    print(f"\nkubectl --kubeconfig {sandbox.kubeconfig} get deploy,pods -n {namespace}   # what is left in the cluster")
    print(f"temporal workflow show --workflow-id {rollout_workflow_id(DEMO_DEPLOYMENT)}   # the last rollout's history")


def run(state_dir: Path, config_path: Path, time_scale: float | None) -> int:
    sandbox = Sandbox(state_dir, config_path=config_path, time_scale=time_scale)
    if sandbox.running():
        sandbox.status()  # adopts the running sandbox's ports
        print(f"Using the sandbox already running from {sandbox.state_dir}")
    else:
        print("Starting the sandbox (Temporal, moto, Kubernetes API emulator, fleet simulator, Prometheus)...")
        sandbox.up()
    worker = sandbox.start_worker()
    time.sleep(WORKER_GRACE_SECONDS)
    if not sandbox.status().get("worker", {}).get("up"):
        print(f"The worker exited at start; see {worker['log']}")
        return 1
    story(sandbox)
    urls = sandbox.urls()
    print(
        f"\nTemporal web UI:  {urls['temporal-ui']}\n"
        f"Prometheus:       {urls['prometheus']}   (alerts: {urls['prometheus']}/classic/alerts)\n"
        f"Explore:          source {sandbox.env_file}; temporal workflow list; kubectl get nodes\n"
        f"Stop everything:  make down   (or: .venv/bin/tideplane sandbox down)"
    )
    return 0
