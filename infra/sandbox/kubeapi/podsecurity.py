"""Pod Security admission, as the API server's built-in admission plugin enforces the Pod Security
Standards (kubernetes.io/docs/concepts/security/pod-security-standards/, .../pod-security-admission/).

A namespace labelled ``pod-security.kubernetes.io/<mode>: <level>`` (mode ``enforce``, ``warn`` or
``audit``; level ``privileged``, ``baseline`` or ``restricted``; ``<mode>-version`` defaults to
``latest``) has its pods checked at the level:

- ``enforce``: a pod that violates it is refused, 403 ``pods "x" is forbidden: violates PodSecurity
  "restricted:latest": <check> (<detail>), ...``; a controller's pod is refused the same way (the
  ReplicaSet's or Job's ``FailedCreate`` event carries the message), the workload itself is not;
- ``warn``: the response carries a ``Warning: 299 - "would violate PodSecurity ..."`` header, for
  pods and for the pod templates of workload resources;
- ``audit``: the real server writes an audit annotation; the emulator keeps no audit log and
  answers it as ``warn`` does.

Checked (the standard's controls, latest version): baseline: host namespaces, privileged,
non-default capabilities, hostPath volumes, host ports, /proc mount, seccomp Unconfined, unsafe
sysctls, hostProcess; restricted adds: volume types, privilege escalation, running as non-root,
runAsUser 0, seccomp RuntimeDefault/Localhost, capabilities drop ALL (add only NET_BIND_SERVICE).
AppArmor and SELinux options are not checked. No exemptions are configured.
"""

from __future__ import annotations

import threading
from typing import Any

LABEL_PREFIX = "pod-security.kubernetes.io/"
local = threading.local()  # .warnings: the Warning headers the request being answered gets
LEVELS = ("privileged", "baseline", "restricted")
MODES = ("enforce", "warn", "audit")
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret"}
GROUPS = ("", "apps", "batch")  # API groups of pods and the workload resources below
# workload resources whose pod template warn/audit check: plural -> path to the pod template
TEMPLATES = {"deployments": ("spec", "template"), "replicasets": ("spec", "template"), "statefulsets": ("spec", "template"),
             "daemonsets": ("spec", "template"), "jobs": ("spec", "template"), "replicationcontrollers": ("spec", "template"),
             "cronjobs": ("spec", "jobTemplate", "spec", "template")}


