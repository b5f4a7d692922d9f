"""What ModelRollout does outside the workflow: stage weights from S3 into the model cache, run one
Deployment + Service per version and the HTTPRoute split, warm the new version up, and measure its
canary gates in Prometheus. ``RolloutActivities`` implements the contract in
workflows/rollout/contract.py with the clients and settings values the worker passes in.

Staging. Weights are tens of GiB: each file is fetched resumably and verified while it downloads
(activities/core/verified_file.py), so a retry fetches only what an earlier attempt did not verify.

Kubernetes. Every write is declarative (create, or replace/patch to the desired state) so an
activity retried after a crash converges on the same objects instead of duplicating them. Errors
that retrying cannot fix (unknown namespace, invalid object, bad weights) are non-retryable and named.

Warm-up. Requests go straight to the version's Service (not through the HTTPRoute), so the
benchmark measures the new version alone and users never see a cold replica.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Collection

import httpx
import jsonschema
from botocore.exceptions import ClientError
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.clients.kube import (
    API_TIMEOUT, KubeClient, apply_service, container_named, fail, gateway_parent_ref, is_ready, label_selector, read_or_none, retry_on_conflict,
    selector,
)
from activities.clients.prometheus import PrometheusClient, render
from activities.clients.s3 import (
    NOT_FOUND,
    BucketNotAllowed,
    ObjectChanged,
    S3Client,
    error_code,
    parse_s3_uri,
    require_allowed_bucket,
)
from activities.clients.shadow import ShadowPairsClient
from activities.clients.vllm import VllmClient
from activities.node_cache import NodeCache
from activities.core.verified_file import ChecksumMismatch, already_verified, discard_partial, fetch_verified
from workflows.core import naming, telemetry
from workflows.adapters.routing import lora_modules
from workflows.core.bounds import MAX_GPUS_PER_REPLICA, MAX_REPLICAS
from workflows.core.naming import DeploymentRef
from workflows.rollout import contract
from workflows.rollout.contract import (
    DESCRIBE_DEPLOYMENT,
    ENSURE_VERSION,
    QUERY_GATES,
    SCALE_VERSION,
    SET_ROUTE_WEIGHTS,
    STAGE_WEIGHTS,
    WAIT_READY,
    WARM_UP,
    Benchmark,
    DeploymentState,
    EnsureVersionInput,
    GateQueriesInput,
    GateQueriesResult,
    ReadyResult,
    RouteWeightsInput,
    ScaleVersionInput,
    StagedWeights,
    StageWeightsInput,
    VersionInfo,
    WaitReadyInput,
    WarmUpInput,
    WeightFile,
)
from workflows.rollout.contract import (
    CANCEL_RETIRE,
    SCHEDULE_RETIRE,
    CancelRetireInput,
    RetireInput,
    retire_workflow_id,
)
from workflows.rollout.contract import (
    READ_SHADOW_PAIRS,
    RUN_GOLDEN_SET,
    GoldenRunInput,
    GoldenRunResult,
    ShadowPairsInput,
    ShadowPairsResult,
)
from workflows.rollout.quality import CaseResult, ShadowPair, grade
from workflows.rollout.retire import RetireVersion
from workflows.scaling.placement import node_selector, tolerations
from workflows.staging.contract import NodeStageRequest
from workflows.staging.cache import cached_version_label
from workflows.scaling.gpu_sharing import GPU_MEMORY_UTILIZATION_FLAG, SHARED_GPU_RESOURCE

ROUTE_API = ("gateway.networking.k8s.io", "v1")
CONTAINER = "server"
CACHE_VOLUME = "model-cache"
ENGINE_CACHE_VOLUME = "engine-cache"
ENGINE_CACHE_ENV = "VLLM_CACHE_ROOT"  # vLLM's torch.compile and CUDA-graph cache
NODE_CACHE_VOLUME, NODE_VERSION_VOLUME = "node-cache", "node-cache-version"
STAGE_INIT_CONTAINER = "stage-weights"
# A deleted replica drains: preStop waits while its endpoint is removed everywhere (no new
# requests), then SIGTERM and vLLM finishes what it accepted within the grace period.
PRE_STOP_SECONDS = 5
DRAIN_GRACE_SECONDS = 120
OWNED_ELSEWHERE = contract.DEPLOYMENT_OWNED
MIRROR_FILTER = "RequestMirror"


@dataclass(frozen=True)
class ServingPods:
    """How serving pods see the model cache and where they send traces (from the worker's Settings)."""

    model_cache_dir: Path
    model_cache_pvc: str | None = None  # None: a hostPath of model_cache_dir on the node
    otlp_traces_endpoint: str | None = None
    trace_sample_ratio: float = 0.1
    engine_cache_dir: Path | None = None  # VLLM_CACHE_ROOT per version on the node's disk; None: none
    node_cache_dir: Path | None = None  # the node-local weight cache (activities/node_cache.py); None: pods never read it
    node_cache_image: str = "ghcr.io/tideplane/worker:0.1.0"  # what the pods' staging init container runs


class RolloutActivities(contract.RolloutActivities):
    """ModelRollout's activities over the worker's clients; one instance per worker, thread-safe."""

    def __init__(
        self,
        kube: KubeClient,
        s3: S3Client,
        prometheus: PrometheusClient,
        vllm: VllmClient,
        pods: ServingPods,
        gateway: str,
        service_url_template: str,
        weights_buckets: Collection[str] | None = None,
        shadow: ShadowPairsClient | None = None,
        image_prefixes: Collection[str] | None = None,
        max_replicas: int = MAX_REPLICAS,
        max_gpus_per_replica: int = MAX_GPUS_PER_REPLICA,
    ) -> None:
        """``weights_buckets``: the buckets weights may be staged from (None: any); ``shadow``: where
        mirrored answers are recorded (None: the shadow gate cannot run); ``image_prefixes``: the
        registries/repositories serving images may come from (None: any)."""
        self.image_prefixes = image_prefixes
        self.max_replicas = max_replicas  # the cluster's maxima (TIDEPLANE_MAX_REPLICAS, ..._GPUS_PER_REPLICA)
        self.max_gpus_per_replica = max_gpus_per_replica
        self.shadow = shadow or ShadowPairsClient(None)
        self.weights_buckets = weights_buckets
        self.kube = kube
        self.s3 = s3
        self.prometheus = prometheus
        self.vllm = vllm
        self.pods = pods
        self.gateway = gateway  # "NAMESPACE/NAME" or "NAME" (then in the route's namespace)
        self.service_url_template = service_url_template

    # ---- S3 -> model cache ----------------------------------------------------------------------

    @activity.defn(name=STAGE_WEIGHTS)
    def stage_weights(self, req: StageWeightsInput) -> StagedWeights:
        """Download and verify every weights file into ``<model_cache_dir>/<model>/<version>/``."""
        started = time.monotonic()
        if req.image is not None:
            self._require_allowed_image(req.image)
        directory = self.pods.model_cache_dir / _safe_component(req.model, "model") / _safe_component(req.version, "version")
        targets: dict[str, WeightFile] = {}
        for wf in req.files:
            try:
                bucket, key = parse_s3_uri(wf.uri)
                require_allowed_bucket(bucket, self.weights_buckets, f"weights {wf.uri}")
            except BucketNotAllowed as exc:
                raise ApplicationError(str(exc), type="BucketNotAllowed", non_retryable=True) from None
            except ValueError as exc:
                raise ApplicationError(str(exc), non_retryable=True) from None
            name = PurePosixPath(key).name
            if name in targets:
                raise ApplicationError(
                    f"two weights files would both be staged as {name!r}: {targets[name].uri}, {wf.uri}", non_retryable=True
                )
            targets[name] = wf

        previous = activity.info().heartbeat_details
        if previous:
            activity.logger.info("retrying staging; last attempt reported %s", previous[0])

        staged = {name: already_verified(directory / name, wf.sha256) for name, wf in targets.items()}
        try:
            heads = {name: self._head(*parse_s3_uri(wf.uri)) for name, wf in targets.items() if staged[name] is None}
        except ApplicationError:
            for name in targets:  # the weights are gone: what an earlier attempt left cannot be resumed
                discard_partial(directory / name)
            raise
        total = sum(size for size in staged.values() if size is not None) + sum(h["ContentLength"] for h in heads.values())
        progress = _Progress(total)
        directory.mkdir(parents=True, exist_ok=True)
        with _staging_lock(directory):
            for name, wf in targets.items():
                if staged[name] is not None:
                    progress.resumed += staged[name]
                    progress.advance(wf.uri, staged[name], staged[name])
                    continue
                self._stage_file(wf, directory / name, heads[name], progress)
        return StagedWeights(
            path=str(directory), size_bytes=total, resumed_bytes=progress.resumed, seconds=time.monotonic() - started
        )

    def _head(self, bucket: str, key: str) -> dict:
        """HEAD the object; a missing bucket or key fails the rollout, naming it."""
        try:
            return self.s3.boto.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) not in NOT_FOUND:
                raise
        try:
            self.s3.boto.head_bucket(Bucket=bucket)
        except ClientError as exc:
            if error_code(exc) in NOT_FOUND:
                raise ApplicationError(f"weights bucket {bucket!r} not found (s3://{bucket}/{key})", non_retryable=True) from None
            raise
        raise ApplicationError(f"weights object not found: s3://{bucket}/{key}", non_retryable=True)

    def _stage_file(self, wf: WeightFile, dest: Path, head: dict, progress: _Progress) -> None:
        bucket, key = parse_s3_uri(wf.uri)
        size, etag = head["ContentLength"], head["ETag"]

        def advance(offset: int, nbytes: int) -> None:
            progress.advance(wf.uri, offset, nbytes)

        try:
            resumed = fetch_verified(
                dest, wf.sha256, size, etag, lambda start: self.s3.stream(bucket, key, etag, size, start=start), advance
            )
        except ObjectChanged as exc:
            raise ApplicationError(f"{exc}; restarting") from None
        except ClientError as exc:
            if error_code(exc) not in NOT_FOUND:
                raise
            discard_partial(dest)  # deleted while being read (e.g. by retention): nothing to resume
            raise ApplicationError(f"weights object not found: {wf.uri} (deleted while staging)", non_retryable=True) from None
        except ChecksumMismatch as exc:
            raise ApplicationError(
                f"checksum mismatch for {wf.uri}: expected sha256 {exc.expected}, actual {exc.actual}",
                {"uri": wf.uri, "expected": exc.expected, "actual": exc.actual},
                type="ChecksumMismatch",
                non_retryable=True,
            ) from None
        if resumed:
            activity.logger.info("resumed %s at byte %d of %d (verified by an earlier attempt)", wf.uri, resumed, size)
        progress.resumed += resumed

    # ---- Kubernetes: versions and the route ------------------------------------------------------

    @activity.defn(name=DESCRIBE_DEPLOYMENT)
    def describe_deployment(self, ref: DeploymentRef) -> DeploymentState:
        """The versions of a logical deployment in the cluster, their replicas and route weights."""
        return deployment_state(self.kube, ref)

    @activity.defn(name=ENSURE_VERSION)
    def ensure_version(self, req: EnsureVersionInput) -> None:
        """Create or update the Deployment and Service for one version (no route change)."""
        cache = self.pods.model_cache_dir
        if not Path(req.weights_path).is_relative_to(cache):
            raise ApplicationError(
                f"weights_path {req.weights_path!r} is outside the model cache {str(cache)!r} that pods mount",
                non_retryable=True,
            )
        self._require_allowed_image(req.image)
        self._require_within_cluster(req.replicas, req.gpus_per_replica)
        self.kube.require_namespace(req.deployment.namespace)
        self._claim_route(req.deployment, req.owner)
        self._create_or_replace_deployment(deployment_manifest(req, self.pods))
        apply_service(self.kube.core, service_manifest(req))

    def _require_allowed_image(self, image: str) -> None:
        """Serving images only from the allowed registries (checked at staging, before anything is
        read, and again before a Deployment is written)."""
        if self.image_prefixes is not None and not image_allowed(image, self.image_prefixes):
            raise ApplicationError(
                f"image {image!r} is not from an allowed registry (TIDEPLANE_IMAGE_PREFIXES:"
                f" {', '.join(self.image_prefixes) or 'none'})",
                type="ImageNotAllowed",
                non_retryable=True,
            )

    @activity.defn(name=SCALE_VERSION)
    def scale_version(self, req: ScaleVersionInput) -> None:
        """Set one version's replicas through the Deployment's scale subresource; a scale-down first
        marks which replicas go (``mark_deletion_costs``)."""
        self._require_within_cluster(req.replicas)
        self.kube.require_namespace(req.deployment.namespace)
        name = req.deployment.versioned(req.version)
        dep = read_or_none(self.kube.apps.read_namespaced_deployment, name, req.deployment.namespace)
        if dep is not None and req.replicas < (dep.spec.replicas or 0):
            mark_deletion_costs(self.kube, req.deployment.namespace, label_selector(selector(req.deployment.name, req.version)))
        try:
            self.kube.apps.patch_namespaced_deployment_scale(
                name, req.deployment.namespace, {"spec": {"replicas": req.replicas}}, _request_timeout=API_TIMEOUT
            )
        except ApiException as exc:
            fail(exc, f"scale Deployment {req.deployment.namespace}/{name} (version {req.version})")

    @activity.defn(name=WAIT_READY)
    def wait_ready(self, req: WaitReadyInput) -> ReadyResult:
        """Poll until ``replicas`` pods of the version are Ready; the workflow's timeout bounds the wait.

        The start time travels in the heartbeat details, so a retried attempt still reports the
        cold start from the first call.
        """
        ref = req.deployment
        self.kube.require_namespace(ref.namespace)
        name = ref.versioned(req.version)
        if read_or_none(self.kube.apps.read_namespaced_deployment, name, ref.namespace) is None:
            raise ApplicationError(f"Deployment {ref.namespace}/{name} not found", non_retryable=True)
        details = activity.info().heartbeat_details
        started = float(details[0]["started_at"]) if details else time.time()
        pods_of_version = label_selector(selector(ref.name, req.version))
        while True:
            pods = self.kube.core.list_namespaced_pod(
                ref.namespace, label_selector=pods_of_version, _request_timeout=API_TIMEOUT
            ).items
            ready = sum(1 for p in pods if is_ready(p))
            if ready >= req.replicas:
                return ReadyResult(ready_replicas=ready, seconds=round(time.time() - started, 3))
            waiting = [_waiting_reason(p) for p in pods if not is_ready(p)]
            if len(pods) < req.replicas:
                waiting.append(f"{req.replicas - len(pods)} pod(s) not created yet")
            activity.heartbeat({"started_at": started, "ready": ready, "desired": req.replicas, "waiting": waiting[:10]})
            activity.wait_for_cancelled_sync(req.poll_seconds)
            if activity.is_cancelled():
                raise CancelledError(f"wait_ready {name} cancelled")

    @activity.defn(name=SET_ROUTE_WEIGHTS)
    def set_route_weights(self, req: RouteWeightsInput) -> None:
        """Make the HTTPRoute's first rule send exactly these weights to the versions' Services.

        Versions at weight 0 stay listed so the next step can re-weight them; the route is created
        (attached to the gateway) when missing. Read-modify-replace keeps the rule's matches and
        filters, and the resourceVersion makes a concurrent edit a retried conflict, not a loss.
        The weights set are recorded as ``tideplane_rollout_weight`` (the rollouts dashboard).
        """
        if not req.weights or any(not 0 <= w <= 100 for w in req.weights.values()) or sum(req.weights.values()) != 100:
            raise ApplicationError(f"route weights must be 0..100 and sum to 100, got {req.weights}", non_retryable=True)
        ref = req.deployment
        self.kube.require_namespace(ref.namespace)
        backends = []
        for version, weight in sorted(req.weights.items()):
            service = ref.versioned(version)
            if weight and read_or_none(self.kube.core.read_namespaced_service, service, ref.namespace) is None:
                raise ApplicationError(
                    f"cannot send {weight}% to version {version}: Service {ref.namespace}/{service} not found",
                    non_retryable=True,
                )
            backends.append({"group": "", "kind": "Service", "name": service, "port": req.port, "weight": weight})
        mirror = mirror_filter(req)

        self._claim_route(ref, req.owner)
        custom = self.kube.custom

        def write_route() -> None:
            route = read_route(self.kube, ref)
            if route is None:
                body = {
                    "apiVersion": "/".join(ROUTE_API),
                    "kind": "HTTPRoute",
                    "metadata": {
                        "name": ref.name,
                        "namespace": ref.namespace,
                        "labels": {**selector(ref.name), naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
                    },
                    "spec": {
                        "parentRefs": [gateway_parent_ref(self.gateway, ref.namespace)],
                        "rules": [{"backendRefs": backends, **({"filters": [mirror]} if mirror else {})}],
                    },
                }
                custom.create_namespaced_custom_object(*ROUTE_API, ref.namespace, "httproutes", body, _request_timeout=API_TIMEOUT)
                return
            rules = route.setdefault("spec", {}).setdefault("rules", [])
            if not rules:
                rules.append({})
            filters = with_mirror(rules[0].get("filters") or [], mirror, {b["name"] for b in backends})
            if rules[0].get("backendRefs") == backends and (rules[0].get("filters") or []) == filters:
                return
            rules[0]["backendRefs"] = backends
            if filters or "filters" in rules[0]:
                rules[0]["filters"] = filters
            custom.replace_namespaced_custom_object(
                *ROUTE_API, ref.namespace, "httproutes", ref.name, route, _request_timeout=API_TIMEOUT
            )

        retry_on_conflict(f"HTTPRoute {ref}", write_route)
        self._claim_route(ref, req.owner, release=req.release)  # a route just created; or give it up
        telemetry.route_weights(activity.metric_meter(), ref.namespace, ref.name, req.weights)

    def _require_within_cluster(self, replicas: int, gpus_per_replica: int = 0) -> None:
        """Refuse, naming the field and the setting, what the cluster was configured never to run."""
        for field, value, limit, setting in (
            ("replicas", replicas, self.max_replicas, "TIDEPLANE_MAX_REPLICAS"),
            ("gpus_per_replica", gpus_per_replica, self.max_gpus_per_replica, "TIDEPLANE_MAX_GPUS_PER_REPLICA"),
        ):
            if value > limit:
                raise ApplicationError(
                    f"{field}: {value} exceeds the cluster's maximum {limit} ({setting})", type="OverClusterMaximum", non_retryable=True
                )

    def _claim_route(self, ref: DeploymentRef, owner: str | None, release: bool = False) -> None:
        """One rollout per deployment, whatever its workflow ID: the HTTPRoute carries its owner's ID
        (compare-and-swap on the resourceVersion); another owner's route is refused, naming it."""
        if owner is None:
            return

        def claim() -> None:
            route = read_route(self.kube, ref)
            if route is None:
                return  # a first deploy: the route is claimed when created
            annotations = route["metadata"].setdefault("annotations", {}) or {}
            route["metadata"]["annotations"] = annotations
            held = annotations.get(naming.ANNOTATION_OWNER)
            if held not in (None, owner):
                raise owned_elsewhere(f"HTTPRoute {ref}", held, owner)
            if (held is None) == release:
                return  # already ours, or already given up
            if release:
                del annotations[naming.ANNOTATION_OWNER]
            else:
                annotations[naming.ANNOTATION_OWNER] = owner
            self.kube.custom.replace_namespaced_custom_object(
                *ROUTE_API, ref.namespace, "httproutes", ref.name, route, _request_timeout=API_TIMEOUT
            )

        retry_on_conflict(f"HTTPRoute {ref}", claim)

    def _create_or_replace_deployment(self, body: dict) -> None:
        apps = self.kube.apps
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]

        def write() -> None:
            current = read_or_none(apps.read_namespaced_deployment, name, ns)
            if current is None:
                apps.create_namespaced_deployment(ns, body, _request_timeout=API_TIMEOUT)
                return
            _require_same_version(current, body)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            body["metadata"]["annotations"] = current.metadata.annotations  # e.g. the revision
            apps.replace_namespaced_deployment(name, ns, body, _request_timeout=API_TIMEOUT)

        retry_on_conflict(f"Deployment {ns}/{name}", write)

    # ---- the new version's endpoint ---------------------------------------------------------------

    def service_url(self, ref: DeploymentRef, version: str) -> str:
        """Base URL of one version's OpenAI-compatible server, per ``service_url_template``."""
        return self.service_url_template.format(service=ref.versioned(version), namespace=ref.namespace).rstrip("/")

    @activity.defn(name=WARM_UP)
    def warm_up(self, req: WarmUpInput) -> Benchmark:
        """Send ``requests`` completions; the benchmark is made of the answered ones only (latencies
        of answers, their generated tokens over the wall time of the run), errors are counted.

        Raises (retryable) when more than ``max_error_rate`` of the requests failed: then the run
        measures errors, not the version (issue 16: 16 of 20 answered "503 no Ready pod behind
        service"). Temporal retries the whole run within the warm-up deadline, so a version whose
        endpoints become Ready late still gets a benchmark, and one that never answers is rolled
        back before any traffic moves. Fewer, sporadic errors pass: the canary's error-rate gate
        judges them on real traffic (failing warm-up on any error rolled a 30 %-error release back
        at warm-up, before its gate could say why).
        """
        url = self.service_url(req.deployment, req.version)
        body: dict[str, Any] = {"prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0}
        if req.model:
            body["model"] = req.model
        run = self.vllm.completions(
            url, body, req.requests, lambda done, errors: activity.heartbeat({"done": done, "of": req.requests, "errors": errors})
        )
        if len(run.errors) > req.max_error_rate * req.requests:
            raise ApplicationError(
                f"warm-up: {len(run.errors)} of {req.requests} requests to {url}/v1/completions failed "
                f"(more than {req.max_error_rate:.0%}); e.g. {run.errors[0]}",
                type="WarmUpErrors",
            )
        return Benchmark(
            requests=req.requests,
            errors=len(run.errors),
            tokens_per_second=round(run.tokens / run.seconds, 3) if run.seconds > 0 else 0.0,
            p50_latency_seconds=round(percentile(run.latencies, 50), 4),
            p99_latency_seconds=round(percentile(run.latencies, 99), 4),
        )

    # ---- Prometheus ------------------------------------------------------------------------------

    @activity.defn(name=QUERY_GATES)
    def query_gates(self, req: GateQueriesInput) -> GateQueriesResult:
        """Render every template first (fail fast on bad input), then run each as an instant query."""
        rendered = {name: render(name, template, req.variables) for name, template in req.queries.items()}
        return GateQueriesResult(values={name: self.prometheus.value(name, promql) for name, promql in rendered.items()})

    # ---- quality gates (issue 21; pure verdicts in workflows/rollout/quality.py) --------------------

    @activity.defn(name=RUN_GOLDEN_SET)
    def run_golden_set(self, req: GoldenRunInput) -> GoldenRunResult:
        """Every case to the new version's and stable's own Services (temperature 0, so a version
        answers a prompt the same way each time), graded here (JSON Schema needs ``jsonschema``)."""
        golden = req.golden
        bodies = [
            {"prompt": case.prompt, "max_tokens": case.max_tokens or golden.max_tokens, "temperature": 0, "model": req.model}
            for case in golden.cases
        ]
        versions = [req.version] + ([req.stable_version] if req.stable_version else [])
        graded: list[list[CaseResult]] = []
        for version in versions:
            url = self.service_url(req.deployment, version)
            answers = self.vllm.answers(url, bodies, lambda done: activity.heartbeat({"version": version, "done": done}))
            results = []
            for case, (text, error) in zip(golden.cases, answers):
                if text is None:
                    results.append(CaseResult(id=case.id, passed=False, failures=[f"request failed: {error}"]))
                else:
                    results.append(grade(case, text, schema_problem))
            graded.append(results)
        return GoldenRunResult(new=graded[0], stable=graded[1] if len(graded) > 1 else None)

    @activity.defn(name=READ_SHADOW_PAIRS)
    def read_shadow_pairs(self, req: ShadowPairsInput) -> ShadowPairsResult:
        """Pairs recorded for the route since ``after`` in which the canary is ``version`` and the
        user's answer came from ``stable_version`` (others, e.g. of an earlier rollout, skipped)."""
        if self.shadow.url_template is None:
            raise ApplicationError(
                "shadow comparison asked for, but TIDEPLANE_SHADOW_PAIRS_URL is not set (where mirrored answers are recorded)",
                type="ShadowNotConfigured",
                non_retryable=True,
            )
        ref = req.deployment
        try:
            doc = self.shadow.pairs(ref.namespace, ref.name, req.after)
        except httpx.HTTPError as exc:
            raise ApplicationError(f"reading shadow pairs of {ref}: {exc!r}") from exc
        pairs = [
            ShadowPair(seq=p["seq"], prompt=p["prompt"], stable_answer=p["stable_answer"], canary_answer=p["canary_answer"])
            for p in doc.get("pairs", [])
            if p.get("canary_version") == req.version and p.get("stable_version") == req.stable_version
        ]
        return ShadowPairsResult(pairs=pairs, last=int(doc.get("last", req.after)))


DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def mark_deletion_costs(kube: KubeClient, namespace: str, pods_selector: str) -> None:
    """Before a scale-down: each replica's pod-deletion-cost is the number of other model pods on
    its node, so the ReplicaSet controller removes replicas from the least-loaded nodes first and
    those nodes empty (to be removed, or stopped back into a warm pool). Deletion itself drains: the
    pod leaves the endpoints, then the server finishes what it accepted (preStop, grace period)."""
    pods = [p for p in kube.core.list_namespaced_pod(namespace, label_selector=pods_selector, _request_timeout=API_TIMEOUT).items
            if p.metadata.deletion_timestamp is None]
    if len(pods) < 2:
        return
    on_node: dict[str, int] = {}
    for p in kube.core.list_pod_for_all_namespaces(label_selector=naming.LABEL_MODEL, _request_timeout=API_TIMEOUT).items:
        if p.spec.node_name and p.metadata.deletion_timestamp is None:
            on_node[p.spec.node_name] = on_node.get(p.spec.node_name, 0) + 1
    for p in pods:
        cost = str(on_node.get(p.spec.node_name, 1) - 1) if p.spec.node_name else "0"
        if (p.metadata.annotations or {}).get(DELETION_COST) == cost:
            continue
        try:
            kube.core.patch_namespaced_pod(
                p.metadata.name, namespace, {"metadata": {"annotations": {DELETION_COST: cost}}}, _request_timeout=API_TIMEOUT
            )
        except ApiException as exc:
            if exc.status != 404:  # gone meanwhile: nothing to rank
                fail(exc, f"pod {namespace}/{p.metadata.name}: deletion cost")


# ---- manifests (pure) ------------------------------------------------------------------------------


def _tracing_env(req: EnsureVersionInput, object_name: str, pods: ServingPods) -> dict[str, str]:
    """OpenTelemetry resource identity for the serving pods, and the exporter when one is set."""
    env = {
        "OTEL_SERVICE_NAME": req.deployment.name,
        "OTEL_RESOURCE_ATTRIBUTES": (
            f"service.version={req.version},k8s.namespace.name={req.deployment.namespace},"
            f"k8s.deployment.name={object_name},tideplane.model={req.model}"
        ),
    }
    if pods.otlp_traces_endpoint:
        env |= {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": pods.otlp_traces_endpoint,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(pods.trace_sample_ratio),
        }
    return env


def image_allowed(image: str, prefixes: Collection[str]) -> bool:
    """Whether ``image`` names a repository under one of ``prefixes``, both as the container runtime
    resolves them (``vllm/vllm-openai:v0.6.3`` is ``docker.io/vllm/vllm-openai:v0.6.3``), a prefix
    ending at a path, tag or digest boundary (``docker.io/vllm`` does not admit ``docker.io/vllmx``)."""
    name = canonical_image(image)
    for prefix in prefixes:
        wanted = canonical_image(prefix.rstrip("/")) if prefix.rstrip("/") else ""
        if wanted and (name == wanted or name.startswith(wanted) and name[len(wanted)] in "/:@"):
            return True
    return False


def canonical_image(image: str) -> str:
    """An image reference with its registry: Docker Hub names gain ``docker.io/`` (and ``library/``)."""
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if slash else f"docker.io/library/{image}"


# Serving containers run unprivileged: no root, no privilege escalation, no capabilities, the
# runtime's default seccomp profile (the Kubernetes "restricted" Pod Security Standard).
SERVING_USER = 1000
CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": SERVING_USER,
    "runAsGroup": SERVING_USER,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _env_var(name: str, value: str | contract.EnvFromSecret) -> dict:
    if isinstance(value, str):
        return {"name": name, "value": value}
    return {"name": name, "valueFrom": value.valueFrom.model_dump()}


def _cache_volume(pods: ServingPods) -> dict:
    if pods.model_cache_pvc:
        return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": pods.model_cache_pvc, "readOnly": True}}
    return {"name": CACHE_VOLUME, "hostPath": {"path": str(pods.model_cache_dir), "type": "Directory"}}


def engine_cache_path(pods: ServingPods, model: str, version: str) -> Path | None:
    """The version's own engine cache directory on the node (None: no engine cache)."""
    if pods.engine_cache_dir is None:
        return None
    return pods.engine_cache_dir / _safe_component(model, "model") / _safe_component(version, "version")


def deployment_manifest(req: EnsureVersionInput, pods: ServingPods) -> dict:
    """The Deployment serving one version: vLLM-style args, GPUs, readiness, the weights read-only,
    and, on GPUs, the priority class's node selector (realtime on on-demand, batch on spot).

    With an engine cache, VLLM_CACHE_ROOT is the version's own directory on the node (hostPath,
    created if missing): the only writable mount, so a version's compile cache is reused by the
    next replica on that node and no version can write another's cache or the weights."""
    name = req.deployment.versioned(req.version)
    labels = {
        **selector(req.deployment.name, req.version),
        naming.LABEL_MODEL: req.model,
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
        naming.LABEL_CLASS: req.priority_class,
    }
    node_version = node_cache_version_dir(req, pods)
    weights = str(node_version) if node_version is not None else req.weights_path
    args = ["--model", weights, "--served-model-name", req.model, "--port", str(req.port)]
    if req.gpu_memory_utilization is not None:
        args += [GPU_MEMORY_UTILIZATION_FLAG, f"{req.gpu_memory_utilization:g}"]
    if pods.otlp_traces_endpoint:
        args += ["--otlp-traces-endpoint", pods.otlp_traces_endpoint]
    env = _tracing_env(req, name, pods) | req.env
    engine_cache = engine_cache_path(pods, req.model, req.version)
    if engine_cache is not None:
        env[ENGINE_CACHE_ENV] = str(engine_cache)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": req.image,
        "args": args + req.args,
        "ports": [{"name": "http", "containerPort": req.port, "protocol": "TCP"}],
        "env": [_env_var(k, v) for k, v in sorted(env.items())],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": str(pods.model_cache_dir), "readOnly": True}],
        "securityContext": CONTAINER_SECURITY,
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
    }
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": DRAIN_GRACE_SECONDS,
        "securityContext": POD_SECURITY,
        "containers": [container],
        "volumes": [_cache_volume(pods)],
    }
    if engine_cache is not None:
        container["volumeMounts"].append({"name": ENGINE_CACHE_VOLUME, "mountPath": str(engine_cache)})
        pod_spec["volumes"].append({"name": ENGINE_CACHE_VOLUME, "hostPath": {"path": str(engine_cache), "type": "DirectoryOrCreate"}})
    if node_version is not None:
        _read_from_node_cache(req, pods.node_cache_dir, pods.node_cache_image, pod_spec, node_version)
    if req.gpus_per_replica:
        # a share of one GPU (time-slicing replicas, workflows/scaling/gpu_sharing.py), or whole GPUs
        gpus = {SHARED_GPU_RESOURCE: "1"} if req.gpu_memory_utilization is not None else {naming.GPU_RESOURCE: str(req.gpus_per_replica)}
        container["resources"] = {"limits": gpus, "requests": dict(gpus)}
        # The priority class picks the GPU capacity type: realtime on on-demand nodes, batch on spot.
        pod_spec["nodeSelector"] = node_selector(req.priority_class)
        pod_spec["tolerations"] = [
            *tolerations(req.priority_class),
            {"key": naming.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": req.deployment.namespace, "labels": labels},
        "spec": {
            "replicas": req.replicas,
            "selector": {"matchLabels": selector(req.deployment.name, req.version)},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def node_cache_version_dir(req: EnsureVersionInput, pods: ServingPods) -> Path | None:
    """Where the version's files are in every node's cache, when its pods read it there (the rollout
    pre-staged it and the worker knows the cache); None: they read the shared model cache."""
    if not req.node_cache_files or pods.node_cache_dir is None:
        return None
    return NodeCache(pods.node_cache_dir).version_dir(_safe_component(req.model, "model"), _safe_component(req.version, "version"))


def _read_from_node_cache(req: EnsureVersionInput, cache_dir: Path, image: str, pod_spec: dict, version_dir: Path) -> None:
    """The server loads the version from its node's cache, mounted read-only; the pod prefers nodes
    labelled as holding it, and on any other node (a new one, or one that evicted it) an init
    container runs the node staging code first (``node-cache stage``: S3, each chunk verified; chunks
    the node holds for other versions are linked, not fetched), so the pod starts either way."""
    node = "$(NODE_NAME)"  # the kubelet expands it from the init container's env
    request = NodeStageRequest(model=req.model, version=req.version, files=req.node_cache_files, node=node, stagers=[node])
    pod_spec["initContainers"] = [{
        "name": STAGE_INIT_CONTAINER,
        "image": image,
        "args": ["node-cache", "stage", "--request", request.model_dump_json()],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "TIDEPLANE_NODE_CACHE_DIR", "value": str(cache_dir)}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": NODE_CACHE_VOLUME, "mountPath": str(cache_dir)}],
    }]
    pod_spec["containers"][0]["volumeMounts"].append({"name": NODE_VERSION_VOLUME, "mountPath": str(version_dir), "readOnly": True})
    pod_spec["volumes"] += [
        {"name": NODE_CACHE_VOLUME, "hostPath": {"path": str(cache_dir), "type": "DirectoryOrCreate"}},
        {"name": NODE_VERSION_VOLUME, "hostPath": {"path": str(version_dir), "type": "DirectoryOrCreate"}},
    ]
    pod_spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "preference": {"matchExpressions": [{"key": cached_version_label(req.model, req.version), "operator": "In", "values": ["true"]}]},
    }]}}


