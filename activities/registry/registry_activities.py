"""``RegistryActivities``: the activities of workflows/registry/contract.py on the registry store
(store.py) and the cluster's Deployments and routes (what still serves a version)."""

from __future__ import annotations

import asyncio
from typing import Collection

from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.kube import API_TIMEOUT, KubeClient, fail
from activities.clients.s3 import S3Client
from activities.core.deployments import list_routes
from activities.registry.store import Registry, RegistryError
from workflows.core import search_attributes as sa
from workflows.core.naming import LABEL_MODEL, LABEL_VERSION, MODEL_ROLLOUT_WORKFLOW
from workflows.core.versions import WeightFile
from workflows.registry import contract
from workflows.registry.contract import (
    DeleteWeightsInput,
    DeleteWeightsResult,
    ListReferencesInput,
    ListVersionsInput,
    ModelVersionRef,
    RecordRegistryBenchmarkInput,
    ReferencedVersions,
    RegistryStatusResult,
    RegistryWeights,
    RegistryWeightsInput,
    SetRegistryStatusInput,
    VersionList,
)


HEARTBEAT_EVERY = 10.0  # seconds between delete_registry_weights heartbeats (its timeout: a minute)
RUNNING_ROLLOUTS = f'WorkflowType = "{MODEL_ROLLOUT_WORKFLOW}" AND ExecutionStatus = "Running"'


def _non_retryable(exc: RegistryError) -> ApplicationError:
    return ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True)


