"""The fleet's runtime knobs: behaviour profiles and demand, kept as ConfigMaps in the cluster.

Set through the Kubernetes API like any other object, so the demo, the tests and a person with
kubectl change them the same way, while the emulator's kubelet and the fleet simulator read them.
"""

from __future__ import annotations

from kubernetes import client

from infra.sandbox.config import DEMAND_CONFIGMAP, PROFILES_CONFIGMAP, SANDBOX_NAMESPACE, Demand, Profile


def _merge(api: client.ApiClient, name: str, data: dict[str, str]) -> None:
    core = client.CoreV1Api(api)
    try:
        core.patch_namespaced_config_map(name, SANDBOX_NAMESPACE, {"data": data})
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespaced_config_map(SANDBOX_NAMESPACE, {"metadata": {"name": name}, "data": data})


def set_profile(api: client.ApiClient, model: str, version: str | None, profile: Profile) -> None:
    """How ``model@version`` (or every version of ``model`` when version is None) behaves."""
    key = f"{model}@{version}" if version else model
    _merge(api, PROFILES_CONFIGMAP, {key: profile.model_dump_json()})


def set_demand(api: client.ApiClient, deployment: str, demand: Demand) -> None:
    """Requests offered to the logical deployment ``namespace/name``."""
    _merge(api, DEMAND_CONFIGMAP, {deployment: demand.model_dump_json()})
