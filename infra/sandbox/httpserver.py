"""The sandbox's HTTP servers (API emulator, fleet simulator, S3 fault proxy): threaded, with a
listen backlog like a real server's (uvicorn, which vLLM runs, listens with 2048).

socketserver's default backlog is 5: a burst of connections at once (the batching sweep opens 24)
on a busy machine overflowed it (TcpExtListenOverflows) and clients got "connection reset by peer".
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer


class SandboxHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
