"""A fault-injecting HTTP proxy in front of the sandbox's S3 (moto has no fault switch).

Point ``AWS_ENDPOINT_URL`` at ``S3Faults(...).url`` and a chosen fraction of requests is answered
500 InternalError, 503 SlowDown, a dropped connection (``reset``), a body cut short after full
headers (``truncate``: the short read a flaky network gives), or delayed; every other request is
forwarded to moto unchanged. Settings change at runtime (``configure``); ``injected`` counts
what was done, so a test can show the faults happened and were survived.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler
from typing import Self
from urllib.parse import urlparse

from infra.sandbox.httpserver import SandboxHTTPServer

KINDS = ("500", "503", "reset", "truncate", "delay")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
_ERRORS = {
    "500": ("InternalError", "We encountered an internal error. Please try again. (injected fault)"),
    "503": ("SlowDown", "Please reduce your request rate. (injected fault)"),
}


class S3Faults:
    """The proxy; ``with S3Faults(upstream) as proxy:`` serves on a free loopback port."""

    def __init__(self, upstream: str, rate: float = 0.0, kinds: tuple[str, ...] = ("500",), delay_seconds: float = 1.0, seed: int | None = None):
        parsed = urlparse(upstream)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.configure(rate=rate, kinds=kinds, delay_seconds=delay_seconds)
        self._server = SandboxHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3faults", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def configure(self, rate: float, kinds: tuple[str, ...] = ("500",), delay_seconds: float = 1.0) -> None:
        if not 0 <= rate <= 1 or not kinds or any(k not in KINDS for k in kinds):
            raise ValueError(f"rate must be in [0, 1] and kinds a non-empty subset of {KINDS}")
        with self._lock:
            self.rate, self.kinds, self.delay_seconds = rate, tuple(kinds), delay_seconds

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _pick(self) -> str | None:
        """The fault for the next request, or None; drawn under a lock so a seed is reproducible."""
        with self._lock:
            self.requests += 1
            if self._random.random() >= self.rate:
                return None
            kind = self._random.choice(self.kinds)
            self.injected[kind] += 1
            return kind

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: the counters say what happened
                pass

            def _forward(self) -> tuple[int, str, list[tuple[str, str]], bytes]:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    resp = upstream.getresponse()
                    data = resp.read()
                    return resp.status, resp.reason, resp.getheaders(), data
                finally:
                    upstream.close()

            def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes, cut: bool = False) -> None:
                self.send_response(status, reason)
                for key, value in headers:
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                    elif key.lower() == "content-length" and self.command == "HEAD":
                        self.send_header(key, value)  # the object's size, not this (empty) body's
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data[: len(data) // 2] if cut else data)
                if cut:
                    self._drop()

            def _drop(self) -> None:
                self.close_connection = True
                try:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def _handle(self) -> None:
                kind = proxy._pick()
                if kind in _ERRORS:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length:
                        self.rfile.read(length)
                    code, message = _ERRORS[kind]
                    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
                    return self._reply(int(kind), code, [("Content-Type", "application/xml")], body.encode())
                if kind == "reset" or (kind == "truncate" and self.command == "HEAD"):
                    return self._drop()
                if kind == "delay":
                    time.sleep(proxy.delay_seconds)
                self._reply(*self._forward(), cut=kind == "truncate")

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        return Handler
