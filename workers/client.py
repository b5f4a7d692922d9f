"""The one way tideplane processes connect to Temporal (worker, CLI, demo, schedules, benchmarks).

Address, namespace, TLS / mTLS, the Temporal Cloud API key and the payload codec (required unless
turned off explicitly) all come from settings, so a process configured for the sandbox and one
configured for Temporal Cloud differ only in their environment. Every client uses the pydantic
data converter.
"""

from __future__ import annotations

import dataclasses

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from workers.codec import codec_from_keys
from workers.config import Settings, SettingsError


def tls_config(config: Settings) -> TLSConfig | bool:
    """TLS for the connection: off, the system roots (``True``), or a TLSConfig with files read.

    Any TLS file, a server name or an API key turns TLS on, like the temporal CLI does.
    """
    files_or_name = (
        config.temporal_tls_ca_path,
        config.temporal_tls_cert_path,
        config.temporal_tls_key_path,
        config.temporal_tls_server_name,
    )
    if not any(files_or_name):
        return config.temporal_tls or config.temporal_api_key is not None

    def read(path):
        return path.read_bytes() if path else None

    return TLSConfig(
        server_root_ca_cert=read(config.temporal_tls_ca_path),
        domain=config.temporal_tls_server_name,
        client_cert=read(config.temporal_tls_cert_path),
        client_private_key=read(config.temporal_tls_key_path),
    )


MISSING_PAYLOAD_KEY = (
    "TIDEPLANE_PAYLOAD_ENCRYPTION_KEY is not set: tideplane encrypts every payload it sends to Temporal"
    " (rollout inputs, results). Make a key with `python -c 'from workers.codec import generate_key;"
    " print(generate_key())'` and give it to every tideplane process from a Secret (secretKeyRef), or set"
    " TIDEPLANE_PAYLOAD_ENCRYPTION=off to send payloads in clear"
)


def data_converter(config: Settings) -> DataConverter:
    """pydantic payloads, encrypted with the payload key (use it for Replayer and test envs too).

    Without a key it refuses (SettingsError) unless TIDEPLANE_PAYLOAD_ENCRYPTION=off: every process
    that talks to Temporal builds its converter here, so none sends clear payloads by omission.
    """
    key = config.payload_encryption_key
    old = config.payload_decryption_keys
    codec = codec_from_keys(key.get_secret_value() if key else None, old.get_secret_value() if old else None)
    if codec is None and config.payload_encryption == "required":
        raise SettingsError(MISSING_PAYLOAD_KEY)
    return dataclasses.replace(pydantic_data_converter, payload_codec=codec) if codec else pydantic_data_converter


async def connect(config: Settings, runtime: Runtime | None = None, payloads: bool = True) -> Client:
    """A client for ``config``; pass the worker's ``runtime`` so SDK metrics are exported.
    ``payloads=False``: a client that only calls the operator service (it sends no payload, so it
    needs no payload key)."""
    return await Client.connect(
        config.temporal_address,
        namespace=config.temporal_namespace,
        tls=tls_config(config),
        api_key=config.temporal_api_key.get_secret_value() if config.temporal_api_key else None,
        data_converter=data_converter(config) if payloads else pydantic_data_converter,
        runtime=runtime,
    )
