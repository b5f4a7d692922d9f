"""The official kubernetes client pointed at the sandbox's API emulator.

The sandbox processes (fleet simulator, node provisioner, launcher) read and write the emulated
cluster over HTTP exactly as tideplane's activities do; they want plain dicts, so responses are
read raw (``_preload_content=False``) and parsed as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client


def api_client(url: str) -> client.ApiClient:
    """An ApiClient for a plain-http API server at ``url`` (no credentials: the loopback admin)."""
    config = client.Configuration()
    config.host = url.rstrip("/")
    return client.ApiClient(config)


def raw(response: Any) -> dict:
    """The JSON body of a ``_preload_content=False`` call."""
    return json.loads(response.data)


def kubeconfig_yaml(url: str, token: str | None = None) -> str:
    """A kubeconfig for kubectl and the kubernetes client, pointing at ``url``: as the loopback
    admin, or with ``token`` as the ServiceAccount it was issued for."""
    user = f"{{token: {token}}}" if token else "{}"
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        f"- name: tideplane-sandbox\n  cluster:\n    server: {url}\n"
        "users:\n"
        f"- name: tideplane-sandbox\n  user: {user}\n"
        "contexts:\n"
        "- name: tideplane-sandbox\n  context:\n    cluster: tideplane-sandbox\n    user: tideplane-sandbox\n"
        "current-context: tideplane-sandbox\n"
    )
