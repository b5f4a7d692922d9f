"""The sandbox's webhook receiver: where the worker's notifications go (TIDEPLANE_NOTIFY_WEBHOOK_URL),
standing in for a Slack incoming webhook or a team's own endpoint.

It keeps every JSON body POSTed to it, in arrival order, and serves them at ``GET /messages`` (a JSON
list), so the demo prints what it was told and tests check it. A body that is not JSON is refused
with 400, as Slack refuses a malformed payload.

Run: ``python -m infra.sandbox.webhook_receiver --port PORT``.
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler

from infra.sandbox.httpserver import SandboxHTTPServer

MESSAGES_PATH = "/messages"


class Received:
    """The bodies received so far (the server's handler threads append, GET reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list = []

    def add(self, message) -> None:
        with self._lock:
            self._messages.append(message)

    def all(self) -> list:
        with self._lock:
            return list(self._messages)


def make_server(host: str, port: int) -> SandboxHTTPServer:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                message = json.loads(raw)
            except ValueError:
                self._answer(400, {"error": "the body is not JSON"})
                return
            received.add(message)
            self._answer(200, {"ok": True})

        def do_GET(self) -> None:
            if self.path.split("?")[0] != MESSAGES_PATH:
                self._answer(404, {"error": f"GET {MESSAGES_PATH} lists what was received"})
                return
            self._answer(200, received.all())

        def log_message(self, *args) -> None:
            pass

    return SandboxHTTPServer((host, port), Handler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    make_server(args.host, args.port).serve_forever()


if __name__ == "__main__":
    main()