def policy(namespace: dict[str, Any] | None, mode: str) -> tuple[str, str] | None:
    """(level, version) the namespace sets for ``mode``; None: privileged (nothing to check)."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(LABEL_PREFIX + mode)
    if level not in ("baseline", "restricted"):
        return None
    return level, labels.get(f"{LABEL_PREFIX}{mode}-version") or "latest"


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for key in ("initContainers", "containers", "ephemeralContainers") for c in spec.get(key) or []
            if isinstance(c, dict)]


def _quoted(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _who(kind: str, names: list[str]) -> str:
    return f'{kind}{"s" if len(names) > 1 else ""} {_quoted(names)}'


def violations(spec: dict[str, Any], level: str) -> list[str]:
    """The checks a pod spec fails at ``level``, each as the API server words it."""
    if level not in ("baseline", "restricted"):
        return []
    out: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    containers = _containers(spec)
    sc = {c.get("name", ""): c.get("securityContext") or {} for c in containers}
    volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict)]

    # -- baseline --
    hostprocess = [n for n, s in sc.items() if (s.get("windowsOptions") or {}).get("hostProcess")]
    if hostprocess or (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("hostProcess (pod or containers must not set securityContext.windowsOptions.hostProcess=true)")
    hosts = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        out.append(f"host namespaces ({', '.join(hosts)})")
    privileged = [n for n, s in sc.items() if s.get("privileged")]
    if privileged:
        out.append(f"privileged ({_who('container', privileged)} must not set securityContext.privileged=true)")
    added = {n: [c for c in ((s.get("capabilities") or {}).get("add") or []) if c not in BASELINE_CAPABILITIES]
             for n, s in sc.items()}
    added = {n: caps for n, caps in added.items() if caps}
    if added:
        caps = sorted({c for cs in added.values() for c in cs})
        out.append(f"non-default capabilities ({_who('container', list(added))} must not include {_quoted(caps)} "
                   "in securityContext.capabilities.add)")
    host_path = [v.get("name", "") for v in volumes if "hostPath" in v]
    if host_path:
        out.append(f"hostPath volumes ({_who('volume', host_path)})")
    ports = {c.get("name", ""): [str(p["hostPort"]) for p in c.get("ports") or [] if isinstance(p, dict) and p.get("hostPort")]
             for c in containers}
    ports = {n: p for n, p in ports.items() if p}
    if ports:
        uses = "; ".join(f'container "{n}" uses hostPort{"s" if len(p) > 1 else ""} {", ".join(p)}' for n, p in ports.items())
        out.append(f"hostPort ({uses})")
    unmasked = [n for n, s in sc.items() if s.get("procMount") not in (None, "Default")]
    if unmasked:
        out.append(f'procMount ({_who("container", unmasked)} must not set securityContext.procMount to "Unmasked")')
    unconfined = ((["pod"] if (pod_sc.get("seccompProfile") or {}).get("type") == "Unconfined" else [])
                  + [f'container "{n}"' for n, s in sc.items() if (s.get("seccompProfile") or {}).get("type") == "Unconfined"])
    if unconfined:
        out.append(f'seccompProfile ({" and ".join(unconfined)} must not set securityContext.seccompProfile.type to "Unconfined")')
    sysctls = [s.get("name", "") for s in pod_sc.get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]
    if sysctls:
        out.append(f"forbidden sysctls ({', '.join(sysctls)})")
    if level == "baseline":
        return out

    # -- restricted --
    escalating = [n for n, s in sc.items() if s.get("allowPrivilegeEscalation") is not False]
    if escalating:
        out.append(f"allowPrivilegeEscalation != false ({_who('container', escalating)} must set "
                   "securityContext.allowPrivilegeEscalation=false)")
    no_drop = [n for n, s in sc.items() if "ALL" not in ((s.get("capabilities") or {}).get("drop") or [])]
    extra = {n: [c for c in ((s.get("capabilities") or {}).get("add") or []) if c != "NET_BIND_SERVICE"] for n, s in sc.items()}
    extra = {n: caps for n, caps in extra.items() if caps}
    if no_drop or extra:
        parts = ([f'{_who("container", no_drop)} must set securityContext.capabilities.drop=["ALL"]'] if no_drop else [])
        if extra:
            parts.append(f"{_who('container', list(extra))} must not include "
                         f"{_quoted(sorted({c for cs in extra.values() for c in cs}))} in securityContext.capabilities.add")
        out.append(f"unrestricted capabilities ({'; '.join(parts)})")
    restricted = {v.get("name", ""): next((k for k in v if k != "name" and k not in RESTRICTED_VOLUME_TYPES), None) for v in volumes}
    restricted = {n: t for n, t in restricted.items() if t}
    if restricted:
        names, types = list(restricted), sorted(set(restricted.values()))
        verb = "uses" if len(names) == 1 else "use"
        out.append(f"restricted volume types ({_who('volume', names)} {verb} restricted volume "
                   f"type{'s' if len(types) > 1 else ''} {_quoted(types)})")
    pod_non_root = pod_sc.get("runAsNonRoot")
    explicit_false = [n for n, s in sc.items() if s.get("runAsNonRoot") is False]
    unset = [n for n, s in sc.items() if s.get("runAsNonRoot") is None]
    if pod_non_root is False or explicit_false or (unset and pod_non_root is not True):
        parts = (["pod must not set securityContext.runAsNonRoot=false"] if pod_non_root is False else [])
        if explicit_false:
            parts.append(f"{_who('container', explicit_false)} must not set securityContext.runAsNonRoot=false")
        if unset and pod_non_root is not True:
            parts.append(f"pod or {_who('container', unset)} must set securityContext.runAsNonRoot=true")
        out.append(f"runAsNonRoot != true ({'; '.join(parts)})")
    root = (["pod"] if pod_sc.get("runAsUser") == 0 else []) + [f'container "{n}"' for n, s in sc.items() if s.get("runAsUser") == 0]
    if root:
        out.append(f"runAsUser=0 ({' and '.join(root)} must not set runAsUser=0)")
    allowed = ("RuntimeDefault", "Localhost")
    pod_type = (pod_sc.get("seccompProfile") or {}).get("type")
    missing = [n for n, s in sc.items() if (s.get("seccompProfile") or {}).get("type") not in allowed
               and not ((s.get("seccompProfile") or {}).get("type") is None and pod_type in allowed)]
    missing = [n for n in missing if (sc[n].get("seccompProfile") or {}).get("type") != "Unconfined"]  # said above
    if missing:
        out.append(f'seccompProfile (pod or {_who("container", missing)} must set securityContext.seccompProfile.type '
                   'to "RuntimeDefault" or "Localhost")')
    return out


def pod_message(level: str, version: str, failed: list[str]) -> str:
    return f'violates PodSecurity "{level}:{version}": {", ".join(failed)}'


def template_spec(plural: str, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec a workload resource's template holds (None: not a workload resource)."""
    path = TEMPLATES.get(plural)
    node: Any = obj
    for key in path or ():
        node = node.get(key) if isinstance(node, dict) else None
    return node.get("spec") if path and isinstance(node, dict) and isinstance(node.get("spec"), dict) else None


def warnings(namespace: dict[str, Any] | None, plural: str, obj: dict[str, Any]) -> list[str]:
    """The Warning headers a write of ``obj`` gets from the namespace's warn and audit levels."""
    spec = obj.get("spec") if plural == "pods" else template_spec(plural, obj)
    if not isinstance(spec, dict):
        return []
    out: list[str] = []
    for mode in ("warn", "audit"):
        found = policy(namespace, mode)
        if found:
            failed = violations(spec, found[0])
            text = f'would violate PodSecurity "{found[0]}:{found[1]}": {", ".join(failed)}'
            if failed and text not in out:
                out.append(text)
    return out


def enforce(namespace: dict[str, Any] | None, pod: dict[str, Any]) -> str | None:
    """Why the namespace's enforce level refuses the pod (the 403's reason), else None."""
    found = policy(namespace, "enforce")
    if not found:
        return None
    failed = violations(pod.get("spec") or {}, found[0])
    return pod_message(found[0], found[1], failed) if failed else None


def take_warnings() -> list[str]:
    found, local.warnings = getattr(local, "warnings", []), []
    return found


def admit(namespace: dict[str, Any] | None, plural: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> str | None:
    """A write of ``obj`` (a pod or a workload resource) to the namespace: queues its warnings and
    answers why enforce refuses it (pods only, when they are created or their spec changes)."""
    if plural != "pods" and plural not in TEMPLATES:
        return None
    if old is not None and (old.get("spec") == obj.get("spec")):
        return None  # metadata- or status-only updates are not evaluated
    local.warnings = [*getattr(local, "warnings", []), *warnings(namespace, plural, obj)]
    return enforce(namespace, obj) if plural == "pods" else None
