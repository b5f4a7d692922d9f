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

import math
import time
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Collection

from botocore.exceptions import ClientError
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode

from activities.clients.kube import (
    API_TIMEOUT,
    KubeClient,
    apply_service,
    fail,
    gateway_parent_ref,
    is_ready,
    label_selector,
    read_or_none,
    retry_on_conflict,
    selector,
)
from activities.clients.prometheus import PrometheusClient, render, scalar
from activities.clients.s3 import (
    NOT_FOUND,
    BucketNotAllowed,
    ObjectChanged,
    S3Client,
    error_code,
    parse_s3_uri,
    require_allowed_bucket,
)
from activities.clients.vllm import VllmClient, service_url
from activities.core.deployments import (
    ROUTE_API,
    deployment_state,
    edit_route_rules,
    owned_elsewhere,
    read_route,
    scale_down_spot_mix,
)
from activities.core.workflow_signals import WorkflowSignals
from activities.core.verified_file import ChecksumMismatch, already_verified, discard_partial, fetch_verified
from activities.rollout.mirror import mirror_filter, with_mirror
from activities.rollout.model_cache import StagingProgress, safe_component, staging_lock
from activities.rollout.serving_pods import (
    ServingPods,
    deployment_manifest,
    image_allowed,
    image_pinning_problem,
    mark_deletion_costs,
    service_manifest,
)
from workflows.core import naming, telemetry
from workflows.core.bounds import MAX_GPUS_PER_REPLICA, MAX_REPLICAS
from workflows.core.lora import adapters_on, moved_adapter_rules
from workflows.core.routes import inference_matches, only_inference
from workflows.core.naming import DeploymentRef
from workflows.core.search_attributes import CLI_TYPES
from workflows.core.transfer import DownloadProgress
from workflows.core.versions import DeploymentState, WeightFile
from workflows.rollout import contract
from workflows.rollout.contract import (
    DESCRIBE_DEPLOYMENT,
    ENSURE_VERSION,
    MOVE_ADAPTER_RULES,
    QUERY_GATES,
    SCALE_VERSION,
    SET_ROUTE_WEIGHTS,
    STAGE_WEIGHTS,
    STAGING_PROGRESS,
    WAIT_READY,
    WARM_UP,
    Benchmark,
    EnsureVersionInput,
    GateQueriesInput,
    GateQueriesResult,
    MoveAdapterRulesInput,
    ReadyResult,
    RouteWeightsInput,
    ScaleVersionInput,
    StagedWeights,
    StageWeightsInput,
    WaitReadyInput,
    WarmUpInput,
)



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
        image_prefixes: Collection[str] | None = None,
        image_pinning: str = "tag",
        max_replicas: int = MAX_REPLICAS,
        max_gpus_per_replica: int = MAX_GPUS_PER_REPLICA,
        signals: WorkflowSignals | None = None,
    ) -> None:
        """``weights_buckets``: the buckets weights may be staged from (None: any); ``image_prefixes``:
        the registries/repositories serving images may come from (None: any); ``signals``: how
        stage_weights tells its rollout of its progress (None: heartbeats only)."""
        self.image_prefixes = image_prefixes
        self.image_pinning = image_pinning
        self.max_replicas = max_replicas  # the cluster's maxima (TIDEPLANE_MAX_REPLICAS, ..._GPUS_PER_REPLICA)
        self.max_gpus_per_replica = max_gpus_per_replica
        self.weights_buckets = weights_buckets
        self.kube = kube
        self.s3 = s3
        self.prometheus = prometheus
        self.vllm = vllm
        self.pods = pods
        self.gateway = gateway  # "NAMESPACE/NAME" or "NAME" (then in the route's namespace)
        self.service_url_template = service_url_template
        self.signals = signals

    # ---- Temporal ---------------------------------------------------------------------------------

    @activity.defn(name=contract.CHECK_SEARCH_ATTRIBUTES)
    async def check_search_attributes(self) -> list[str]:
        namespace = activity.info().workflow_namespace
        try:
            listed = await activity.client().operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
        except RPCError as exc:
            # Temporal's test server lists none; a key without operator rights may not list them:
            # then the upsert itself is the check.
            if exc.status in (RPCStatusCode.UNIMPLEMENTED, RPCStatusCode.PERMISSION_DENIED):
                return []
            raise
        return [name for name in CLI_TYPES if name not in listed.custom_attributes]

    # ---- S3 -> model cache ----------------------------------------------------------------------

    @activity.defn(name=STAGE_WEIGHTS)
    def stage_weights(self, req: StageWeightsInput) -> StagedWeights:
        """Download and verify every weights file into ``<model_cache_dir>/<model>/<version>/``."""
        started = time.monotonic()
        if req.image is not None:
            self._require_allowed_image(req.image)
        directory = self.pods.model_cache_dir / safe_component(req.model, "model") / safe_component(req.version, "version")
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
        progress = StagingProgress(total, self._progress_report(req))
        directory.mkdir(parents=True, exist_ok=True)
        with staging_lock(directory):
            for name, wf in targets.items():
                if staged[name] is not None:
                    progress.resumed += staged[name]
                    progress.advance(wf.uri, staged[name], 0)
                    continue
                self._stage_file(wf, directory / name, heads[name], progress)
        return StagedWeights(
            path=str(directory), size_bytes=total, resumed_bytes=progress.resumed, seconds=time.monotonic() - started
        )

    def _progress_report(self, req: StageWeightsInput) -> Callable[[DownloadProgress], None] | None:
        """Where the download's progress goes besides the heartbeat: the calling rollout, as a signal."""
        if not req.report_progress or self.signals is None:
            return None
        info, send = activity.info(), self.signals.send
        return lambda progress: send(info.workflow_id, info.workflow_run_id, STAGING_PROGRESS, progress)

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

    def _stage_file(self, wf: WeightFile, dest: Path, head: dict, progress: StagingProgress) -> None:
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
        if (problem := image_pinning_problem(image, self.image_pinning)) is not None:
            raise ApplicationError(problem, type="ImageNotPinned", non_retryable=True)
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
        marks which replicas go (``mark_deletion_costs``). To 0 (a retirement) it also takes the
        version's spot mix down, every pool and the on-demand base (``scale_down_spot_mix``)."""
        self._require_within_cluster(req.replicas)
        self.kube.require_namespace(req.deployment.namespace)
        name = req.deployment.versioned(req.version)
        if req.replicas == 0:
            scale_down_spot_mix(self.kube, req.deployment, req.version)
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

        ``stable`` is recorded on the route (``tideplane.io/stable-version``): which version is
        stable is the rollout's record, read back by ``deployment_state``, never a sort order.
        Versions at weight 0 stay listed so the next step can re-weight them; the route is created
        (attached to the gateway) when missing. Read-modify-replace keeps the rule's matches and
        filters, and the resourceVersion makes a concurrent edit a retried conflict, not a loss.
        The weights set are recorded as ``tideplane_rollout_weight`` (the rollouts dashboard).
        """
        if not req.weights or any(not 0 <= w <= 100 for w in req.weights.values()) or sum(req.weights.values()) != 100:
            raise ApplicationError(f"route weights must be 0..100 and sum to 100, got {req.weights}", non_retryable=True)
        if req.stable is not None and not req.weights.get(req.stable):
            raise ApplicationError(f"stable: version {req.stable} gets no traffic in {req.weights}", non_retryable=True)
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
                        **({"annotations": {naming.ANNOTATION_STABLE_VERSION: req.stable}} if req.stable else {}),
                    },
                    "spec": {
                        "parentRefs": [gateway_parent_ref(self.gateway, ref.namespace)],
                        "rules": [{"matches": inference_matches(), "backendRefs": backends, **({"filters": [mirror]} if mirror else {})}],
                    },
                }
                custom.create_namespaced_custom_object(*ROUTE_API, ref.namespace, "httproutes", body, _request_timeout=API_TIMEOUT)
                return
            rules = route.setdefault("spec", {}).setdefault("rules", [])
            if not rules:
                rules.append({})
            filters = with_mirror(rules[0].get("filters") or [], mirror, {b["name"] for b in backends})
            annotations = route["metadata"].get("annotations") or {}
            recorded = req.stable is None or annotations.get(naming.ANNOTATION_STABLE_VERSION) == req.stable
            closed = only_inference(rules[0].get("matches"))  # a route of before issue 33 let every path through
            if rules[0].get("backendRefs") == backends and (rules[0].get("filters") or []) == filters and recorded and closed:
                return
            if not closed:
                rules[0]["matches"] = inference_matches()
            if not recorded:
                route["metadata"]["annotations"] = {**annotations, naming.ANNOTATION_STABLE_VERSION: req.stable}
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

    @activity.defn(name=MOVE_ADAPTER_RULES)
    def move_adapter_rules(self, req: MoveAdapterRulesInput) -> list[str]:
        """The adapter rules on the old version's Service follow the promoted one (workflows/core/lora.py)."""
        ref = req.deployment
        old, new = ref.versioned(req.from_version), req.to_version and ref.versioned(req.to_version)
        moved: list[str] = []

        def move(rules: list[dict]) -> list[dict]:
            moved[:] = adapters_on(rules, old)
            return moved_adapter_rules(rules, old, new)

        edit_route_rules(self.kube, ref, move, must_exist=False)
        return moved

    # ---- the new version's endpoint ---------------------------------------------------------------

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
        url = service_url(self.service_url_template, req.deployment, req.version)
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
        results = {name: self.prometheus.instant(name, promql) for name, promql in rendered.items()}
        return GateQueriesResult(
            values={name: scalar(name, result) for name, result in results.items()},
            no_series=[name for name, result in results.items() if not result],
        )


# ---- manifests (pure) ------------------------------------------------------------------------------


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


