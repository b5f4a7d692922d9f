"""End to end against the whole sandbox: each tool talks its real protocol to the stand-in."""

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import boto3
import httpx
import pytest
import yaml
from kubernetes import client, config
from prometheus_api_client import PrometheusConnect
from prometheus_client.parser import text_string_to_metric_families

from infra.k8s.monitoring import render
from infra.sandbox.config import DEMAND_CONFIGMAP, SANDBOX_NAMESPACE
from infra.sandbox.launcher import RULES_DIR, Ports, Sandbox, SandboxRunning
from infra.sandbox.worker_identity import WORKER_NAMESPACE
from tests.sandbox_fixtures import TEST_CONFIG, create_logical_deployment, revive_dead_components, wait_until
from workflows.core.engine_metrics import SCRAPE_LABELS
from workflows.core.naming import GPU_RESOURCE, NODE_CAPACITY_TYPE, NODE_POOL

BIN = Path(sys.executable).parent
NAMESPACE = "e2e-fleet"


def _kube(sandbox) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(sandbox.kubeconfig))


def test_s3_and_sqs_through_moto(sandbox):
    aws = {"endpoint_url": sandbox.env["AWS_ENDPOINT_URL"], "region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    s3 = boto3.client("s3", **aws)
    s3.put_object(Bucket="tideplane-models", Key="llama/1.0.0/model.safetensors", Body=b"weights")
    assert s3.get_object(Bucket="tideplane-models", Key="llama/1.0.0/model.safetensors")["Body"].read() == b"weights"
    sqs = boto3.client("sqs", **aws)
    queue = sandbox.env["TIDEPLANE_SPOT_QUEUE_URL"]
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"detail-type": "EC2 Spot Instance Interruption Warning"}))
    messages = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)["Messages"]
    assert json.loads(messages[0]["Body"])["detail-type"] == "EC2 Spot Instance Interruption Warning"


