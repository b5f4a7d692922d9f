"""One HTTP listener per simulated pod on the pod's own IP and port, as ``http://<podIP>:<port>``
reaches a pod in a cluster (Prometheus' Kubernetes discovery scrapes ``<podIP>:<port>/metrics``).

Only for loopback pod IPs (the emulator's ``--pod-network 127.N``: on Linux every 127.0.0.0/8
address is bindable without setup). Each listener answers what the simulator's
``/pods/<namespace>/<pod>/...`` routes answer for that pod: ``/metrics`` with vLLM's own labels
only, ``/v1/models``, the LoRA routes, and ``/health``.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler

from infra.sandbox.httpserver import SandboxHTTPServer

log = logging.getLogger("tideplane.fleet")

DEFAULT_PORT = 8000


def pod_address(pod: dict) -> tuple[str, int] | None:
    """(podIP, the port named ``http`` or the first container port) when the IP is loopback, else None."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not ipaddress.ip_address(ip).is_loopback:
        return None
    ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
    named = next((p for p in ports if p.get("name") == "http"), ports[0] if ports else None)
    return ip, int(named["containerPort"]) if named else DEFAULT_PORT


class PodListeners:
    """Starts a listener for each pod that gets an address and stops it when the pod goes."""

    def __init__(self, handler: Callable[[], type[BaseHTTPRequestHandler]]) -> None:
        self._handler = handler()  # the simulator's handler class; each listener prefixes its paths
        self._servers: dict[tuple[str, str], tuple[tuple[str, int], SandboxHTTPServer]] = {}

    def sync(self, wanted: Mapping[tuple[str, str], tuple[str, int]]) -> None:
        for key in [k for k, (address, _) in self._servers.items() if wanted.get(k) != address]:
            self._stop(key)
        for key, address in wanted.items():
            if key not in self._servers:
                self._start(key, address)

    def close(self) -> None:
        for key in list(self._servers):
            self._stop(key)

    def _start(self, key: tuple[str, str], address: tuple[str, int]) -> None:
        prefix = f"/pods/{key[0]}/{key[1]}"
        base = self._handler

        class PodHandler(base):  # type: ignore[misc, valid-type]
            def parse_request(self) -> bool:
                ok = super().parse_request()
                if ok:
                    self.path = "/healthz" if self.path == "/health" else prefix + self.path
                return ok

        try:
            server = SandboxHTTPServer(address, PodHandler)
        except OSError as exc:
            log.warning("pod %s/%s: cannot listen on %s:%d: %s", *key, *address, exc)
            return
        threading.Thread(target=server.serve_forever, name=f"pod-{key[1]}", daemon=True).start()
        self._servers[key] = (address, server)

    def _stop(self, key: tuple[str, str]) -> None:
        _, server = self._servers.pop(key)
        server.shutdown()
        server.server_close()
