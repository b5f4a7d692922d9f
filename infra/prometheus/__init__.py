"""tideplane's Prometheus rule files, and a throwaway Prometheus server for tests.

The sandbox launcher loads every ``*.yml`` here (``rule_files``); a production Prometheus loads
the same files (or a PrometheusRule wrapping them with the Prometheus Operator).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import yaml
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest

from infra.sandbox.ports import free_port, wait_for_port

RULES_DIR = Path(__file__).parent
RULE_FILES = (RULES_DIR / "recording-rules.yml", RULES_DIR / "alerts.yml")
PROMETHEUS = "/usr/bin/prometheus"


@contextmanager
def serve_registry(registry: CollectorRegistry) -> Iterator[str]:
    """Serve ``registry`` as text format 0.0.4 (vLLM's format: keeps ``vllm:`` names); yields host:port."""

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def prometheus_process(work: Path, config: dict) -> Iterator[str]:
    """The real Prometheus on a free port with ``config`` (prometheus.yml as a mapping, written to
    ``work``); yields its URL once it listens, and stops it after."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(work / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_for_port(port)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def running_prometheus(work: Path, targets: dict[str, str], rule_files=(), interval: str = "1s") -> Iterator[str]:
    """The real Prometheus on a free port scraping ``job -> host:port`` every ``interval``.

    Yields its URL once every target has been scraped once.
    """
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]} for job, target in targets.items()],
    }
    with prometheus_process(work, config) as url:
        # Target discovery is throttled to 5 s: the first scrape comes seconds after /-/ready.
        deadline = time.monotonic() + 30
        while len(_result(url, "up")) < len(targets):
            assert time.monotonic() < deadline, f"Prometheus never scraped every target; see {work / 'prometheus.log'}"
            time.sleep(0.2)
        yield url


def _result(url: str, promql: str) -> list:
    try:
        return httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=2).json()["data"]["result"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []
