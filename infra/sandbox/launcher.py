"""Start, stop and inspect the local sandbox: Temporal, moto, the Kubernetes API emulator, the
cloud (node provisioner), the fleet simulator, Prometheus and the webhook receiver, all as
background processes on 127.0.0.1.

Everything ``up`` starts is recorded in ``<state dir>/pids.json`` (pid, process start time,
own process group), so ``down`` stops exactly those processes — never anything that merely reuses
a pid — and a second ``up`` while one runs is refused. ``<state dir>/env`` points every tool
(temporal CLI, kubectl, boto3, the worker) at the sandbox.

Payloads are encrypted, as production requires: ``up`` makes a payload key and a codec-server
token once per state dir (files ``payload-key`` and ``codec-token``, mode 0600, kept with
temporal.db so that its histories stay readable), puts the key in the emulator as the Secret the
worker's Deployment names (``tideplane-temporal``, key ``payload-key``, in the worker's namespace),
and the worker, the CLI and the codec server get the value read from that Secret (as a kubelet
resolves the Deployment's secretKeyRef), through the env file; ``tideplane codec-server`` runs as
a component: the temporal CLI reaches it through
TEMPORAL_CODEC_ENDPOINT / TEMPORAL_CODEC_AUTH, the web UI through ``--ui-codec-endpoint`` (its
origin passes without the token: the dev server's UI has no login to take one from).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template

import boto3
import yaml
from kubernetes import client
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.sandbox.config import (
    DEFAULT_CONFIG,
    DEMAND_CONFIGMAP,
    PROFILES_CONFIGMAP,
    SANDBOX_NAMESPACE,
    SandboxConfig,
    load_config,
)
from infra.k8s.monitoring import render
from infra.sandbox.gateway import GATEWAY_METRICS_PATH
from infra.sandbox.kubeclient import api_client, kubeconfig_yaml, raw
from infra.sandbox.node_agents import TARGETS_FILE
from infra.sandbox.pod_discovery import on_file_sd
from infra.sandbox.worker_identity import create_payload_key_secret, install_worker_identity, read_payload_key
from infra.sandbox.ports import free_port

REPO = Path(__file__).resolve().parents[2]
INFERENCE_EXTENSION_CRDS = REPO / "infra" / "k8s" / "inference-extension" / "crds.yaml"
ENVOY_GATEWAY_CRDS = REPO / "infra" / "k8s" / "envoy-gateway" / "crds.yaml"  # BackendTrafficPolicy: queue limits, token quotas
BIN = Path(sys.executable).parent
DEFAULT_STATE_DIR = Path(".tideplane/sandbox")
PROMETHEUS = os.environ.get("TIDEPLANE_PROMETHEUS_BIN", "/usr/bin/prometheus")
PROMTOOL = os.environ.get("TIDEPLANE_PROMTOOL_BIN", "/usr/bin/promtool")
RULES_DIR = REPO / "infra" / "prometheus"
WEIGHTS_BUCKET = "tideplane-models"
SPOT_QUEUE = "tideplane-spot-events"
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class Ports(BaseSettings):
    """Loopback ports of the sandbox; override with TIDEPLANE_SANDBOX_<NAME>_PORT."""

    model_config = SettingsConfigDict(env_prefix="TIDEPLANE_SANDBOX_", extra="ignore")

    temporal_port: int = 7233
    temporal_ui_port: int = 8233
    temporal_http_port: int = 7243
    temporal_metrics_port: int = 7244
    moto_port: int = 15000
    kubeapi_port: int = 16443
    fleet_port: int = 18000
    prometheus_port: int = 19090
    webhook_port: int = 18090
    worker_metrics_port: int = 9464
    codec_port: int = 8081

    @classmethod
    def free(cls) -> Ports:
        """Free ports for every component (tests run beside other sandboxes)."""
        ports: set[int] = set()
        while len(ports) < len(cls.model_fields):
            ports.add(free_port())
        return cls(**dict(zip(cls.model_fields, sorted(ports))))


class SandboxError(RuntimeError):
    """The sandbox cannot start or stop; the message says why."""


class SandboxRunning(SandboxError):
    """``up`` while a sandbox from the same state dir is running."""


def _start_time(pid: int) -> str | None:
    """The kernel's start time of a live (non-zombie) process, or None: identifies it beyond its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _boot_time() -> float:
    """The epoch second the machine booted (process start times count from it)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise SandboxError("no btime in /proc/stat")


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Component:
    name: str
    argv: list[str]
    port: int | None


class Sandbox:
    """The sandbox rooted at one state dir; ``up()`` / ``down()`` / ``status()``."""

    def __init__(
        self,
        state_dir: Path | str = DEFAULT_STATE_DIR,
        ports: Ports | None = None,
        config_path: Path | str = DEFAULT_CONFIG,
        time_scale: float | None = None,
    ):
        self.state_dir = Path(state_dir).resolve()
        self.ports = ports or Ports()
        self.config_path = Path(config_path)
        self.time_scale = time_scale
        self._children: dict[str, subprocess.Popen] = {}

    # -- paths and derived values

    @property
    def pids_file(self) -> Path:
        return self.state_dir / "pids.json"

    @property
    def env_file(self) -> Path:
        return self.state_dir / "env"

    @property
    def kubeconfig(self) -> Path:
        """The operator's (admin) kubeconfig: kubectl, the tests' own checks."""
        return self.state_dir / "kubeconfig"

    @property
    def worker_kubeconfig(self) -> Path:
        """The worker's kubeconfig: its ServiceAccount's token, so RBAC is infra/k8s/base's."""
        return self.state_dir / "worker-kubeconfig"

    @property
    def node_cache_root(self) -> Path:
        """The sandbox nodes' weight caches, a directory per node (infra/sandbox/node_agents.py)."""
        return self.state_dir / "nodes"

    def _secret(self, name: str, make) -> str:
        """A secret of this state dir, made on first use and kept (mode 0600) for every later ``up``."""
        path = self.state_dir / name
        if not path.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(make())
        return path.read_text().strip()

    def node_cache_secret(self) -> str:
        """The node agents' chunk servers ask it (or a version's token derived from it), as the DaemonSet does."""
        return self._secret("node-cache-token", lambda: secrets.token_urlsafe(32))

    def codec_secrets(self) -> dict[str, str]:
        """The payload key, read from its Secret in the emulator (``tideplane-temporal``, as in
        production), and the codec server's bearer token."""
        return {
            "TIDEPLANE_PAYLOAD_ENCRYPTION_KEY": read_payload_key(api_client(self.urls()["kubeapi"])),
            "TIDEPLANE_CODEC_SERVER_TOKEN": self._secret("codec-token", lambda: secrets.token_urlsafe(32)),
        }

    @property
    def worker_pid_file(self) -> Path:
        """Written by any ``tideplane worker`` run with the env file (demo or foreground)."""
        return self.state_dir / "worker.pid"

    @property
    def pod_targets(self) -> Path:
        """The serving job's targets: the pod discovery bridge's file_sd file (infra/sandbox/pod_discovery.py)."""
        return self.state_dir / "pod-targets.json"

    @property
    def pod_network(self) -> str:
        """The emulator's pod IPs are ``<this>.x.y``: loopback, so the fleet simulator serves each pod
        on its own address; the second octet follows the API's port, so sandboxes side by side (tests)
        rarely share one, and is never 0 (127.0.0.1 is where the sandbox's own ports are)."""
        return f"127.{1 + self.ports.kubeapi_port % 254}"

    def _record(self) -> dict:
        try:
            return json.loads(self.pids_file.read_text())
        except (OSError, ValueError):
            return {}

    def _alive(self, entry: dict) -> bool:
        return _start_time(entry["pid"]) == entry["start_time"]

    def running(self) -> bool:
        """True while any process recorded by an earlier ``up`` is still alive."""
        return any(self._alive(p) for p in self._record().get("processes", {}).values())

    def urls(self) -> dict[str, str]:
        p = self.ports
        return {
            "temporal": f"127.0.0.1:{p.temporal_port}",
            "temporal-ui": f"http://127.0.0.1:{p.temporal_ui_port}",
            "moto": f"http://127.0.0.1:{p.moto_port}",
            "kubeapi": f"http://127.0.0.1:{p.kubeapi_port}",
            "fleet": f"http://127.0.0.1:{p.fleet_port}",
            "prometheus": f"http://127.0.0.1:{p.prometheus_port}",
            "nodes": f"http://127.0.0.1:{p.moto_port} (Auto Scaling groups)",
            "pod-discovery": f"{self.pod_targets} (serving pods for Prometheus, from the API's list and watch)",
            "worker": f"http://127.0.0.1:{p.worker_metrics_port}/metrics",
            "webhook": f"http://127.0.0.1:{p.webhook_port}",
            "codec": f"http://127.0.0.1:{p.codec_port}",
        }

    def env(self) -> dict[str, str]:
        """What ``source <state dir>/env`` exports: well-known names and TIDEPLANE_* equivalents."""
        u = self.urls()
        spot_queue = f"{u['moto']}/123456789012/{SPOT_QUEUE}"
        service_urls = u["fleet"] + "/proxy/{namespace}/{service}"
        return {
            "TEMPORAL_ADDRESS": u["temporal"],
            "TIDEPLANE_TEMPORAL_ADDRESS": u["temporal"],
            "KUBECONFIG": str(self.kubeconfig),
            "TIDEPLANE_KUBECONFIG": str(self.worker_kubeconfig),
            "AWS_ENDPOINT_URL": u["moto"],
            "TIDEPLANE_AWS_ENDPOINT_URL": u["moto"],
            **AWS_ENV,
            "TIDEPLANE_AWS_REGION": AWS_ENV["AWS_DEFAULT_REGION"],
            "PROMETHEUS_URL": u["prometheus"],
            "TIDEPLANE_PROMETHEUS_URL": u["prometheus"],
            "TIDEPLANE_SERVICE_URL_TEMPLATE": service_urls,
            "TIDEPLANE_POD_URL_TEMPLATE": u["fleet"] + "/pods/{namespace}/{pod}",
            "TIDEPLANE_SHADOW_PAIRS_URL": u["fleet"] + "/mirror/{namespace}/{name}",
            # the worker's notifications go to the receiver (GET /messages lists them), linking the web UI
            "TIDEPLANE_NOTIFY_WEBHOOK_URL": u["webhook"] + "/notify",
            "TIDEPLANE_WEB_UI_URL": u["temporal-ui"],
            "TIDEPLANE_MODEL_CACHE_DIR": str(self.state_dir / "model-cache"),
            "TIDEPLANE_WEIGHTS_BUCKET": WEIGHTS_BUCKET,
            "TIDEPLANE_SPOT_QUEUE_URL": spot_queue,
            "TIDEPLANE_METRICS_PORT": str(self.ports.worker_metrics_port),
            "TIDEPLANE_METRICS_HOST": "127.0.0.1",
            "TIDEPLANE_PID_FILE": str(self.worker_pid_file),
            "TIDEPLANE_SANDBOX_KUBEAPI_URL": u["kubeapi"],
            "TIDEPLANE_SANDBOX_FLEET_URL": u["fleet"],
            "TIDEPLANE_PAYLOAD_ENCRYPTION_KEY": self.codec_secrets()["TIDEPLANE_PAYLOAD_ENCRYPTION_KEY"],
            "TIDEPLANE_NODE_CACHE_TOKEN": self.node_cache_secret(),  # the worker's staging pods get their version's token from it
            # the temporal CLI's own variables for --codec-endpoint and --codec-auth
            "TEMPORAL_CODEC_ENDPOINT": u["codec"],
            "TEMPORAL_CODEC_AUTH": f"Bearer {self.codec_secrets()['TIDEPLANE_CODEC_SERVER_TOKEN']}",
        }

    # -- up

    def _components(self, config: SandboxConfig, time_scale: float) -> list[Component]:
        p, u, py = self.ports, self.urls(), sys.executable
        temporal = [
            str(BIN / "temporal"), "server", "start-dev", "--ip", "127.0.0.1",
            "--port", str(p.temporal_port), "--ui-port", str(p.temporal_ui_port),
            "--http-port", str(p.temporal_http_port), "--metrics-port", str(p.temporal_metrics_port),
            "--db-filename", str(self.state_dir / "temporal.db"), "--log-level", "warn", "--ui-disable-news-fetch",
            "--ui-codec-endpoint", u["codec"],
        ]
        ui_origins = [arg for host in ("127.0.0.1", "localhost") for arg in ("--allow-origin", f"http://{host}:{p.temporal_ui_port}")]
        codec = [py, "-m", "workers.cli", "codec-server", "--port", str(p.codec_port), *ui_origins, "--ui-without-token"]
        return [
            Component("temporal", temporal, p.temporal_port),
            Component("temporal-ui", [], p.temporal_ui_port),
            Component("codec", codec, p.codec_port),
            Component("moto", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(p.moto_port)], p.moto_port),
            Component("kubeapi", [py, "-m", "infra.sandbox.kubeapi", "--host", "127.0.0.1", "--port", str(p.kubeapi_port), "--time-scale", str(time_scale), "--pod-network", self.pod_network], p.kubeapi_port),
            Component("pod-discovery", [py, "-m", "infra.sandbox.pod_discovery", "--kube-url", u["kubeapi"], "--out", str(self.pod_targets)], None),
            Component("fleet", [py, "-m", "infra.sandbox.fleet_simulator", "--kube-url", u["kubeapi"], "--port", str(p.fleet_port), "--time-scale", str(time_scale)], p.fleet_port),
            Component(
                "prometheus",
                [
                    PROMETHEUS, f"--config.file={self.state_dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.state_dir / 'prometheus'}",
                    f"--web.listen-address=127.0.0.1:{p.prometheus_port}", "--web.enable-lifecycle", "--log.level=warn",
                ],
                p.prometheus_port,
            ),
            Component("webhook", [py, "-m", "infra.sandbox.webhook_receiver", "--port", str(p.webhook_port)], p.webhook_port),
            Component(
                "nodes",
                [py, "-m", "infra.sandbox.nodes", "--kube-url", u["kubeapi"], "--aws-endpoint-url", u["moto"], "--config", str(self.config_path.resolve()), "--time-scale", str(time_scale), "--node-cache-root", str(self.node_cache_root)],
                None,
            ),
        ]

    def up(self, timeout: float = 90.0) -> dict[str, str]:
        """Validate the config, start every component, wait until each answers; returns the URLs.

        Nothing starts when the config is invalid, a sandbox already runs from this state dir, or
        a port is taken; if a component fails to come up, everything started is stopped again.
        """
        config = load_config(self.config_path)
        time_scale = self.time_scale or config.time_scale
        if self.running():
            raise SandboxRunning(f"a sandbox is already running from {self.state_dir} (stop it with `tideplane sandbox down`)")
        components = self._components(config, time_scale)
        busy = [f"{c.name} port {c.port}" for c in components if c.port and _listening(c.port)]
        if busy:
            raise SandboxError("ports in use: " + ", ".join(busy))
        if not Path(PROMETHEUS).exists():
            raise SandboxError(f"{PROMETHEUS} not found: install it with `apt-get install -y prometheus`")

        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "model-cache").mkdir(exist_ok=True)
        self._write_files()
        record = {
            "ports": self.ports.model_dump(),
            "config": str(self.config_path.resolve()),
            "time_scale": time_scale,
            "urls": self.urls(),
            "processes": {},
        }
        argv = {c.name: c.argv for c in components}

        def spawn(*names: str) -> None:
            for name in names:
                record["processes"][name] = self._spawn(name, argv[name])
            self.pids_file.write_text(json.dumps(record, indent=2))

        deadline = time.monotonic() + timeout
        try:
            spawn("moto", "kubeapi", "fleet", "prometheus", "webhook")
            self._wait(components, "moto", deadline)
            self._seed_aws()
            self._wait(components, "kubeapi", deadline)
            self._seed_cluster(config)
            self._write_env_file()  # the payload key is read from its Secret now
            spawn("pod-discovery", "nodes", "codec")
            self._wait(components, "fleet", deadline)
            self._wait(components, "prometheus", deadline)
            self._wait(components, "webhook", deadline)
            self._wait(components, "codec", deadline)
            # Temporal last: its internal services take random free ports, which must not be ours.
            spawn("temporal")
            self._wait_nodes(sum(p.count for p in config.node_pools), deadline)
            self._wait(components, "temporal", deadline)
            self._setup_temporal()
            self._wait(components, "temporal-ui", deadline)
            for name in record["processes"]:
                self._check_alive(name)
        except BaseException:
            self.down()
            raise
        return self.urls()

    def _setup_temporal(self) -> None:
        """Registers the search attributes as a user does: `tideplane setup temporal` (workers/cli/setup.py)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEPLANE_TEMPORAL_", "TEMPORAL_"))}
        env["TIDEPLANE_PAYLOAD_ENCRYPTION_KEY"] = self.codec_secrets()["TIDEPLANE_PAYLOAD_ENCRYPTION_KEY"]
        done = subprocess.run(
            [str(BIN / "tideplane"), "setup", "temporal", "--address", self.urls()["temporal"], "--namespace", "default"],
            env=env, capture_output=True, text=True, timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"tideplane setup temporal failed: {(done.stderr or done.stdout).strip()}")

    def _write_env_file(self) -> None:
        self.env_file.write_text(
            "# Generated by `tideplane sandbox up`: source it to point temporal, kubectl, boto3 and the worker at the sandbox.\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env().items())
            + f'export PATH={shlex.quote(str(BIN))}:"$PATH"   # temporal, tideplane\n'
        )

    def _write_files(self) -> None:
        self.kubeconfig.write_text(kubeconfig_yaml(self.urls()["kubeapi"]))
        rules = [str(f) for f in sorted(RULES_DIR.glob("*.yml")) if self._valid_rules(f)]
        self.pod_targets.write_text("[]")  # no pods until the bridge has listed them
        [serving] = [job for job in render.scrape_configs() if job["job_name"] == render.SERVING_JOB]
        template = Template((Path(__file__).with_name("prometheus.yml.tmpl")).read_text())
        (self.state_dir / "prometheus.yml").write_text(
            template.substitute(
                rule_files=json.dumps(rules),
                fleet=f"127.0.0.1:{self.ports.fleet_port}",
                gateway_metrics_path=GATEWAY_METRICS_PATH,
                serving_job=json.dumps(on_file_sd(serving, self.pod_targets)),
                worker=f"127.0.0.1:{self.ports.worker_metrics_port}",
                node_cache_targets=str(self.node_cache_root / TARGETS_FILE),
            )
        )

    def _valid_rules(self, path: Path) -> bool:
        """A broken rule file would stop Prometheus from starting; skip it and say so in the log."""
        check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
        if check.returncode != 0:
            log = self.state_dir / "logs" / "prometheus-rules.log"
            log.write_text(f"skipped {path}:\n{check.stdout}{check.stderr}")
        return check.returncode == 0

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> dict:
        log = open(self.state_dir / "logs" / f"{name}.log", "ab")
        proc = subprocess.Popen(
            argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, **self._component_env(name), **(env or {}), "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        self._children[name] = proc
        start = None
        for _ in range(50):
            start = _start_time(proc.pid)
            if start:
                break
            time.sleep(0.01)
        return {"pid": proc.pid, "start_time": start, "argv": argv, "log": str(self.state_dir / "logs" / f"{name}.log")}

    def _component_env(self, name: str) -> dict[str, str]:
        """What a component needs beyond the inherited environment (also on ``restart``)."""
        if name == "nodes":
            return {"TIDEPLANE_NODE_CACHE_TOKEN": self.node_cache_secret()}
        return self.codec_secrets() if name == "codec" else {}

    def _check_alive(self, name: str) -> None:
        proc = self._children.get(name)
        if proc is not None and proc.poll() is not None:
            tail = (self.state_dir / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
            raise SandboxError(f"{name} exited with status {proc.returncode}:\n{tail}")

    def _wait(self, components: list[Component], name: str, deadline: float) -> None:
        component = next(c for c in components if c.name == name)
        owner = "temporal" if name == "temporal-ui" else name
        while not _listening(component.port):
            self._check_alive(owner)
            if time.monotonic() > deadline:
                raise SandboxError(f"{name} did not listen on port {component.port} in time (log: {self.state_dir}/logs/{owner}.log)")
            time.sleep(0.1)

    def _seed_aws(self) -> None:
        """The weights bucket and the spot-interruption queue."""
        kwargs = {"endpoint_url": self.urls()["moto"], "region_name": AWS_ENV["AWS_DEFAULT_REGION"], "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        s3 = boto3.client("s3", **kwargs)
        s3.create_bucket(Bucket=WEIGHTS_BUCKET)
        boto3.client("sqs", **kwargs).create_queue(QueueName=SPOT_QUEUE)

    def _seed_cluster(self, config: SandboxConfig) -> None:
        """The sandbox namespace with the fleet's runtime knobs (profiles, demand) as ConfigMaps, the
        Gateway API Inference Extension's and Envoy Gateway's CRDs, and the worker's ServiceAccount,
        RBAC and kubeconfig."""
        core = client.CoreV1Api(api_client(self.urls()["kubeapi"]))
        configmaps = {PROFILES_CONFIGMAP: config.profiles, DEMAND_CONFIGMAP: config.demand}
        creates = [lambda: core.create_namespace({"metadata": {"name": SANDBOX_NAMESPACE}})] + [
            lambda name=name, data=data: core.create_namespaced_config_map(
                SANDBOX_NAMESPACE, {"metadata": {"name": name}, "data": {k: v.model_dump_json() for k, v in data.items()}}
            )
            for name, data in configmaps.items()
        ]
        extensions = client.ApiextensionsV1Api(core.api_client)
        for crd in yaml.safe_load_all(INFERENCE_EXTENSION_CRDS.read_text()):  # a cluster with the extension installed
            creates.append(lambda crd=crd: extensions.create_custom_resource_definition(crd))
        for crd in yaml.safe_load_all(ENVOY_GATEWAY_CRDS.read_text()):  # ... and Envoy Gateway
            creates.append(lambda crd=crd: extensions.create_custom_resource_definition(crd))
        for create in creates:
            try:
                create()
            except client.ApiException as exc:
                if exc.status != 409:  # already there: leave what someone set
                    raise
        token = install_worker_identity(core.api_client)
        self.worker_kubeconfig.write_text(kubeconfig_yaml(self.urls()["kubeapi"], token))
        # the payload key (base64 of 32 bytes, AES-256) from the state dir, so that temporal.db's
        # histories stay readable after the emulator, which keeps nothing, starts again
        create_payload_key_secret(core.api_client, self._secret("payload-key", lambda: base64.b64encode(os.urandom(32)).decode()))

    def _wait_nodes(self, expected: int, deadline: float) -> None:
        core = client.CoreV1Api(api_client(self.urls()["kubeapi"]))
        while len(raw(core.list_node(_preload_content=False))["items"]) < expected:
            self._check_alive("nodes")
            if time.monotonic() > deadline:
                raise SandboxError(f"the node provisioner did not register {expected} nodes in time (log: {self.state_dir}/logs/nodes.log)")
            time.sleep(0.2)

    # -- worker (demo)

    def started_worker(self) -> int | None:
        """The pid of a worker that recorded itself in ``worker_pid_file`` and still runs.

        A pid reused by a process started after the file was written is not that worker.
        """
        try:
            pid = int(self.worker_pid_file.read_text())
            written = self.worker_pid_file.stat().st_mtime
        except (OSError, ValueError):
            return None
        start = _start_time(pid)
        return pid if start is not None and _boot_time() + int(start) / os.sysconf("SC_CLK_TCK") <= written + 1 else None

    def start_worker(self) -> dict:
        """Run ``tideplane worker`` in the background against this sandbox; ``down`` stops it too."""
        record = self._record()
        if not record:
            raise SandboxError("the sandbox is not running")
        self.ports = Ports(**record["ports"])
        if "worker" in record["processes"] and self._alive(record["processes"]["worker"]):
            return record["processes"]["worker"]
        if pid := self.started_worker():
            return {"pid": pid, "log": "the terminal that runs it"}
        entry = self._spawn("worker", [sys.executable, "-m", "workers.cli", "worker"], env=self.env())
        record["processes"]["worker"] = entry
        self.pids_file.write_text(json.dumps(record, indent=2))
        return entry

    # -- one component (fault tests: Prometheus or Temporal going away and coming back)

    def stop(self, name: str, timeout: float = 15.0) -> None:
        """Stop one recorded component (its process group); its record stays, for ``restart``."""
        entry = self._record()["processes"][name]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self._alive(entry):
                break
            try:
                os.killpg(entry["pid"], sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + timeout
            while self._alive(entry) and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.1)
        self._reap()

    def restart(self, name: str, timeout: float = 60.0) -> dict:
        """Stop one component if it runs, start it again with the same argv (so the same ports,
        config and data: Temporal's --db-filename, Prometheus' TSDB) and wait until it listens."""
        record = self._record()
        self.ports = Ports(**record["ports"])
        self.stop(name)
        entry = self._spawn(name, record["processes"][name]["argv"])
        record["processes"][name] = entry
        self.pids_file.write_text(json.dumps(record, indent=2))
        port = getattr(self.ports, f"{name}_port", None)
        deadline = time.monotonic() + timeout
        while port is not None and not _listening(port):
            self._check_alive(name)
            if time.monotonic() > deadline:
                raise SandboxError(f"{name} did not listen on port {port} after a restart (log: {entry['log']})")
            time.sleep(0.1)
        return entry

    # -- down and status

    def down(self, timeout: float = 15.0) -> list[str]:
        """Stop the recorded processes (whole process groups); returns the names stopped."""
        record = self._record()
        processes = record.get("processes", {})
        alive = {name: p for name, p in processes.items() if self._alive(p)}
        for entry in alive.values():
            try:
                os.killpg(entry["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while any(self._alive(p) for p in alive.values()) and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.1)
        for entry in alive.values():
            if self._alive(entry):
                try:
                    os.killpg(entry["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._reap(wait=True)
        if self._stop_started_worker(timeout) and "worker" not in alive:
            alive["worker"] = {}
        ports = [port for port in record.get("ports", {}).values()]
        deadline = time.monotonic() + 5
        while any(_listening(port) for port in ports) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pids_file.unlink(missing_ok=True)
        return list(alive)

    def _stop_started_worker(self, timeout: float) -> bool:
        """SIGTERM (then SIGKILL) the worker in ``worker_pid_file`` — that process only, not its
        group: a foreground worker shares its terminal's. True when one was running."""
        pid = self.started_worker()
        if pid is None:
            return False
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + timeout
            while self.started_worker() == pid and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.started_worker() != pid:
                break
        self.worker_pid_file.unlink(missing_ok=True)
        return True

    def _reap(self, wait: bool = False) -> None:
        """Collect exit statuses of children this object started (else they linger as zombies)."""
        for proc in self._children.values():
            try:
                proc.wait(2) if wait else proc.poll()
            except subprocess.TimeoutExpired:
                pass

    def status(self) -> dict[str, dict]:
        """name -> {"up": bool, "url": str} for every component of the recorded sandbox."""
        record = self._record()
        if not record:
            return {}
        self.ports = Ports(**record["ports"])
        out = {}
        for name, entry in record["processes"].items():
            up = self._alive(entry)
            out[name] = {"up": up, "url": record["urls"][name]}
            if name == "temporal":
                out["temporal-ui"] = {"up": up and _listening(self.ports.temporal_ui_port), "url": record["urls"]["temporal-ui"]}
        if self.started_worker():  # e.g. restarted in the foreground, as the README says
            out["worker"] = {"up": True, "url": record["urls"]["worker"]}
        return out

