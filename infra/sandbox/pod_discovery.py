"""A stand-in for Prometheus' Kubernetes pod discovery (``kubernetes_sd_configs`` role ``pod``),
writing file_sd target groups.

Debian's prometheus 2.42 is built without Kubernetes discovery, so the sandbox's Prometheus cannot
list pods itself. This bridge lists and watches pods through the emulator's API as the pod role's
informer does and writes, atomically, the targets and meta labels the pod role makes
(prometheus/discovery/kubernetes/pod.go, ``buildPod``): one target per container port at
``<podIP>:<port>`` (the bare pod IP for a container without ports), none for a pod without an IP.
file_sd groups share their labels across targets, so each target is its own group.

Run: ``python -m infra.sandbox.pod_discovery --kube-url URL --out FILE``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import tempfile
import threading
import urllib.request
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("tideplane.pod_discovery")

META = "__meta_kubernetes_"
WATCH_TIMEOUT_S = 300


def sanitized(name: str) -> str:
    """A Kubernetes label or annotation key as a Prometheus label name (strutil.SanitizeLabelName)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _ready(pod: dict) -> str:
    """``true``/``false`` from the Ready condition, ``unknown`` without one (pod.go podReady)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("status", "Unknown")).lower()
    return "unknown"


def pod_labels(pod: dict) -> dict[str, str]:
    """The labels every target of ``pod`` carries (pod.go podLabels, plus the namespace)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    labels = {
        META + "namespace": meta.get("namespace", ""),
        META + "pod_name": meta.get("name", ""),
        META + "pod_ip": status.get("podIP", ""),
        META + "pod_ready": _ready(pod),
        META + "pod_phase": status.get("phase", ""),
        META + "pod_node_name": spec.get("nodeName", ""),
        META + "pod_host_ip": status.get("hostIP", ""),
        META + "pod_uid": meta.get("uid", ""),
    }
    controller = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)
    if controller and controller.get("kind"):
        labels[META + "pod_controller_kind"] = controller["kind"]
    if controller and controller.get("name"):
        labels[META + "pod_controller_name"] = controller["name"]
    for key, value in (meta.get("labels") or {}).items():
        labels[META + "pod_label_" + sanitized(key)] = value
        labels[META + "pod_labelpresent_" + sanitized(key)] = "true"
    for key, value in (meta.get("annotations") or {}).items():
        labels[META + "pod_annotation_" + sanitized(key)] = value
        labels[META + "pod_annotationpresent_" + sanitized(key)] = "true"
    return labels


def pod_target_groups(pod: dict) -> list[dict]:
    """file_sd groups for ``pod``: one per container port, as the pod role's targets."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return []  # starting or evicted: the pod role sends an empty group
    shared = pod_labels(pod)
    host = f"[{ip}]" if ":" in ip else ip  # net.JoinHostPort
    groups = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        name = container.get("name", "")
        if not container.get("ports"):
            groups.append({"targets": [ip], "labels": {**shared, META + "pod_container_name": name}})
            continue
        for port in container["ports"]:
            number = str(port["containerPort"])
            groups.append({"targets": [f"{host}:{number}"], "labels": {
                **shared,
                META + "pod_container_name": name,
                META + "pod_container_port_number": number,
                META + "pod_container_port_name": port.get("name", ""),
                META + "pod_container_port_protocol": port.get("protocol", "TCP"),
            }})
    return groups


def target_groups(pods: Iterable[dict]) -> list[dict]:
    """All pods' groups, in a stable order so an unchanged cluster rewrites the same file."""
    ordered = sorted(pods, key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"]["name"]))
    return [group for pod in ordered for group in pod_target_groups(pod)]


def write_file_sd(path: Path, groups: list[dict]) -> None:
    """Replace ``path`` in one rename, so Prometheus' file watcher never reads half a file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as out:
        json.dump(groups, out, indent=1, sort_keys=True)
    os.replace(temporary, path)


def on_file_sd(job: dict, path: Path) -> dict:
    """A ``kubernetes_sd_configs`` (role pod) scrape job reading this bridge's ``path`` instead,
    everything else (relabel_configs, no honor_labels) unchanged."""
    if job.get("kubernetes_sd_configs") != [{"role": "pod"}]:
        raise ValueError(f"job {job.get('job_name')!r} does not discover pods: {job.get('kubernetes_sd_configs')!r}")
    swapped = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
    return swapped | {"file_sd_configs": [{"files": [str(path)], "refresh_interval": "1s"}]}


def _get(url: str, timeout: float):
    return urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "application/json"}), timeout=timeout)


class PodDiscovery:
    """Lists then watches ``/api/v1/pods`` (cluster-wide, as the pod role does without namespaces)
    and rewrites the file_sd file after every change; relists when a watch ends or fails."""

    def __init__(self, kube_url: str, out: Path) -> None:
        self._url, self._out = kube_url.rstrip("/"), out
        self._pods: dict[tuple[str, str], dict] = {}

    def _write(self) -> None:
        write_file_sd(self._out, target_groups(self._pods.values()))

    def list_pods(self) -> str:
        """Replace the known pods with a fresh list; return its resourceVersion for the watch."""
        with _get(f"{self._url}/api/v1/pods?resourceVersion=0", timeout=30) as answer:
            listed = json.load(answer)
        self._pods = {(p["metadata"].get("namespace", ""), p["metadata"]["name"]): p for p in listed["items"]}
        self._write()
        return listed["metadata"]["resourceVersion"]

    def watch(self, resource_version: str) -> None:
        """Apply watch events until the server closes the watch."""
        url = (f"{self._url}/api/v1/pods?watch=true&allowWatchBookmarks=true"
               f"&resourceVersion={resource_version}&timeoutSeconds={WATCH_TIMEOUT_S}")
        with _get(url, timeout=WATCH_TIMEOUT_S + 30) as stream:
            for line in stream:
                event = json.loads(line)
                if event["type"] == "ERROR":
                    return  # e.g. 410 Gone: the caller relists
                if event["type"] == "BOOKMARK":
                    continue
                pod = event["object"]
                key = (pod["metadata"].get("namespace", ""), pod["metadata"]["name"])
                if event["type"] == "DELETED":
                    self._pods.pop(key, None)
                else:
                    self._pods[key] = pod
                self._write()

    def run_forever(self, stop: threading.Event | None = None) -> None:
        """List and watch until ``stop`` is set (never, without one)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self.watch(self.list_pods())
            except (OSError, ValueError, KeyError) as error:
                log.warning("pod discovery: %s; relisting", error)
                stop.wait(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kube-url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    PodDiscovery(args.kube_url, args.out).run_forever()


if __name__ == "__main__":
    main()
