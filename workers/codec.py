"""Optional AES-256-GCM payload codec: workflow inputs, results and memos encrypted at rest in Temporal.

The codec runs in tideplane's own processes (worker, CLI, replayer), so the Temporal server and
anyone reading its database see only ciphertext. Each encrypted payload carries
``encoding: binary/encrypted`` and ``encryption-key-id`` (a hash prefix of the key, never the
key) in its metadata; the key id is also the AEAD's associated data, so a payload cannot be moved
under another key id. Decoding refuses a payload whose ciphertext, nonce or key id was altered.

Payloads without the encrypted encoding pass through decode unchanged: a deployment can turn the
codec on while workflows started without it are still running. Retired keys stay usable for
decoding (``TIDEPLANE_PAYLOAD_DECRYPTION_KEYS``) until no history references them.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
_NONCE_BYTES = 12


class PayloadDecryptionError(ValueError):
    """An encrypted payload that cannot be trusted: unknown key, or failed authentication."""


def key_id(key: bytes) -> str:
    """A stable, non-secret name for a key, stored beside each payload it encrypted."""
    return hashlib.sha256(key).hexdigest()[:16]


def parse_keys(text: str) -> list[bytes]:
    """Comma-separated base64 keys, as in the settings (validated there to be 32 bytes each)."""
    return [base64.b64decode(part.strip()) for part in text.split(",") if part.strip()]


class AesGcmCodec(PayloadCodec):
    """Encrypts with ``key``; decrypts with ``key`` or any of ``old_keys``."""

    def __init__(self, key: bytes, old_keys: Sequence[bytes] = ()) -> None:
        self._active = key_id(key)
        self._ciphers = {key_id(k): AESGCM(k) for k in (*old_keys, key)}

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        cipher = self._ciphers[self._active]
        out = []
        for payload in payloads:
            nonce = os.urandom(_NONCE_BYTES)
            sealed = cipher.encrypt(nonce, payload.SerializeToString(), self._active.encode())
            out.append(Payload(metadata={"encoding": ENCODING, KEY_ID: self._active.encode()}, data=nonce + sealed))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._decode_one(p) for p in payloads]

    def _decode_one(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        kid = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise PayloadDecryptionError(f"payload encrypted with unknown key id {kid!r}: add it to TIDEPLANE_PAYLOAD_DECRYPTION_KEYS")
        nonce, sealed = payload.data[:_NONCE_BYTES], payload.data[_NONCE_BYTES:]
        try:
            plain = cipher.decrypt(nonce, sealed, kid.encode())
        except InvalidTag:
            raise PayloadDecryptionError(f"encrypted payload (key id {kid}) failed authentication: tampered or corrupt") from None
        return Payload.FromString(plain)


def codec_from_keys(key: str | None, old_keys: str | None = None) -> AesGcmCodec | None:
    """The codec for the configured keys, or None when encryption is off."""
    if not key:
        return None
    return AesGcmCodec(parse_keys(key)[0], parse_keys(old_keys or ""))


def generate_key() -> str:
    """A fresh base64 key for ``TIDEPLANE_PAYLOAD_ENCRYPTION_KEY``."""
    return base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()