def test_kubectl_lists_the_gpu_nodes_of_each_pool(sandbox):
    out = subprocess.run(["kubectl", "--kubeconfig", str(sandbox.kubeconfig), "get", "nodes", "-o", "json"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["items"]
    pools = {}
    for node in nodes:
        labels = node["metadata"]["labels"]
        pools.setdefault(labels[NODE_POOL], []).append(node)
        assert node["spec"]["providerID"].startswith("aws:///us-east-1")
    assert {name: len(members) for name, members in pools.items()} == {p["name"]: p["count"] for p in TEST_CONFIG["node_pools"] if p["count"]}
    assert all(n["status"]["allocatable"][GPU_RESOURCE] == "4" for n in pools["gpu-spot"] + pools["gpu-on-demand"])
    assert {n["metadata"]["labels"][NODE_CAPACITY_TYPE] for n in pools["gpu-spot"]} == {"spot"}
    table = subprocess.run(["kubectl", "--kubeconfig", str(sandbox.kubeconfig), "get", "nodes"], capture_output=True, text=True, timeout=30)
    assert table.returncode == 0 and "Ready" in table.stdout


def test_temporal_cli_and_web_ui_answer(sandbox):
    address = sandbox.env["TEMPORAL_ADDRESS"]
    namespaces = subprocess.run([str(BIN / "temporal"), "operator", "namespace", "list", "--address", address], capture_output=True, text=True, timeout=30)
    assert namespaces.returncode == 0, namespaces.stderr
    assert "default" in namespaces.stdout
    attributes = subprocess.run([str(BIN / "temporal"), "operator", "search-attribute", "list", "--address", address], capture_output=True, text=True, timeout=30)
    assert "TideplaneDeployment" in attributes.stdout and "TideplaneCanaryPercent" in attributes.stdout
    with urllib.request.urlopen(sandbox.urls["temporal-ui"], timeout=10) as response:
        assert response.status == 200


def test_sourced_env_file_points_the_tools_at_the_sandbox(sandbox):
    script = f"source {sandbox.state_dir / 'env'} && temporal operator namespace list && kubectl get nodes -o name"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")})
    assert out.returncode == 0, out.stderr
    assert "default" in out.stdout
    assert out.stdout.count("node/ip-") == sum(p["count"] for p in TEST_CONFIG["node_pools"])


def test_sandbox_payloads_are_ciphertext_in_temporal_and_clear_through_its_codec_server(sandbox):
    """The sandbox encrypts as production must. A `temporal workflow start` from the sourced env file
    (TEMPORAL_CODEC_ENDPOINT / TEMPORAL_CODEC_AUTH: the sandbox's codec server) stores its input
    encrypted: `workflow show` without the codec sees only ciphertext, with it the input; without the
    token the codec server decodes nothing."""
    marker = f"sandbox-marker-{uuid.uuid4().hex[:8]}"
    workflow_id = f"codec-{marker}"

    def sourced(command: str) -> subprocess.CompletedProcess:
        script = f"source {sandbox.state_dir / 'env'} && {command}"
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")})

    def start_input(without: str = "") -> dict:
        shown = sourced(f"{without} temporal workflow show -w {workflow_id} --output json")
        assert shown.returncode == 0, shown.stderr
        (payload,) = json.loads(shown.stdout)["events"][0]["workflowExecutionStartedEventAttributes"]["input"]["payloads"]
        return payload

    started = sourced(f"temporal workflow start --type ModelRollout --task-queue no-worker -w {workflow_id} --input '{{\"marker\": \"{marker}\"}}'")
    assert started.returncode == 0, started.stderr
    try:
        sealed = start_input("env -u TEMPORAL_CODEC_ENDPOINT -u TEMPORAL_CODEC_AUTH")
        assert base64.b64decode(sealed["metadata"]["encoding"]) == b"binary/encrypted"
        assert marker.encode() not in base64.b64decode(sealed["data"])
        clear = start_input()
        assert json.loads(base64.b64decode(clear["data"])) == {"marker": marker}
        refused = sourced(f"env -u TEMPORAL_CODEC_AUTH temporal workflow show -w {workflow_id} --output json")
        assert refused.returncode != 0 and marker not in refused.stdout  # the CLI reports the 401 as a failed decode
    finally:
        sourced(f"temporal workflow terminate -w {workflow_id} --reason test-done")


def payload_key_secret(sandbox) -> str:
    """The payload key as `kubectl get secret` in the sandbox shows it (the operator's view)."""
    script = f"source {sandbox.state_dir / 'env'} && kubectl get secret -n {WORKER_NAMESPACE} tideplane-temporal -o json"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")})
    assert out.returncode == 0, out.stderr
    return base64.b64decode(json.loads(out.stdout)["data"]["payload-key"]).decode()


def test_the_payload_key_is_the_secret_the_workers_deployment_names_and_the_env_reads_it(sandbox):
    """As in production (infra/k8s/base: Secret tideplane-temporal, key payload-key): the key is a
    Secret in the emulator, and the worker's env carries the value read from it, not from a file."""
    key = payload_key_secret(sandbox)
    assert len(base64.b64decode(key)) == 32 and sandbox.env["TIDEPLANE_PAYLOAD_ENCRYPTION_KEY"] == key
    assert f"export TIDEPLANE_PAYLOAD_ENCRYPTION_KEY={key}" in (sandbox.state_dir / "env").read_text()
    core = client.CoreV1Api(_kube(sandbox))
    other = base64.b64encode(os.urandom(32)).decode()
    try:
        core.patch_namespaced_secret("tideplane-temporal", WORKER_NAMESPACE, {"data": {"payload-key": base64.b64encode(other.encode()).decode()}})
        assert sandbox.sandbox.env()["TIDEPLANE_PAYLOAD_ENCRYPTION_KEY"] == other
    finally:
        core.patch_namespaced_secret("tideplane-temporal", WORKER_NAMESPACE, {"data": {"payload-key": base64.b64encode(key.encode()).decode()}})


def test_prometheus_returns_vllm_metrics_of_a_running_deployment(sandbox):
    api = _kube(sandbox)
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    service = create_logical_deployment(api, NAMESPACE, "chat", "1.0.0", "llama-3-8b", replicas=2)
    core.patch_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, {"data": {f"{NAMESPACE}/chat": json.dumps({"rps": 6})}})
    wait_until(lambda: apps.read_namespaced_deployment(service, NAMESPACE).status.ready_replicas == 2, 30, "2 Ready replicas")

    def complete():  # the fleet sees new Ready pods on its next tick, like endpoints propagating
        response = httpx.post(sandbox.urls["fleet"] + f"/proxy/{NAMESPACE}/{service}/v1/completions", json={"prompt": "Hello", "max_tokens": 8}, timeout=10)
        return response.status_code == 200 and response.json()

    completion = wait_until(complete, 10, "a completion from the new pods")
    assert completion["object"] == "text_completion" and completion["usage"]["completion_tokens"] == 8
    assert httpx.post(sandbox.urls["fleet"] + f"/proxy/{NAMESPACE}/nothing/v1/completions", json={"prompt": "x"}, timeout=10).status_code == 503

    prom = PrometheusConnect(url=sandbox.urls["prometheus"], disable_ssl=True)
    selector = f'namespace="{NAMESPACE}",deployment="chat",version="1.0.0"'
    rate = wait_until(lambda: prom.custom_query(f"sum(rate(vllm:request_success_total{{{selector}}}[5s]))"), 30, "the success rate to be scraped")
    assert float(rate[0]["value"][1]) > 0
    running = prom.custom_query(f"vllm:num_requests_running{{{selector}}}")
    assert {r["metric"]["model_name"] for r in running} == {"llama-3-8b"}
    assert len({r["metric"]["pod"] for r in running}) == 2 and all(r["metric"]["node"].startswith("ip-") for r in running)
    ttft = prom.custom_query(f"histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{{selector}}}[5s])))")
    assert 0 < float(ttft[0]["value"][1]) < 1
    gpus = prom.custom_query(f'DCGM_FI_DEV_FB_USED{{namespace="{NAMESPACE}"}}')
    assert len(gpus) == 2 and all(float(g["value"][1]) > 0 for g in gpus)

    # demand beyond the two replicas' capacity (2 x 4 rps): requests queue, GPUs saturate
    core.patch_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, {"data": {f"{NAMESPACE}/chat": json.dumps({"rps": 20})}})
    wait_until(lambda: prom.custom_query(f"sum(vllm:num_requests_waiting{{{selector}}}) > 10"), 15, "requests to queue")
    wait_until(lambda: prom.custom_query(f'min(DCGM_FI_DEV_GPU_UTIL{{namespace="{NAMESPACE}"}}) == 100'), 10, "saturated GPUs")
    core.patch_namespaced_config_map(DEMAND_CONFIGMAP, SANDBOX_NAMESPACE, {"data": {f"{NAMESPACE}/chat": json.dumps({"rps": 0})}})


