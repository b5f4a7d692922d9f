"""workers.client.connect against a real Temporal dev server: plain, through mTLS, with the payload codec.

The dev server speaks no TLS, so the mTLS tests put a TLS-terminating proxy (client certificate
required, certificates made here with ``cryptography``) in front of it: the SDK's real handshake
decides. The codec test reads the raw history with a client that has no codec.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import ssl
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    import pytest
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    from temporalio.api.common.v1 import Payload
    from temporalio.client import Client
    from temporalio.service import TLSConfig
    from temporalio.testing import WorkflowEnvironment

    from infra.sandbox.ports import free_port
    from tests.servers import BIN
    from workers.client import connect, tls_config
    from workers.codec import ENCODING, KEY_ID, AesGcmCodec, PayloadDecryptionError, generate_key, key_id
    from workers.config import Settings, SettingsError, load_settings

SERVER_NAME = "temporal.tideplane.test"


class Secret(BaseModel):
    text: str


@activity.defn(name="client_test_shout")
async def shout(req: Secret) -> Secret:
    return Secret(text=req.text.upper())


@workflow.defn(name="ClientTestEcho")
class Echo:
    @workflow.run
    async def run(self, req: Secret) -> Secret:
        return await workflow.execute_activity(shout, req, start_to_close_timeout=timedelta(seconds=10))


def make_settings(**values) -> Settings:
    """Settings from explicit values only (the caller's environment must not leak in); no payload
    key by the explicit opt-out unless a test passes one."""
    return Settings(_env_file=None, **{"temporal_api_key": None, "payload_encryption_key": None,
                                       "payload_encryption": "off", **values})


@pytest.fixture(scope="module")
async def dev_server():
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(BIN / "temporal"), port=free_port())
    try:
        yield env.client.service_client.config.target_host
    finally:
        await env.shutdown()


async def run_echo(client: Client, text: str) -> tuple[Secret, str]:
    """Run Echo on a fresh task queue; the result and the workflow id."""
    queue, wf_id = f"client-test-{uuid.uuid4().hex[:8]}", f"echo-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[Echo], activities=[shout]):
        result = await client.execute_workflow(Echo.run, Secret(text=text), id=wf_id, task_queue=queue)
    return result, wf_id


def history_bytes(history) -> bytes:
    """Every event as the server stores it (proto JSON would hide plaintext in base64)."""
    return b"".join(event.SerializeToString() for event in history.events)


# --- settings and TLS configuration --------------------------------------------------------------


def test_cert_without_key_names_both(monkeypatch, tmp_path):
    cert = tmp_path / "client.pem"
    cert.write_text("cert")
    monkeypatch.setenv("TIDEPLANE_TEMPORAL_TLS_CERT_PATH", str(cert))
    with pytest.raises(SettingsError, match="TIDEPLANE_TEMPORAL_TLS_CERT_PATH and TIDEPLANE_TEMPORAL_TLS_KEY_PATH"):
        load_settings()
    monkeypatch.delenv("TIDEPLANE_TEMPORAL_TLS_CERT_PATH")
    monkeypatch.setenv("TIDEPLANE_TEMPORAL_TLS_KEY_PATH", str(cert))
    with pytest.raises(SettingsError, match="TIDEPLANE_TEMPORAL_TLS_CERT_PATH and TIDEPLANE_TEMPORAL_TLS_KEY_PATH"):
        load_settings()


@pytest.mark.parametrize("var", ["TIDEPLANE_TEMPORAL_TLS_CA_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_PATH"])
def test_unreadable_file_is_named(monkeypatch, tmp_path, var):
    monkeypatch.setenv(var, str(tmp_path / "missing.pem"))
    with pytest.raises(SettingsError, match=r"TIDEPLANE_TEMPORAL_TLS_CA_PATH: .*cannot read .*missing\.pem"):
        load_settings()


@pytest.mark.parametrize(
    "value,problem",
    [("not base64!", "not valid base64"), (base64.b64encode(b"short").decode(), "decodes to 5"),
     (f"{generate_key()},{generate_key()}", "one key only")],
    ids=["not-base64", "too-short", "two-keys"],  # the same ids in every xdist worker (the keys are random)
)
def test_bad_payload_key_is_named_not_shown(monkeypatch, value, problem):
    monkeypatch.setenv("TIDEPLANE_PAYLOAD_ENCRYPTION_KEY", value)
    with pytest.raises(SettingsError, match=f"TIDEPLANE_PAYLOAD_ENCRYPTION_KEY: .*{problem}") as err:
        load_settings()
    assert value not in str(err.value)


@pytest.mark.parametrize("command", [["worker"], ["rollout", "status", "llm-serving/chat"]], ids=["worker", "cli"])
def test_a_process_without_a_payload_key_refuses_to_start(command):
    """The codec is on by default: without a key and without TIDEPLANE_PAYLOAD_ENCRYPTION=off the
    worker and the CLI exit 2 before talking to Temporal, saying what to set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEPLANE_PAYLOAD_", "TIDEPLANE_TEMPORAL_", "TEMPORAL_"))}
    env.update({"TIDEPLANE_TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}", "TIDEPLANE_METRICS_PORT": "0"})
    done = subprocess.run([sys.executable, "-m", "workers.cli", *command], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "TIDEPLANE_PAYLOAD_ENCRYPTION_KEY is not set" in done.stderr
    assert "generate_key()" in done.stderr and "TIDEPLANE_PAYLOAD_ENCRYPTION=off" in done.stderr


def test_tls_config_reads_files_and_sets_fields(tmp_path):
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_bytes(f"{name}-bytes".encode())
    tls = tls_config(make_settings(
        temporal_tls_ca_path=tmp_path / "ca.pem", temporal_tls_cert_path=tmp_path / "cert.pem",
        temporal_tls_key_path=tmp_path / "key.pem", temporal_tls_server_name=SERVER_NAME,
    ))
    assert tls == TLSConfig(server_root_ca_cert=b"ca-bytes", domain=SERVER_NAME,
                            client_cert=b"cert-bytes", client_private_key=b"key-bytes")


def test_tls_switch():
    assert tls_config(make_settings()) is False
    assert tls_config(make_settings(temporal_tls=True)) is True
    # Temporal Cloud with an API key: TLS with the system roots; the key is a secret in repr and logs.
    cloud = make_settings(temporal_api_key="sk-cloud-key", temporal_address="tp.a1b2c.tmprl.cloud:7233")
    assert tls_config(cloud) is True
    assert "sk-cloud-key" not in repr(cloud)


def test_cli_variables_configure_tls(monkeypatch, tmp_path):
    """The temporal CLI's own variables work too, so one environment configures both."""
    (tmp_path / "c.pem").write_bytes(b"c")
    (tmp_path / "k.pem").write_bytes(b"k")
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_CERT_PATH", str(tmp_path / "c.pem"))
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_KEY_PATH", str(tmp_path / "k.pem"))
    monkeypatch.setenv("TEMPORAL_API_KEY", "abc")
    s = load_settings()
    tls = tls_config(s)
    assert (tls.client_cert, tls.client_private_key) == (b"c", b"k")
    assert s.temporal_api_key.get_secret_value() == "abc"


# --- the codec, without a server -------------------------------------------------------------------


async def test_codec_round_trip_and_refuses_tampering():
    key, old = base64.b64decode(generate_key()), base64.b64decode(generate_key())
    codec = AesGcmCodec(key, [old])
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"text":"hello"}')
    (sealed,) = await codec.encode([plain])
    assert sealed.metadata["encoding"] == ENCODING and sealed.metadata[KEY_ID] == key_id(key).encode()
    assert b"hello" not in sealed.data
    assert await codec.decode([sealed]) == [plain]

    flipped = Payload(metadata=sealed.metadata, data=sealed.data[:-1] + bytes([sealed.data[-1] ^ 1]))
    with pytest.raises(PayloadDecryptionError, match="failed authentication"):
        await codec.decode([flipped])
    relabelled = Payload(metadata={**sealed.metadata, KEY_ID: key_id(old).encode()}, data=sealed.data)
    with pytest.raises(PayloadDecryptionError, match="failed authentication"):
        await codec.decode([relabelled])
    with pytest.raises(PayloadDecryptionError, match="unknown key id"):
        await AesGcmCodec(old).decode([sealed])
    # payloads from before encryption was turned on still decode; a retired key still decrypts
    assert await codec.decode([plain]) == [plain]
    (by_old,) = await AesGcmCodec(old).encode([plain])
    assert await codec.decode([by_old]) == [plain]


# --- against the dev server ------------------------------------------------------------------------


async def test_plain_connect_runs_a_workflow_in_clear(dev_server):
    client = await connect(make_settings(temporal_address=dev_server))
    marker = f"plaintext-marker-{uuid.uuid4().hex}"
    result, wf_id = await run_echo(client, marker)
    assert result == Secret(text=marker.upper())
    # without the codec the history holds the input in clear: the ciphertext test below can fail
    history = await client.get_workflow_handle(wf_id).fetch_history()
    assert marker.encode() in history_bytes(history)


async def test_codec_history_holds_only_ciphertext(dev_server):
    key = generate_key()
    client = await connect(make_settings(temporal_address=dev_server, payload_encryption_key=key))
    marker = f"plaintext-marker-{uuid.uuid4().hex}"
    result, wf_id = await run_echo(client, marker)
    assert result == Secret(text=marker.upper())

    raw = await Client.connect(dev_server)  # no codec: what the server (and its database) holds
    history = await raw.get_workflow_handle(wf_id).fetch_history()
    raw_bytes = history_bytes(history)
    assert marker.encode() not in raw_bytes and marker.upper().encode() not in raw_bytes
    payloads = []
    for event in history.events:
        attrs = event.workflow_execution_started_event_attributes
        payloads += attrs.input.payloads
        payloads += event.activity_task_scheduled_event_attributes.input.payloads
        payloads += event.activity_task_completed_event_attributes.result.payloads
        payloads += event.workflow_execution_completed_event_attributes.result.payloads
    assert len(payloads) == 4  # workflow input, activity input and result, workflow result
    assert all(p.metadata["encoding"] == ENCODING for p in payloads)
    assert all(p.metadata[KEY_ID] == key_id(base64.b64decode(key)).encode() for p in payloads)
    assert all(marker.encode() not in p.data and marker.upper().encode() not in p.data for p in payloads)


# --- mTLS through a TLS-terminating proxy ----------------------------------------------------------


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool, san: str | None = None):
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """ca.pem, server.pem/server.key (for SERVER_NAME), client.pem/client.key, all signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("tideplane test CA", ca_key, None, None, ca=True)
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))
    for name, san in (("server", SERVER_NAME), ("client", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(f"tideplane {name}", key, ca.subject, ca_key, ca=False, san=san)
        (d / f"{name}.pem").write_bytes(cert.public_bytes(pem))
        (d / f"{name}.key").write_bytes(
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
    return d


@pytest.fixture(scope="module")
async def mtls_proxy(dev_server, pki):
    """host:port of a TLS endpoint that requires a client certificate and forwards to the dev server."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=pki / "ca.pem")
    ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])
    upstream_host, upstream_port = dev_server.rsplit(":", 1)

    async def pipe(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(reader, writer):
        up_reader, up_writer = await asyncio.open_connection(upstream_host, int(upstream_port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=ctx)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.close()


async def test_mtls_handshake(mtls_proxy, pki):
    tls = {"temporal_tls_ca_path": pki / "ca.pem", "temporal_tls_server_name": SERVER_NAME}
    client = await connect(make_settings(
        temporal_address=mtls_proxy, temporal_tls_cert_path=pki / "client.pem",
        temporal_tls_key_path=pki / "client.key", **tls,
    ))
    marker = f"over-mtls-{uuid.uuid4().hex}"
    result, _ = await run_echo(client, marker)
    assert result == Secret(text=marker.upper())


@pytest.mark.parametrize("case", ["no client certificate", "wrong server name", "plaintext"])
async def test_mtls_refusals(mtls_proxy, pki, case):
    values = {
        "temporal_address": mtls_proxy, "temporal_tls_ca_path": pki / "ca.pem", "temporal_tls_server_name": SERVER_NAME,
        "temporal_tls_cert_path": pki / "client.pem", "temporal_tls_key_path": pki / "client.key",
    }
    if case == "no client certificate":
        del values["temporal_tls_cert_path"], values["temporal_tls_key_path"]
    elif case == "wrong server name":
        values["temporal_tls_server_name"] = "other.tideplane.test"
    else:
        values = {"temporal_address": mtls_proxy}
    with pytest.raises(RuntimeError, match="connect"):
        await asyncio.wait_for(connect(make_settings(**values)), 30)  # connecting calls GetSystemInfo