def service_manifest(req: EnsureVersionInput) -> dict:
    name = req.deployment.versioned(req.version)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": req.deployment.namespace,
            "labels": {**selector(req.deployment.name, req.version), naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
        },
        "spec": {
            "selector": selector(req.deployment.name, req.version),
            "ports": [{"name": "http", "port": req.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }



def read_route(kube: KubeClient, ref: DeploymentRef) -> dict | None:
    """The logical deployment's HTTPRoute (None: not created yet)."""
    return read_or_none(kube.custom.get_namespaced_custom_object, *ROUTE_API, ref.namespace, "httproutes", ref.name)


def list_routes(kube: KubeClient, namespace: str | None = None) -> list[dict]:
    """Every HTTPRoute in ``namespace`` (None: all namespaces); ApiException as the client raises it."""
    if namespace is None:
        return kube.custom.list_cluster_custom_object(*ROUTE_API, "httproutes", _request_timeout=API_TIMEOUT)["items"]
    return kube.custom.list_namespaced_custom_object(
        *ROUTE_API, namespace, "httproutes", _request_timeout=API_TIMEOUT
    )["items"]


def deployment_state(kube: KubeClient, ref: DeploymentRef) -> DeploymentState:
    """The versions of a logical deployment in the cluster, their replicas and route weights
    (``describe_deployment``; the scaling loop's ``get_scale`` reads the same)."""
    kube.require_namespace(ref.namespace)
    deployments = kube.apps.list_namespaced_deployment(
        ref.namespace, label_selector=label_selector(selector(ref.name)), _request_timeout=API_TIMEOUT
    ).items
    route = read_route(kube, ref)
    weights = _route_weights(route)
    versions = []
    for dep in sorted(deployments, key=lambda d: d.metadata.name):
        labels = dep.metadata.labels or {}
        version = labels.get(naming.LABEL_VERSION)
        if version is None:
            continue
        versions.append(
            VersionInfo(
                version=version,
                model=labels.get(naming.LABEL_MODEL, ""),
                replicas=dep.spec.replicas or 0,
                ready_replicas=(dep.status.ready_replicas if dep.status else None) or 0,
                route_weight=weights.get(dep.metadata.name, 0),  # the name the cluster holds
                lora_modules=lora_modules(getattr(container_named(dep.spec.template.spec.containers, CONTAINER), "args", None) or []),
            )
        )
    return DeploymentState(route_exists=route is not None, versions=versions)


def owned_elsewhere(what: str, held: str, owner: str) -> ApplicationError:
    """The non-retryable refusal when another workflow owns a deployment's objects."""
    return ApplicationError(
        f"{what} is owned by {held} ({naming.ANNOTATION_OWNER}); {owner} refused: one rollout and one scaling loop"
        f" per deployment. Stop {held}, or remove the annotation if that workflow is gone",
        type=OWNED_ELSEWHERE,
        non_retryable=True,
    )


def _require_same_version(current, body: dict) -> None:
    """Never rewrite another version's Deployment: the object's version label must be ours."""
    held = (current.metadata.labels or {}).get(naming.LABEL_VERSION)
    wanted = body["metadata"]["labels"][naming.LABEL_VERSION]
    if held is not None and held != wanted:
        meta = body["metadata"]
        raise ApplicationError(
            f"version {wanted}: Deployment {meta['namespace']}/{meta['name']} already serves version {held}",
            type="NameCollision",
            non_retryable=True,
        )


def _route_weights(route: dict | None) -> dict[str, int]:
    """Service name -> weight in the route's first rule (the rule tideplane manages)."""
    rules = (route or {}).get("spec", {}).get("rules") or []
    refs = rules[0].get("backendRefs", []) if rules else []
    return {r["name"]: int(r.get("weight", 1)) for r in refs}


def _waiting_reason(pod) -> str:
    """Why a pod is not Ready yet, as an operator would want to read it in the UI."""
    status = pod.status
    for cond in (status.conditions if status else None) or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"{pod.metadata.name}: {cond.reason or 'Pending'}: {cond.message or ''}".rstrip(": ")
    phase = (status.phase if status else None) or "Pending"
    return f"{pod.metadata.name}: {phase}, not Ready"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# ---- staging helpers --------------------------------------------------------------------------------


def _safe_component(value: str, field: str) -> str:
    if not value or value in {".", ".."} or "/" in value or "\\" in value:
        raise ApplicationError(f"{field} {value!r} cannot be a directory name in the model cache", non_retryable=True)
    return value


class _Progress:
    """Bytes staged across all files, reported as heartbeat details (survive into the next attempt)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.resumed = 0
        self.files: dict[str, int] = {}

    def advance(self, uri: str, offset: int, nbytes: int) -> None:
        self.done += nbytes
        self.files[uri] = offset
        activity.heartbeat({"bytes_done": self.done, "bytes_total": self.total, "verified": self.files})


@contextlib.contextmanager
def _staging_lock(directory: Path):
    """One attempt at a time per version: an attempt Temporal timed out may still be writing."""
    with (directory.parent / f".{directory.name}.staging.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ApplicationError(f"{directory} is being staged by another attempt; retrying later") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# ---- quality gates (issue 21) -------------------------------------------------------------------


def schema_problem(instance: object, schema: dict) -> str | None:
    """JSON Schema validation for quality.grade: the first error's message and path, or None."""
    try:
        jsonschema.validate(instance, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"{exc.message}" + (f" at /{where}" if where else "")
    except jsonschema.SchemaError as exc:
        return f"the golden set's schema is invalid: {exc.message}"
    return None


class RetireScheduling(contract.RetireScheduling):
    """Starts and cancels RetireVersion workflows with the worker's Temporal client
    (``activity.client()``), on the worker's own task queue."""

    @activity.defn(name=SCHEDULE_RETIRE)
    async def schedule_retire(self, req: RetireInput) -> str:
        retire_id = retire_workflow_id(req.deployment, req.version)
        try:
            await activity.client().start_workflow(
                RetireVersion.run,
                req,
                id=retire_id,
                task_queue=activity.info().task_queue,
                static_summary=f"Scale {req.version} of {req.deployment} to 0 after {req.delay_seconds:.0f}s",
            )
        except WorkflowAlreadyStartedError:
            return f"{retire_id} already pending"  # an earlier start (or attempt) of the same scale-down
        return f"{retire_id} started"

    @activity.defn(name=CANCEL_RETIRE)
    async def cancel_retire(self, req: CancelRetireInput) -> str:
        retire_id = retire_workflow_id(req.deployment, req.version)
        handle = activity.client().get_workflow_handle(retire_id)
        try:
            await handle.cancel()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return f"{retire_id}: none pending"  # never started, or already ended
        # Wait until it ended, so no scale-down of this version lands after the caller goes on.
        try:
            await handle.result()
        except WorkflowFailureError:
            pass  # cancelled, as asked
        return f"{retire_id} cancelled"


def mirror_filter(req: RouteWeightsInput) -> dict | None:
    """The Gateway API RequestMirror filter for ``req.mirror`` (percent needs Gateway API >= 1.2)."""
    if req.mirror is None:
        return None
    if req.mirror.version not in req.weights:
        raise ApplicationError(
            f"mirror.version: {req.mirror.version} is not one of the route's versions {sorted(req.weights)}",
            non_retryable=True,
        )
    service = req.deployment.versioned(req.mirror.version)
    return {
        "type": MIRROR_FILTER,
        "requestMirror": {
            "backendRef": {"group": "", "kind": "Service", "name": service, "port": req.port},
            "percent": req.mirror.percent,
        },
    }


def with_mirror(filters: list[dict], mirror: dict | None, services: set[str]) -> list[dict]:
    """The rule's filters with tideplane's mirror set (or removed): a mirror to one of ``services``
    (the deployment's versions) is tideplane's; other filters are kept as they are."""

    def ours(item: dict) -> bool:
        target = ((item.get("requestMirror") or {}).get("backendRef") or {}).get("name")
        return item.get("type") == MIRROR_FILTER and target in services

    kept = [f for f in filters if not ours(f)]
    return [*kept, mirror] if mirror else kept