def test_prometheus_finds_the_serving_pods_by_discovery_and_labels_them_with_the_shipped_rules(sandbox):
    """The serving job is the shipped one (infra/k8s/monitoring/render.py) over the pod discovery
    bridge: each Ready serving pod is a target at its own IP, its discovered labels the pod role's,
    its labels made by the relabel rules; the pod's own exposition has vLLM's labels only."""
    namespace = "e2e-discovery"
    api = _kube(sandbox)
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    service = create_logical_deployment(api, namespace, "chat", "2.0.0", "llama-3-8b", replicas=1)
    wait_until(lambda: apps.read_namespaced_deployment(service, namespace).status.ready_replicas == 1, 30, "a Ready replica")
    [pod] = core.list_namespaced_pod(namespace).items

    def serving_target():
        active = httpx.get(sandbox.urls["prometheus"] + "/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return next((t for t in active if t["labels"]["job"] == render.SERVING_JOB
                     and t["labels"].get("namespace") == namespace and t["health"] == "up"), None)

    target = wait_until(serving_target, 30, "the pod as a healthy target of the serving job")
    assert pod.status.pod_ip.startswith(sandbox.sandbox.pod_network + ".")
    assert target["scrapeUrl"] == f"http://{pod.status.pod_ip}:8000/metrics"
    discovered = target["discoveredLabels"]
    assert (discovered["__meta_kubernetes_pod_name"], discovered["__meta_kubernetes_pod_ip"]) == (pod.metadata.name, pod.status.pod_ip)
    assert discovered["__meta_kubernetes_pod_label_app_kubernetes_io_version"] == "2.0.0"
    assert {k: target["labels"][k] for k in SCRAPE_LABELS} == {
        "namespace": namespace, "pod": pod.metadata.name, "deployment": "chat", "version": "2.0.0", "node": pod.spec.node_name}
    exposition = httpx.get(target["scrapeUrl"], timeout=5).text
    labels = {name for family in text_string_to_metric_families(exposition) for sample in family.samples for name in sample.labels}
    assert "vllm:num_requests_running" in exposition and not labels & set(SCRAPE_LABELS), labels
    prom = PrometheusConnect(url=sandbox.urls["prometheus"], disable_ssl=True)
    jobs = wait_until(lambda: prom.custom_query(f'count by (job) (vllm:num_requests_running{{namespace="{namespace}"}})'), 10, "the pod's series")
    assert [j["metric"]["job"] for j in jobs] == [render.SERVING_JOB]  # no other job carries engine series


