"""Out-of-memory kills for the fleet simulator: a profile's ``oom_after_requests``.

Only the fleet knows how many requests a replica has served; the kubelet (in the API emulator)
owns the container. When a replica has served its profile's ``oom_after_requests`` since its
container last started, this reports it to the emulator (``POST /sandbox/oom``), whose kubelet
kills the container as the kernel's OOM killer would: OOMKilled, restarted with back-off.
"""

from __future__ import annotations

import json
import logging
import urllib.request

log = logging.getLogger(__name__)


class OomWatch:
    def __init__(self, kube_url: str):
        self.url = kube_url.rstrip("/") + "/sandbox/oom"
        self.since: dict[tuple[str, str], tuple[int, int]] = {}  # pod -> (restarts, served) at container start

    def check(self, fleet) -> None:
        """After a fleet tick: report each replica past its limit once per container start."""
        with fleet.lock:
            served = {key: (replica.profile.oom_after_requests, replica.success + replica.errors)
                      for key, (_, replica) in fleet.replicas.items()}
            restarts = {(p["metadata"]["namespace"], p["metadata"]["name"]):
                        sum(c.get("restartCount", 0) for c in (p.get("status") or {}).get("containerStatuses") or [])
                        for p in fleet.cluster.pods}
        self.since = {k: v for k, v in self.since.items() if k in served}
        for key, (limit, count) in served.items():
            now_restarts = restarts.get(key, 0)
            started_restarts, started_count = self.since.setdefault(key, (now_restarts, count))
            if now_restarts != started_restarts:  # restarted since: count afresh
                self.since[key] = (now_restarts, count)
            elif limit and count - started_count >= limit and self._report(*key):
                self.since[key] = (now_restarts + 1, count)

    def _report(self, namespace: str, name: str) -> bool:
        body = json.dumps({"namespace": namespace, "name": name}).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5):
                return True
        except OSError as exc:
            log.warning("reporting OOM of %s/%s failed: %s", namespace, name, exc)
            return False
