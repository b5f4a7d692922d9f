"""`tideplane codec-server` (workers/codec_server.py): the temporal CLI and the web UI read and
write encrypted payloads through it, over HTTP, as Temporal's codec protocol defines."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.api.common.v1 import Payload
from temporalio.testing import WorkflowEnvironment

from infra.sandbox.ports import free_port, wait_for_port
from workers.client import connect
from workers.codec import AesGcmCodec, generate_key
from workers.config import Settings

BIN = Path(sys.executable).parent
KEY = generate_key()
UI = "http://localhost:8233"


@contextlib.contextmanager
def running_codec_server(env: dict[str, str], *flags: str):
    """``tideplane codec-server`` as a process with ``env`` added; its URL while it runs."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "codec-server", "--port", str(port), *flags],
        env={**os.environ, "TIDEPLANE_PAYLOAD_ENCRYPTION_KEY": KEY, **env}, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def codec_url():
    with running_codec_server({}) as url:
        yield url


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_encode_then_decode_round_trips_and_only_the_key_reads_it(codec_url):
    plain = {"payloads": [{"metadata": {"encoding": b64(b"json/plain")}, "data": b64(b'{"HF_TOKEN": "x"}')}]}
    encoded = httpx.post(f"{codec_url}/encode", json=plain, timeout=10)
    assert encoded.status_code == 200, encoded.text
    (sealed,) = encoded.json()["payloads"]
    assert base64.b64decode(sealed["metadata"]["encoding"]) == b"binary/encrypted"
    assert b"HF_TOKEN" not in base64.b64decode(sealed["data"])
    # the CLI's endpoint may carry the namespace as a path prefix
    decoded = httpx.post(f"{codec_url}/default/decode", json=encoded.json(), headers={"X-Namespace": "default"}, timeout=10)
    assert decoded.status_code == 200 and decoded.json() == plain


def test_a_payload_under_another_key_is_refused_by_name(codec_url):
    (foreign,) = asyncio.run(AesGcmCodec(base64.b64decode(generate_key())).encode([Payload(data=b"x")]))
    body = {"payloads": [{"metadata": {k: b64(v) for k, v in foreign.metadata.items()}, "data": b64(foreign.data)}]}
    answer = httpx.post(f"{codec_url}/decode", json=body, timeout=10)
    assert answer.status_code == 400 and "unknown key id" in answer.json()["message"]


def test_cors_only_for_the_allowed_ui_origin(codec_url):
    preflight = httpx.options(f"{codec_url}/decode", headers={"Origin": UI, "Access-Control-Request-Method": "POST"}, timeout=10)
    assert preflight.headers["Access-Control-Allow-Origin"] == UI
    assert "x-namespace" in preflight.headers["Access-Control-Allow-Headers"].lower()
    other = httpx.options(f"{codec_url}/decode", headers={"Origin": "http://evil.example"}, timeout=10)
    assert "Access-Control-Allow-Origin" not in other.headers