class RegistryActivities(contract.RegistryActivities):
    """The registry's activities: the store in ``weights_bucket`` and the cluster's Deployments."""

    def __init__(
        self, s3: S3Client, kube: KubeClient, weights_bucket: str, weights_buckets: Collection[str] | None = None
    ) -> None:
        """``weights_buckets``: where registered weights may live, besides ``weights_bucket``."""
        self.registry = Registry(s3, weights_bucket, allowed_buckets=weights_buckets)
        self.kube = kube

    @activity.defn(name="resolve_registry_weights")
    def resolve_registry_weights(self, req: RegistryWeightsInput) -> RegistryWeights:
        """The weight files and their sha256 a rollout stages, from the registry entry; a file that
        is missing or was rewritten since registration fails here, before the cluster changes."""
        try:
            manifest = self.registry.resolve(req.model, req.version)
        except RegistryError as exc:
            raise _non_retryable(exc) from None
        return RegistryWeights(
            files=[WeightFile(uri=manifest.weights.uri(f.path), sha256=f.sha256) for f in manifest.weights.files]
        )

    @activity.defn(name="set_registry_status")
    def set_registry_status(self, req: SetRegistryStatusInput) -> RegistryStatusResult:
        try:
            manifest, demoted = self.registry.set_status(
                req.model, req.version, req.status, req.reason, req.at, req.demote_previous, req.deployment
            )
        except RegistryError as exc:
            raise _non_retryable(exc) from None
        return RegistryStatusResult(status=manifest.status, demoted=demoted)

    @activity.defn(name="record_registry_benchmark")
    def record_registry_benchmark(self, req: RecordRegistryBenchmarkInput) -> None:
        try:
            self.registry.record_benchmark(req.model, req.version, req.benchmark)
        except RegistryError as exc:
            raise _non_retryable(exc) from None

    @activity.defn(name="list_registry_versions")
    def list_registry_versions(self, req: ListVersionsInput) -> VersionList:
        return VersionList(versions=self.registry.list_versions(req.models))

    @activity.defn(name="delete_registry_weights")
    async def delete_registry_weights(self, req: DeleteWeightsInput) -> DeleteWeightsResult:
        """Refused while a ModelRollout of the version runs (one may have started since the plan);
        otherwise the deletion runs on a thread while this heartbeats the last deleted key every
        ``HEARTBEAT_EVERY`` seconds (and when it fails), and a retry resumes after that key."""
        details = activity.info().heartbeat_details
        ref = f"{req.model}@{req.version}"
        rollouts = [who for version, who in await _running_rollouts() if version == ref]
        if rollouts:
            return DeleteWeightsResult(deleted=False, reason=f"referenced by {', '.join(rollouts)}")
        last: list[str] = list(details[:1])

        def deleted_up_to(key: str) -> None:
            last[:] = [key]

        work = asyncio.ensure_future(
            asyncio.to_thread(
                self.registry.delete_weights, req.model, req.version, req.reason, req.at,
                resume_after=last[0] if last else None, deleted_up_to=deleted_up_to,
            )
        )
        while True:
            done, _ = await asyncio.wait([work], timeout=HEARTBEAT_EVERY)
            activity.heartbeat(*last)
            if done:
                try:
                    return work.result()
                except RegistryError as exc:
                    raise _non_retryable(exc) from None

    @activity.defn(name="list_referenced_versions")
    async def list_referenced_versions(self, req: ListReferencesInput) -> ReferencedVersions:
        """What can still serve or is about to: a Deployment with replicas, a backend the route
        sends traffic to, a running ModelRollout (it may be staging the weights). A 0-replica
        Deployment outside the route is none of these (the previous stable's rollback window is
        the registry's ``retired``, see plan_retention). Async: the rollouts come from the
        activity's Temporal client; the cluster is read on a thread."""
        where: dict[str, list[str]] = {}
        for ref, user in [*await asyncio.to_thread(self._serving, req.namespaces), *await _running_rollouts()]:
            where.setdefault(ref, []).append(user)
        refs = [ModelVersionRef(model=k.split("@", 1)[0], version=k.split("@", 1)[1]) for k in sorted(where)]
        return ReferencedVersions(refs=refs, where=where)

    def _serving(self, namespaces: list[str] | None) -> list[tuple[str, str]]:
        """(model@version, what serves it) for Deployments with replicas and route backends with weight."""
        deployments, routes = [], []
        for namespace in namespaces or [None]:
            where = namespace or "all namespaces"
            try:
                if namespace is None:
                    deployments += self.kube.apps.list_deployment_for_all_namespaces(
                        label_selector=LABEL_MODEL, _request_timeout=API_TIMEOUT
                    ).items
                else:
                    deployments += self.kube.apps.list_namespaced_deployment(
                        namespace, label_selector=LABEL_MODEL, _request_timeout=API_TIMEOUT
                    ).items
                routes += list_routes(self.kube, namespace)
            except ApiException as exc:
                fail(exc, f"list Deployments labelled {LABEL_MODEL} and HTTPRoutes in {where}")
        versions: dict[tuple[str, str], str] = {}  # (namespace, Deployment = Service name) -> model@version
        found: list[tuple[str, str]] = []
        for dep in deployments:
            template = (dep.spec.template.metadata.labels or {}) if dep.spec.template.metadata else {}
            labels = {**template, **(dep.metadata.labels or {})}
            model, version = labels.get(LABEL_MODEL), labels.get(LABEL_VERSION)
            if not (model and version):
                continue
            ns, name = dep.metadata.namespace, dep.metadata.name
            versions[(ns, name)] = f"{model}@{version}"
            replicas = max(dep.spec.replicas or 0, (dep.status.replicas if dep.status else None) or 0)
            if replicas > 0:
                found.append((versions[(ns, name)], f"Deployment {ns}/{name} ({replicas} replicas)"))
        for route in routes:
            meta = route["metadata"]
            for rule in route.get("spec", {}).get("rules") or []:
                for backend in rule.get("backendRefs") or []:
                    ref = versions.get((backend.get("namespace", meta["namespace"]), backend["name"]))
                    if ref and int(backend.get("weight", 1)) > 0:
                        found.append((ref, f"HTTPRoute {meta['namespace']}/{meta['name']} ({backend.get('weight', 1)} %)"))
        return found


async def _running_rollouts() -> list[tuple[str, str]]:
    """(model@version, "rollout <workflow id>") of every running ModelRollout, by its search attributes."""
    found = []
    async for execution in activity.client().list_workflows(RUNNING_ROLLOUTS):
        attrs = execution.typed_search_attributes
        model, version = attrs.get(sa.MODEL), attrs.get(sa.VERSION)
        if model and version:
            found.append((f"{model}@{version}", f"running rollout {execution.id}"))
    return found
