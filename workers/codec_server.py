"""``tideplane codec-server``: the payload codec over HTTP, for the temporal CLI and the web UI.

With ``TIDEPLANE_PAYLOAD_ENCRYPTION_KEY`` set, the worker and the tideplane CLI encrypt every
payload (workers/codec.py); the temporal CLI and the web UI see ciphertext. They call a codec
server instead of holding the key: ``temporal --codec-endpoint http://127.0.0.1:8081 workflow
show ...`` decodes, and ``workflow start --codec-endpoint ...`` encodes an input (a rollout's env
included) before it reaches the Temporal server. The protocol is Temporal's: ``POST /encode`` and
``POST /decode`` with a ``temporal.api.common.v1.Payloads`` message as protobuf JSON
(``{"payloads": [{"metadata": {...}, "data": "..."}]}``), an optional path prefix (e.g.
``/{namespace}``) ignored. Browsers get CORS headers for the allowed UI origins only.

Anyone who reaches this port could decrypt, so with ``TIDEPLANE_CODEC_SERVER_TOKEN`` set every
encode and decode needs ``Authorization: Bearer <token>`` (``temporal --codec-auth "Bearer ..."``, the
web UI's "pass access token" codec setting); 401 otherwise. Without a token it binds loopback only:
another ``--host`` is refused at start. ``--ui-without-token`` (loopback only) lets a request from
an allowed web UI origin through without the token: the dev server's UI (the sandbox's) has no
login, so it has no access token to pass; a browser cannot fake its Origin, and a local process
that could is the user's own, with the key file in reach anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payloads

from workers.codec import AesGcmCodec, PayloadDecryptionError, codec_from_keys
from workers.config import Settings, SettingsError

log = logging.getLogger("tideplane.codec")

LOOPBACK = ("127.0.0.1", "localhost", "::1")
UI_ORIGIN = "http://localhost:8233"  # `temporal server start-dev`'s web UI
MAX_BODY = 8 * 1024 * 1024  # a history page of payloads; Temporal's own payload limit is 2 MiB each


class CodecServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], codec: AesGcmCodec, allowed_origins: list[str], token: str | None = None,
                 ui_without_token: bool = False) -> None:
        super().__init__(address, CodecHandler)
        self.codec = codec
        self.allowed_origins = set(allowed_origins)
        self.token = token
        self.ui_without_token = ui_without_token


class CodecHandler(BaseHTTPRequestHandler):
    server: CodecServer

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def _cors(self) -> None:
        origin = self.headers.get("Origin")
        if origin in self.server.allowed_origins:
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Access-Control-Allow-Credentials", "true")
            self.send_header("Access-Control-Allow-Methods", "POST")
            self.send_header("Access-Control-Allow-Headers", "Content-Type, X-Namespace, Authorization")
            self.send_header("Vary", "Origin")

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self._cors()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_OPTIONS(self) -> None:  # noqa: N802 - stdlib naming
        self.send_response(200)
        self._cors()
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _authorized(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        if self.server.ui_without_token and self.headers.get("Origin") in self.server.allowed_origins:
            return True
        given = self.headers.get("Authorization") or ""
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        if not self._authorized():
            data = json.dumps({"message": "Authorization: Bearer <TIDEPLANE_CODEC_SERVER_TOKEN> required"}).encode()
            self.send_response(401)
            self._cors()
            self.send_header("WWW-Authenticate", "Bearer")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        action = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
        if action not in ("encode", "decode"):
            self._reply(404, {"message": f"no such endpoint {self.path!r}: POST .../encode or .../decode"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, {"message": f"body of {length} bytes exceeds {MAX_BODY}"})
            return
        try:
            payloads = json_format.Parse(self.rfile.read(length) or b"{}", Payloads())
        except (json_format.ParseError, DecodeError, UnicodeDecodeError) as exc:
            self._reply(400, {"message": f"expected Payloads as protobuf JSON: {exc}"})
            return
        codec = self.server.codec
        try:
            done = asyncio.run(codec.encode(payloads.payloads) if action == "encode" else codec.decode(payloads.payloads))
        except PayloadDecryptionError as exc:
            self._reply(400, {"message": str(exc)})
            return
        # one line per call, no payload content: who decodes what shows in the log (the web UI by its origin)
        log.info("%s %d payloads for %s", action, len(done), self.headers.get("Origin") or "a client without Origin")
        self._reply(200, json_format.MessageToDict(Payloads(payloads=done)))


def serve(config: Settings, host: str, port: int, allowed_origins: list[str], ui_without_token: bool = False) -> CodecServer:
    """A codec server for ``config``'s payload keys, bound but not yet serving."""
    key, old = config.payload_encryption_key, config.payload_decryption_keys
    codec = codec_from_keys(key.get_secret_value() if key else None, old.get_secret_value() if old else None)
    if codec is None:
        raise SettingsError("TIDEPLANE_PAYLOAD_ENCRYPTION_KEY is not set: payloads are in clear, there is nothing to encode or decode")
    token = config.codec_server_token.get_secret_value() if config.codec_server_token else None
    if token is None and host not in LOOPBACK:
        raise SettingsError(
            f"--host {host}: anyone who reaches the codec server can decrypt; set TIDEPLANE_CODEC_SERVER_TOKEN"
            " (from a Secret) to require Authorization: Bearer <token>, or bind 127.0.0.1"
        )
    if ui_without_token and host not in LOOPBACK:
        raise SettingsError(f"--host {host}: --ui-without-token is for a web UI on this machine; bind 127.0.0.1")
    return CodecServer((host, port), codec, allowed_origins, token, ui_without_token)


def cmd_codec_server(args: argparse.Namespace, config: Settings) -> int:
    server = serve(config, args.host, args.port, args.allow_origin or [UI_ORIGIN], args.ui_without_token)
    print(f"codec server on http://{args.host}:{server.server_port} (temporal --codec-endpoint; web UI origins: "
          f"{', '.join(sorted(server.allowed_origins))})", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def add_codec_server_command(commands) -> None:
    parser = commands.add_parser("codec-server", help="encode/decode payloads over HTTP for the temporal CLI and web UI")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; another needs TIDEPLANE_CODEC_SERVER_TOKEN: anyone who reaches it can decrypt)")
    parser.add_argument("--port", type=int, default=8081, help="port (default 8081)")
    parser.add_argument("--allow-origin", action="append", metavar="ORIGIN",
                        help=f"a web UI origin allowed by CORS, repeatable (default {UI_ORIGIN})")
    parser.add_argument("--ui-without-token", action="store_true",
                        help="serve requests from an allowed web UI origin without the token (a UI without login, "
                             "e.g. the dev server's; loopback only)")
    parser.set_defaults(func=cmd_codec_server)
