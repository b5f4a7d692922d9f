"""The Kubernetes "restricted" Pod Security Standard as tideplane's pods wear it: no root, no
privilege escalation, no capabilities, the runtime's default seccomp profile. Whether a pod then
meets restricted, baseline or only privileged is down to its volumes (docs/getting-started.md,
"Pod Security levels")."""

from __future__ import annotations

CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_security(user: int) -> dict:
    """A pod's securityContext: every container runs as ``user`` (and its group), never root."""
    return {"runAsNonRoot": True, "runAsUser": user, "runAsGroup": user, "seccompProfile": {"type": "RuntimeDefault"}}