async def test_temporal_cli_shows_encrypted_history_in_clear_through_it(codec_url):
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(BIN / "temporal"), port=free_port())
    try:
        address = env.client.service_client.config.target_host
        client = await connect(Settings(_env_file=None, temporal_address=address, payload_encryption_key=KEY, temporal_api_key=None))
        workflow_id = f"codec-{uuid.uuid4().hex[:8]}"
        await client.start_workflow("ModelRollout", {"marker": "visible-through-codec"}, id=workflow_id, task_queue="no-worker")

        def show(*extra: str) -> str:
            done = subprocess.run(
                [str(BIN / "temporal"), "workflow", "show", "-w", workflow_id, "--address", address, "--output", "json", *extra],
                capture_output=True, text=True, timeout=60,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        def start_input(*extra: str) -> dict:
            started = json.loads(show(*extra))["events"][0]
            (payload,) = started["workflowExecutionStartedEventAttributes"]["input"]["payloads"]
            return payload

        sealed = start_input()
        assert base64.b64decode(sealed["metadata"]["encoding"]) == b"binary/encrypted"
        clear = start_input("--codec-endpoint", codec_url)
        assert base64.b64decode(clear["metadata"]["encoding"]) == b"json/plain"
        assert json.loads(base64.b64decode(clear["data"])) == {"marker": "visible-through-codec"}

        # and `temporal workflow start --codec-endpoint` stores its input encrypted, as the worker reads it
        workflow_id = f"codec-{uuid.uuid4().hex[:8]}"
        started = subprocess.run(
            [str(BIN / "temporal"), "workflow", "start", "--type", "ModelRollout", "--task-queue", "no-worker", "-w", workflow_id,
             "--input", '{"env": {"HF_TOKEN": "started-by-the-cli"}}', "--address", address, "--codec-endpoint", codec_url],
            capture_output=True, text=True, timeout=60,
        )
        assert started.returncode == 0, started.stderr
        assert base64.b64decode(start_input()["metadata"]["encoding"]) == b"binary/encrypted"
        assert "started-by-the-cli" not in show()
        handle_input = await client.get_workflow_handle(workflow_id).fetch_history()
        (payload,) = handle_input.events[0].workflow_execution_started_event_attributes.input.payloads
        assert (await client.data_converter.decode([payload]))[0] == {"env": {"HF_TOKEN": "started-by-the-cli"}}
    finally:
        await env.shutdown()


def test_without_a_key_it_refuses_to_start_naming_the_setting():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEPLANE_PAYLOAD")}
    done = subprocess.run([sys.executable, "-m", "workers.cli", "codec-server", "--port", str(free_port())],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "tideplane: error: TIDEPLANE_PAYLOAD_ENCRYPTION_KEY is not set: payloads are in clear, there is nothing to encode or decode")


TOKEN = "codec-token-for-the-test"


@pytest.fixture(scope="module")
def guarded_codec_url():
    with running_codec_server({"TIDEPLANE_CODEC_SERVER_TOKEN": TOKEN}) as url:
        yield url


def test_with_a_token_only_a_caller_presenting_it_can_decode(guarded_codec_url):
    """Anyone who reaches a codec server can decrypt: with TIDEPLANE_CODEC_SERVER_TOKEN set it asks
    for ``Authorization: Bearer <token>`` (temporal --codec-auth, the web UI's access token)."""
    plain = {"payloads": [{"metadata": {"encoding": b64(b"json/plain")}, "data": b64(b'{"x": 1}')}]}
    good = {"Authorization": f"Bearer {TOKEN}"}
    sealed = httpx.post(f"{guarded_codec_url}/encode", json=plain, headers=good, timeout=10)
    assert sealed.status_code == 200, sealed.text
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        refused = httpx.post(f"{guarded_codec_url}/decode", json=sealed.json(), headers=headers, timeout=10)
        assert refused.status_code == 401 and "Bearer" in refused.json()["message"]
        assert refused.headers["WWW-Authenticate"] == "Bearer"
    assert httpx.post(f"{guarded_codec_url}/decode", json=sealed.json(), headers=good, timeout=10).json() == plain
    preflight = httpx.options(f"{guarded_codec_url}/decode", headers={"Origin": UI}, timeout=10)
    assert preflight.status_code == 200  # a browser's preflight carries no credentials


def test_a_codec_server_off_loopback_without_a_token_is_refused():
    from workers.codec_server import serve
    from workers.config import SettingsError

    config = Settings.model_validate({"TIDEPLANE_PAYLOAD_ENCRYPTION_KEY": KEY})
    with pytest.raises(SettingsError, match="TIDEPLANE_CODEC_SERVER_TOKEN"):
        serve(config, "0.0.0.0", 0, [UI])


def test_ui_without_token_lets_only_the_allowed_ui_origin_through():
    """The sandbox's web UI has no login, so no token to pass: with --ui-without-token a request from
    an allowed UI origin decodes without one, while the CLI (no Origin) and other origins still need it."""
    plain = {"payloads": [{"metadata": {"encoding": b64(b"json/plain")}, "data": b64(b'{"x": 1}')}]}
    with running_codec_server({"TIDEPLANE_CODEC_SERVER_TOKEN": TOKEN}, "--allow-origin", UI, "--ui-without-token") as url:
        sealed = httpx.post(f"{url}/encode", json=plain, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
        from_ui = httpx.post(f"{url}/decode", json=sealed, headers={"Origin": UI}, timeout=10)
        assert from_ui.status_code == 200 and from_ui.json() == plain
        assert from_ui.headers["Access-Control-Allow-Origin"] == UI
        for headers in ({}, {"Origin": "http://evil.example"}):
            assert httpx.post(f"{url}/decode", json=sealed, headers=headers, timeout=10).status_code == 401


def test_ui_without_token_is_refused_off_loopback():
    from workers.codec_server import serve
    from workers.config import SettingsError

    config = Settings.model_validate({"TIDEPLANE_PAYLOAD_ENCRYPTION_KEY": KEY, "TIDEPLANE_CODEC_SERVER_TOKEN": TOKEN})
    with pytest.raises(SettingsError, match="--ui-without-token"):
        serve(config, "0.0.0.0", 0, [UI], ui_without_token=True)
