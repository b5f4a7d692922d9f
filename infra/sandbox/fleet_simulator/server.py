"""The fleet simulator's HTTP server and process: ``/metrics`` (DCGM, kube-state-metrics), the
gateway's ``/gateway/metrics``, the OpenAI-compatible proxy to a Service's pods, the gateway through
an HTTPRoute, one pod's own endpoints (its LoRA adapters), and the tick loop that reads the cluster
and advances the simulation."""

from __future__ import annotations

import argparse
import json
import logging
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler

from infra.fleetmodel.replica import Request
from infra.sandbox.answers import answer
from infra.sandbox.fleet_simulator.cluster import read_cluster, report_policy_status
from infra.sandbox.fleet_simulator.simulator import PROXY_TIMEOUT_S, FleetSimulator, PodInfo
from infra.sandbox.gateway import GATEWAY_METRICS_PATH, MODEL_HEADER
from infra.sandbox.fleet_simulator.pod_listeners import PodListeners, pod_address
from infra.sandbox.httpserver import SandboxHTTPServer
from infra.sandbox.kubeclient import api_client
from infra.sandbox.lora import LoraAdapters, error as lora_error
from infra.sandbox.oom import OomWatch

log = logging.getLogger("tideplane.fleet")
EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text format


_PROXY = re.compile(r"^/proxy/([a-z0-9-]+)/([a-z0-9-]+)(/.*)$")
_GATEWAY = re.compile(r"^/gateway/([a-z0-9-]+)/([a-z0-9-]+)/v1/completions$")  # through an HTTPRoute, as clients call
_GATEWAY_ANY = re.compile(r"^/gateway/([a-z0-9-]+)/([a-z0-9-]+)(/[^?]*)")  # any other path: as the route's matches say
_NO_RULE = "no HTTPRoute {}/{} rule takes this request"
_POD = re.compile(r"^/pods/([a-z0-9-]+)/([a-z0-9.-]+)(/.*)$")  # one pod, as http://<pod IP>:8000 reaches it
_LORA_ROUTES = {"/v1/load_lora_adapter": LoraAdapters.load, "/v1/unload_lora_adapter": LoraAdapters.unload}


def completion_body(info: PodInfo, request: Request, max_tokens: int) -> dict:
    """An OpenAI text_completion response as vLLM returns it."""
    words = ("the", "tide", "rises", "and", "falls", "over", "the", "plane")
    text = " ".join(words[i % len(words)] for i in range(request.output_tokens))
    prompt_tokens = request.prompt_tokens
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": info.model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": "length" if request.output_tokens >= max_tokens else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": request.output_tokens, "total_tokens": prompt_tokens + request.output_tokens},
    }


