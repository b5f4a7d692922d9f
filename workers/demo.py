"""``tideplane demo``: bring the sandbox and the worker up, then tell the story.

The story is the part each feature extends (the rollout issue adds a rollout to watch in the
UI); what surrounds it — sandbox up if needed, worker in the background, where to look, how to
stop — stays here so ``make demo`` ends with the sandbox left running for exploration.
"""

from __future__ import annotations

import time
from pathlib import Path

from kubernetes import client

from infra.sandbox.kubeclient import api_client, raw
from infra.sandbox.launcher import Sandbox
from workflows.naming import GPU_RESOURCE, NODE_CAPACITY_TYPE, NODE_POOL, NODE_ZONE

WORKER_GRACE_SECONDS = 3.0


def story(sandbox: Sandbox) -> None:
    """What the demo shows once everything runs: for now, the GPU cluster the sandbox emulates."""
    core = client.CoreV1Api(api_client(sandbox.urls()["kubeapi"]))
    nodes = raw(core.list_node(_preload_content=False))["items"]
    print(f"\nThe emulated cluster has {len(nodes)} nodes:")
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        labels = node["metadata"]["labels"]
        gpus = node["status"]["allocatable"].get(GPU_RESOURCE, "0")
        print(f"  {node['metadata']['name']:<36} pool={labels.get(NODE_POOL):<14} {labels.get(NODE_CAPACITY_TYPE):<9} {labels.get(NODE_ZONE)}  gpus={gpus}")


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
        f"Prometheus:       {urls['prometheus']}\n"
        f"Explore:          source {sandbox.env_file}; temporal workflow list; kubectl get nodes\n"
        f"Stop everything:  make down   (or: .venv/bin/tideplane sandbox down)"
    )
    return 0