def test_the_gateways_series_are_its_own_job_and_no_engine_or_gateway_job_honours_labels(sandbox):
    """The gateway is not vLLM: its series come from a job of its own, labelled as the gateway
    labels them, and neither it nor any job scraping engines keeps an exposition's labels over the
    target's (honor_labels), so no process can pass product labels off as discovered ones."""
    namespace = "e2e-gateway-job"
    api = _kube(sandbox)
    service = create_logical_deployment(api, namespace, "chat", "1.0.0", "llama-3-8b", replicas=1)
    wait_until(lambda: client.AppsV1Api(api).read_namespaced_deployment(service, namespace).status.ready_replicas == 1, 30, "a Ready replica")

    def through_the_gateway():  # 503 until the fleet's next tick has seen the Ready pod
        answer = httpx.post(f"{sandbox.urls['fleet']}/gateway/{namespace}/chat/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        return answer if answer.status_code != 503 else None

    answer = wait_until(through_the_gateway, 10, "the gateway to reach the Ready pod")
    prom = PrometheusConnect(url=sandbox.urls["prometheus"], disable_ssl=True)
    jobs = wait_until(lambda: prom.custom_query(f'count by (job) (inference_objective_request_total{{namespace="{namespace}"}})'), 10,
                      f"the gateway's series of its answer ({answer.status_code} {answer.text[:200]})")
    assert [j["metric"]["job"] for j in jobs] == ["gateway"]
    loaded = yaml.safe_load(httpx.get(sandbox.urls["prometheus"] + "/api/v1/status/config", timeout=5).json()["data"]["yaml"])
    honoured = {job["job_name"] for job in loaded["scrape_configs"] if job.get("honor_labels")}
    assert not honoured & {render.SERVING_JOB, "fleet", "gateway"}, honoured


def test_asg_scale_up_joins_a_node_after_boot_and_termination_removes_it(sandbox):
    aws = {"endpoint_url": sandbox.env["AWS_ENDPOINT_URL"], "region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    autoscaling = boto3.client("autoscaling", **aws)
    core = client.CoreV1Api(_kube(sandbox))

    def spot_nodes():
        return {n.spec.provider_id.rsplit("/", 1)[1]: n.metadata.name for n in core.list_node(label_selector=f"{NODE_POOL}=gpu-spot").items}

    before = spot_nodes()
    started = time.monotonic()
    autoscaling.set_desired_capacity(AutoScalingGroupName="gpu-spot", DesiredCapacity=len(before) + 1)
    time.sleep(1)
    assert spot_nodes() == before  # still booting
    after = wait_until(lambda: len(nodes := spot_nodes()) > len(before) and nodes, 20, "the new instance to join")
    boot = 90 / TEST_CONFIG["time_scale"]
    assert time.monotonic() - started > boot * 0.8
    (new_instance,) = set(after) - set(before)
    node = core.read_node(after[new_instance])
    assert node.metadata.labels[NODE_CAPACITY_TYPE] == "spot" and node.status.allocatable[GPU_RESOURCE] == "4"
    autoscaling.terminate_instance_in_auto_scaling_group(InstanceId=new_instance, ShouldDecrementDesiredCapacity=True)
    wait_until(lambda: spot_nodes() == before, 10, "the terminated instance's node to go")


def test_worker_polls_the_sandbox_is_scraped_and_stops_on_sigterm(sandbox):
    worker = subprocess.Popen([str(BIN / "tideplane"), "worker"], env={**os.environ, **sandbox.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        prom = PrometheusConnect(url=sandbox.urls["prometheus"], disable_ssl=True)
        wait_until(lambda: worker.poll() is not None or prom.custom_query('up{job="tideplane-worker"} == 1'), 60, "Prometheus to scrape the worker")
        assert worker.poll() is None, f"the worker exited with {worker.returncode}: {worker.stdout.read()}"
        pollers = subprocess.run(
            [str(BIN / "temporal"), "task-queue", "describe", "--task-queue", "tideplane", "--address", sandbox.env["TEMPORAL_ADDRESS"], "-o", "json"],
            capture_output=True, text=True, timeout=30,
        )
        assert pollers.returncode == 0 and "pollers" in pollers.stdout.lower(), pollers.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            output, _ = worker.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            worker.kill()
            raise
    assert worker.returncode == 0, output
    assert "stopping" in output


@pytest.mark.parametrize("kind", [[], ["--rebalance"]], ids=["interruption", "rebalance"])
def test_spot_interrupt_refuses_on_demand_and_unknown_nodes(sandbox, kind):
    """Only spot instances get interruption notices; an on-demand node or a typo is refused in
    one line (no traceback), and its instance keeps running."""
    core = client.CoreV1Api(_kube(sandbox))
    (node, *_) = core.list_node(label_selector=f"{NODE_CAPACITY_TYPE}=on-demand,{NODE_POOL}=gpu-on-demand").items
    cli = [str(BIN / "tideplane"), "sandbox", "spot-interrupt", "--state-dir", str(sandbox.state_dir), *kind]
    refused = subprocess.run([*cli, node.metadata.name], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr == (
        f"tideplane: error: node '{node.metadata.name}' is on-demand capacity ({NODE_CAPACITY_TYPE}=on-demand): "
        "EC2 sends interruption notices and rebalance recommendations to spot instances only\n"
    )
    instance = node.spec.provider_id.rsplit("/", 1)[1]
    aws = {"endpoint_url": sandbox.env["AWS_ENDPOINT_URL"], "region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    (found,) = boto3.client("autoscaling", **aws).describe_auto_scaling_instances(InstanceIds=[instance])["AutoScalingInstances"]
    assert found["LifecycleState"] == "InService"

    unknown = subprocess.run([*cli, "ip-10-9-9-9.ec2.internal"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert unknown.stderr.startswith("tideplane: error: no node 'ip-10-9-9-9.ec2.internal' in the sandbox")


def test_prometheus_loads_the_repository_rule_files(sandbox):
    groups = httpx.get(sandbox.urls["prometheus"] + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    assert {Path(g["file"]).name for g in groups} == {f.name for f in RULES_DIR.glob("*.yml")}


def test_the_readme_alerts_link_is_served_by_the_sandbox_prometheus(sandbox):
    """Debian's Prometheus 2.42 has no React UI: /alerts is a 404, the README must link /classic/alerts."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (path,) = set(re.findall(r"http://localhost:19090(/\S*alerts)", readme))
    page = httpx.get(sandbox.urls["prometheus"] + path, timeout=10)
    assert page.status_code == 200 and "GPUUtilisationHigh" in page.text  # a rule of infra/prometheus/alerts.yml


def test_status_reports_every_component_up(sandbox):
    status = sandbox.sandbox.status()
    assert set(status) >= {"temporal", "temporal-ui", "moto", "kubeapi", "pod-discovery", "nodes", "fleet", "prometheus"}
    assert all(entry["up"] for entry in status.values()), status


def test_a_component_that_died_is_running_again_for_the_next_module(sandbox):
    """The suite's guard against one crash failing every later module by timeout."""
    entry = json.loads((sandbox.state_dir / "pids.json").read_text())["processes"]["fleet"]
    os.killpg(entry["pid"], signal.SIGKILL)
    wait_until(lambda: not sandbox.sandbox.status()["fleet"]["up"], 10, "the fleet simulator to die")
    with pytest.warns(UserWarning, match="fleet had died"):
        assert revive_dead_components(sandbox) == ["fleet"]
    assert all(entry["up"] for entry in sandbox.sandbox.status().values())

    def answers() -> bool:
        try:
            return httpx.get(sandbox.urls["fleet"] + "/metrics", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(answers, 30, "the restarted fleet simulator to answer")


def test_second_up_is_refused_without_starting_anything(sandbox):
    before = (sandbox.state_dir / "pids.json").read_text()
    with pytest.raises(SandboxRunning, match="already running"):
        Sandbox(sandbox.state_dir, Ports.free(), sandbox.sandbox.config_path).up()
    cli = subprocess.run([str(BIN / "tideplane"), "sandbox", "up", "--state-dir", str(sandbox.state_dir)], capture_output=True, text=True, timeout=60)
    assert cli.returncode != 0 and "already running" in cli.stderr
    assert (sandbox.state_dir / "pids.json").read_text() == before


@pytest.mark.parametrize(
    "change,field",
    [({"gpu_memory_gib": 0}, "node_pools.0.gpu_memory_gib"), ({"capacity_type": "reserved"}, "node_pools.0.capacity_type")],
)
def test_impossible_node_fails_naming_the_field(tmp_path, change, field):
    bad = {**TEST_CONFIG, "node_pools": [{**TEST_CONFIG["node_pools"][0], **change}]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    cli = subprocess.run([str(BIN / "tideplane"), "sandbox", "up", "--config", str(path), "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2
    assert field in cli.stderr
    assert not (tmp_path / "state").exists()


def _listen_addresses(port: int) -> set[str]:
    """The IPv4 addresses something listens on at ``port`` (/proc/net/tcp, state 0A = LISTEN)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def start_foreground_worker(sandbox) -> subprocess.Popen:
    """`tideplane worker` as the README restarts it: in the caller's process group, env file sourced."""
    worker = subprocess.Popen([str(BIN / "tideplane"), "worker"], env={**os.environ, **sandbox.env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = Path(sandbox.env["TIDEPLANE_PID_FILE"])
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() == str(worker.pid), 60, "the worker to record its pid")
    return worker


def test_a_second_worker_is_refused_and_status_sees_a_restarted_worker(sandbox):
    worker = start_foreground_worker(sandbox)
    try:
        port = sandbox.sandbox.ports.worker_metrics_port
        assert _listen_addresses(port) == {"127.0.0.1"}  # loopback only in the sandbox
        second = subprocess.run([str(BIN / "tideplane"), "worker"], env={**os.environ, **sandbox.env}, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and "Traceback" not in second.stderr
        (line,) = [line for line in second.stderr.splitlines() if line.startswith("tideplane:")]
        assert f"127.0.0.1:{port}" in line and "TIDEPLANE_METRICS_PORT" in line and "another worker" in line
        assert Path(sandbox.env["TIDEPLANE_PID_FILE"]).read_text().strip() == str(worker.pid)

        status = subprocess.run([str(BIN / "tideplane"), "sandbox", "status", "--state-dir", str(sandbox.state_dir)], capture_output=True, text=True, timeout=60)
        (row,) = [r for r in status.stdout.splitlines() if r.startswith("worker ")]
        assert row.split()[1] == "up", status.stdout
    finally:
        worker.terminate()
        worker.wait(60)
    assert not Path(sandbox.env["TIDEPLANE_PID_FILE"]).exists()  # removed on a graceful stop


def test_down_leaves_nothing_listening_then_up_again(sandbox):
    """Runs last in this module: stops the session sandbox, checks, and brings it back."""
    box = sandbox.sandbox
    pids = [p["pid"] for p in json.loads((sandbox.state_dir / "pids.json").read_text())["processes"].values()]
    ports = list(box.ports.model_dump().values())
    worker = start_foreground_worker(sandbox)  # not started by `up`: down stops it (only it, not our process group)
    assert "worker" in box.down()
    assert worker.wait(5) is not None
    for port in ports:
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still listening"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert not box.running() and not (sandbox.state_dir / "pids.json").exists()
    key = sandbox.env["TIDEPLANE_PAYLOAD_ENCRYPTION_KEY"]
    box.up()
    assert len(client.CoreV1Api(_kube(sandbox)).list_node().items) == sum(p["count"] for p in TEST_CONFIG["node_pools"])
    assert payload_key_secret(sandbox) == key  # the same key after a restart: the histories stay readable
