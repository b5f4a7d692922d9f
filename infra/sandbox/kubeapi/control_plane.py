"""What the kubelet, the workload controllers and the networking controllers use of the controller
loop that runs them (controllers.py): the store, the time scale, pod IPs, Events, pod deletion."""

from __future__ import annotations

from typing import Any, Protocol

from .store import Store


class ControlPlane(Protocol):
    store: Store
    time_scale: float
    ip_counter: int  # the last pod IP handed out
    pod_network: str  # the first two octets of pod IPs, e.g. "10.244"

    def record(self, obj: dict[str, Any], kind: str, reason: str, message: str, component: str) -> None:
        """Emit a core/v1 Event about ``obj``."""

    def delete_pod(self, pod: dict[str, Any]) -> None:
        """Delete a pod as its controller would (graceful when it runs)."""
