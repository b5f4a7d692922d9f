"""Real servers tests start on free loopback ports: moto (S3, SQS, EC2, Auto Scaling),
Temporal's time-skipping test server and an engine's Prometheus exposition. Each tier's conftest registers the fixtures it uses."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.testing import WorkflowEnvironment

from infra.sandbox.ports import free_port, wait_for_port

BIN = Path(sys.executable).parent  # the venv's bin: temporal, temporal-test-server, moto_server

_MOTO: list[str] = []  # the session's moto URL once a test asked for it


@pytest.fixture(scope="session")
def moto_url():
    """A moto server spoken to over HTTP by boto3, with this process's AWS_* environment pointing
    at it. Registered by several tiers' conftests: a session running them shares the first one."""
    if _MOTO:
        yield _MOTO[0]
        return
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        url = f"http://127.0.0.1:{port}"
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": url,
        }
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        _MOTO.append(url)
        yield url
        _MOTO.remove(url)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    finally:
        proc.terminate()
        proc.wait(10)


@asynccontextmanager
async def time_skipping(runtime: Runtime | None = None) -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server with tideplane's search attributes registered;
    ``runtime``: e.g. one whose metrics go to a MetricBuffer the test reads."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(BIN / "temporal-test-server"),
        data_converter=pydantic_data_converter,
        runtime=runtime,
    )
    from workers.cli.setup import register_search_attributes

    await register_search_attributes(env.client, env.client.namespace)
    try:
        yield env
    finally:
        await env.shutdown()


def serve_exposition(text: str, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An engine's ``/metrics``: ``text`` as Prometheus' text format on ``host:port`` (a free port
    by default), served from a daemon thread until ``shutdown()``."""
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((host, port), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