def make_handler(fleet: FleetSimulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args) -> None:  # access logs would flood the log file
            log.debug(fmt, *args)

        def _send(self, status: int, body: bytes, content_type: str = "application/json", headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str) -> None:
            self._send(status, json.dumps({"object": "error", "message": message, "code": status}).encode())

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, fleet.metrics().encode(), EXPOSITION)
            elif self.path == GATEWAY_METRICS_PATH:
                self._send(200, fleet.gateway_metrics().encode(), EXPOSITION)
            elif self.path.startswith("/mirror/"):
                try:
                    pairs = fleet.mirrors.read(self.path)
                except ValueError as exc:
                    pairs = None
                    self._error(400, f"bad mirror query: {exc}")
                    return
                if pairs is None:
                    self._error(404, f"no route {self.path}: use /mirror/<namespace>/<route>")
                else:
                    self._send(200, json.dumps(pairs).encode())
            elif pod := _POD.match(self.path):
                self._pod_request(*pod.groups(), None)
            elif self.path in ("/healthz", "/"):
                self._send(200, b'{"status": "ok"}')
            elif match := _PROXY.match(self.path):
                namespace, service, rest = match.groups()
                target = fleet.route(namespace, service)
                if target is None:
                    self._error(503, f"no Ready pod behind service {namespace}/{service}")
                elif rest == "/health":
                    self._send(200, b"")
                elif rest == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": target[1].lora.model_cards(target[0].model)}).encode())
                else:
                    self._error(404, f"no route {rest}")
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if pod := _POD.match(self.path):
                self._pod_request(*pod.groups(), body)
                return
            match = _PROXY.match(self.path)
            gateway = _GATEWAY.match(self.path)
            if not gateway and (other := _GATEWAY_ANY.match(self.path)):
                self._gateway_other(*other.groups(), body)
                return
            if not gateway and (not match or match.group(3) != "/v1/completions"):
                self._error(404, f"no route {self.path}")
                return
            try:
                request = json.loads(body or b"{}")
                prompt = request.get("prompt", "")
                max_tokens = int(request.get("max_tokens", 16))
            except (ValueError, TypeError, AttributeError) as exc:
                self._error(400, f"bad request body: {exc}")
                return
            model = request.get("model") if isinstance(request.get("model"), str) else None
            caller = dict(self.headers.items())
            if gateway:
                caller = fleet.gateway_authenticate(*gateway.groups(), caller)  # the tenant from the API key, first
                if isinstance(caller, tuple):
                    self._error(*caller)
                    return
                admission = fleet.gateway_admit(*gateway.groups(), caller)
                if isinstance(admission, str):
                    self._error(429, admission)
                    return
                retry_after = fleet.refuse_when_queue_full(*gateway.groups())
                if retry_after is not None:
                    message = f"queue full at {'/'.join(gateway.groups())}: retry after {retry_after}s"
                    self._send(429, json.dumps({"object": "error", "message": message, "code": 429}).encode(),
                               headers={"Retry-After": str(retry_after)})
                    return
                headers = {**caller, **({MODEL_HEADER: model} if model else {})}  # body-based routing
                target = fleet.gateway_route(*gateway.groups(), headers)
                model = headers.get(MODEL_HEADER, model)  # the endpoint picker writes it back into the body
                if isinstance(target, str):
                    self._error(503, target)
                    return
            else:
                namespace, service, _ = match.groups()
                target = fleet.route(namespace, service)
                if target is None:
                    self._error(503, f"no Ready pod behind service {namespace}/{service}")
                    return
            info, replica = target
            if not replica.lora.serves(model, info.model):
                self._send(404, json.dumps(lora_error(404, f"The model `{model}` does not exist.", "NotFoundError")[1]).encode())
                return
            with fleet.lock:
                submitted = replica.submit(max(1, len(str(prompt)) // 4), max_tokens)
            outcome = fleet.wait_for(info, submitted)
            if outcome == "done" and model in replica.lora.loaded:
                submitted.failed = submitted.failed or fleet.adapter_fails(model)
            if gateway and outcome == "done":
                requested = json.loads(body or b"{}").get("model") or info.model
                latency = (submitted.finished_s - submitted.arrival_s) if submitted.finished_s is not None else None
                fleet.model_requests.record((*gateway.groups(), str(requested), model or info.model), submitted.failed, latency)
            if gateway and outcome != "done":  # the upstream reset or timed out: the gateway's 5xx, no pod's
                fleet.upstream.answered((gateway.group(1), gateway.group(2), info.version), failed=1)
            if outcome is None:
                self._error(503, f"pod {info.name} went away before answering")
            elif outcome == "timeout":
                self._error(504, f"pod {info.name} did not answer within {PROXY_TIMEOUT_S:g}s")
            elif submitted.failed:
                self._error(500, f"simulated failure of {info.model}@{info.version} in pod {info.name}")
            else:
                body = completion_body(info, submitted, max_tokens)
                body["model"] = model or info.model
                body["choices"][0]["text"] = answer(str(prompt), info.version, replica.profile)  # infra/sandbox/answers.py
                if gateway:
                    fleet.gateway_answered(admission, *gateway.groups(), info, caller, body["usage"])
                self._send(200, json.dumps(body).encode(), headers={"x-tideplane-pod": f"{info.namespace}/{info.name}"})

        def _gateway_other(self, namespace: str, route: str, path: str, body: bytes) -> None:
            """A POST through the gateway to a path other than completions: 404 unless a rule of the
            route takes it; then the engine answers, as vLLM would (its LoRA admin endpoints too)."""
            caller = fleet.gateway_authenticate(namespace, route, dict(self.headers.items()))
            if isinstance(caller, tuple):
                self._error(*caller)
                return
            target = fleet.gateway_route(namespace, route, caller, path)
            if isinstance(target, str):
                self._error(404 if target.startswith(_NO_RULE.format(namespace, route)) else 503, target)
                return
            info, _ = target
            self._pod_request(info.namespace, info.name, path, body)

        def _pod_request(self, namespace: str, name: str, rest: str, body: bytes | None) -> None:
            """``/pods/<namespace>/<pod>``: ``GET /metrics`` (the pod's own exposition, vLLM's labels only),
            ``GET /v1/models``, ``POST /v1/{load,unload}_lora_adapter``."""
            if body is None and rest == "/metrics":
                text = fleet.pod_metrics(namespace, name)
                if text is None:
                    self._error(503, f"no simulated replica for pod {namespace}/{name}")
                else:
                    self._send(200, text.encode(), EXPOSITION)
                return
            target = fleet.pod(namespace, name)
            call = _LORA_ROUTES.get(rest) if body is not None else None
            if target is None:
                self._error(503, f"no simulated replica for pod {namespace}/{name}")
            elif body is None and rest == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": target[1].lora.model_cards(target[0].model)}).encode())
            elif call is None or not target[1].lora.runtime_updating:
                self._error(404, f"no route {rest}")  # vLLM adds the LoRA routes only with runtime updating
            else:
                try:
                    request = json.loads(body or b"{}")
                except ValueError as exc:
                    self._error(400, f"bad request body: {exc}")
                    return
                with fleet.lock:
                    status, answer_body = call(target[1].lora, request if isinstance(request, dict) else {})
                if isinstance(answer_body, str):
                    self._send(status, answer_body.encode(), "text/plain; charset=utf-8")
                else:
                    self._send(status, json.dumps(answer_body).encode())

    return Handler


def run(kube_url: str, host: str, port: int, time_scale: float, tick_seconds: float = 0.5) -> None:
    """Serve until killed; the tick loop keeps going through API errors (the emulator may restart)."""
    fleet = FleetSimulator(time_scale)
    server = SandboxHTTPServer((host, port), make_handler(fleet))
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    pods = PodListeners(lambda: make_handler(fleet))  # each pod on its own (loopback) IP, when it has one
    log.info("fleet simulator on http://%s:%d reading %s (time scale %s)", host, port, kube_url, time_scale)
    api = api_client(kube_url)
    oom = OomWatch(kube_url)
    last = time.monotonic()
    while True:
        try:
            cluster = read_cluster(api)
        except Exception as exc:  # noqa: BLE001 - a flaky read must not stop the fleet
            log.warning("reading the cluster failed: %s", exc)
            cluster = None
        now = time.monotonic()
        if cluster is not None:
            fleet.update(cluster, now - last)
            pods.sync({key: address for pod in cluster.pods
                       if (key := (pod["metadata"].get("namespace", ""), pod["metadata"]["name"])) in fleet.replicas
                       and (address := pod_address(pod)) is not None})
            oom.check(fleet)
            report_policy_status(api, cluster)
        last = now
        time.sleep(max(0.0, tick_seconds - (time.monotonic() - now)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infra.sandbox.fleet_simulator", description=__doc__.splitlines()[0])
    parser.add_argument("--kube-url", required=True, help="the Kubernetes API emulator, e.g. http://127.0.0.1:16443")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--time-scale", type=float, default=1.0, help="sandbox seconds per real second")
    parser.add_argument("--tick", type=float, default=0.5, help="real seconds between simulation steps")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(args.kube_url, args.host, args.port, args.time_scale, args.tick)
