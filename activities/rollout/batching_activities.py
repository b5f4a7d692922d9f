"""Batching sweeps on the new version's own replicas (ModelRollout's warm-up).

Per candidate setting: the version's Deployment gets the setting's engine arguments and rolls
them out, completions of the deployment's request size are sent ``concurrency`` at a time, and
vLLM's own TTFT and TPOT histograms of the version's pods are read from Prometheus over the run
(what the canary gates read too). Production and the sandbox differ only in who serves the
endpoint: vLLM, or the sandbox's fleet simulator, which runs each pod's engine with its args.
"""

from __future__ import annotations

import math
import time

from temporalio import activity
from temporalio.exceptions import CancelledError

from activities.clients.kube import API_TIMEOUT, KubeClient, edit_container_args, is_ready, label_selector, selector
from activities.clients.prometheus import PrometheusClient
from activities.clients.vllm import VllmClient, service_url
from activities.core.deployments import CONTAINER
from workflows.core import engine_metrics
from workflows.core.batching_settings import BatchingSetting, SweepPoint, with_engine_args
from workflows.core.naming import DeploymentRef
from workflows.rollout import contract
from workflows.rollout.contract import (
    SET_ENGINE_ARGS,
    SWEEP_BATCHING,
    EngineArgsInput,
    SweepBatchingInput,
    SweepBatchingResult,
)

DEFAULT_PROMPT_TOKENS = 512  # a deployment with no recent traffic
DEFAULT_OUTPUT_TOKENS = 128
CHARS_PER_TOKEN = 4
SCRAPE_WAIT_S = 15.0  # longest wait for Prometheus to see a new pod before a run


class BatchingActivities(contract.BatchingActivities):
    """The sweep's activities over the worker's Kubernetes, Prometheus and vLLM clients."""

    def __init__(self, kube: KubeClient, prometheus: PrometheusClient, vllm: VllmClient, service_url_template: str) -> None:
        self.kube = kube
        self.prometheus = prometheus
        self.vllm = vllm
        self.service_url_template = service_url_template

    @activity.defn(name=SWEEP_BATCHING)
    def sweep_batching(self, req: SweepBatchingInput) -> SweepBatchingResult:
        """Measure every candidate in order; a retried attempt resumes after the points its
        heartbeats carried (each point costs a rollout of the pods and a load run)."""
        prompt_tokens, output_tokens = self._request_size(req)
        details = activity.info().heartbeat_details
        points = [SweepPoint.model_validate(p) for p in details[0]["points"]] if details else []
        url = service_url(self.service_url_template, req.deployment, req.version)
        body: dict = {"prompt": "tide " * (prompt_tokens * CHARS_PER_TOKEN // 5 + 1), "max_tokens": output_tokens, "temperature": 0}
        if req.model:
            body["model"] = req.model
        for setting in req.candidates[len(points):]:
            self._apply(req.deployment, req.version, setting)
            pods = self._wait_rolled_out(req.deployment, req.version, setting, 0.5, points)
            self._wait_scraped(req.deployment, pods)
            started = time.time()
            run = self.vllm.completions(
                url.rstrip("/"), body, req.requests,
                lambda done, errors: activity.heartbeat({"points": [p.model_dump() for p in points], "running": setting.label(), "done": done}),
                concurrency=req.concurrency,
            )
            activity.wait_for_cancelled_sync(req.settle_seconds)
            if activity.is_cancelled():
                raise CancelledError("sweep_batching cancelled")
            window = max(2, math.ceil(time.time() - started))
            points.append(SweepPoint(
                setting=setting,
                tokens_per_second=round(run.tokens / run.seconds, 3) if run.seconds > 0 else 0.0,
                ttft_p99_seconds=self._p99(engine_metrics.TIME_TO_FIRST_TOKEN.name, req.deployment, pods, window),
                tpot_p99_seconds=self._p99(engine_metrics.REQUEST_TIME_PER_OUTPUT_TOKEN.name, req.deployment, pods, window),
                requests=req.requests,
                errors=len(run.errors),
            ))
            activity.heartbeat({"points": [p.model_dump() for p in points]})
        return SweepBatchingResult(points=points, prompt_tokens=prompt_tokens, output_tokens=output_tokens)

    @activity.defn(name=SET_ENGINE_ARGS)
    def set_engine_args(self, req: EngineArgsInput) -> None:
        """Patch the args (no change when they are already there) and wait for every replica."""
        self._apply(req.deployment, req.version, req.setting)
        self._wait_rolled_out(req.deployment, req.version, req.setting, req.poll_seconds, [])

    # ---- the Deployment ---------------------------------------------------------------------------

    def _apply(self, ref: DeploymentRef, version: str, setting: BatchingSetting) -> None:
        """The serving container's args with the setting's batching arguments (others kept)."""
        edit_container_args(self.kube, ref.namespace, ref.versioned(version), CONTAINER, lambda args: with_engine_args(args, setting))

    def _wait_rolled_out(
        self, ref: DeploymentRef, version: str, setting: BatchingSetting, poll_s: float, points: list[SweepPoint]
    ) -> list[str]:
        """Until the Deployment's every replica runs its current template and the pods it replaced are
        gone (a point measured while one still drains would mix two settings); its Ready pods' names."""
        apps, core = self.kube.apps, self.kube.core
        name = ref.versioned(version)
        while True:
            dep = apps.read_namespaced_deployment(name, ref.namespace, _request_timeout=API_TIMEOUT)
            want, status = dep.spec.replicas or 0, dep.status
            pods = core.list_namespaced_pod(
                ref.namespace, label_selector=label_selector(selector(ref.name, version)), _request_timeout=API_TIMEOUT
            ).items
            done = (
                (status.observed_generation or 0) >= (dep.metadata.generation or 0)
                and (status.updated_replicas or 0) == want
                and (status.ready_replicas or 0) == want
                and len(pods) == want
                and all(is_ready(p) for p in pods)  # (a pod being deleted is not Ready)
            )
            if done:
                return sorted(p.metadata.name for p in pods)
            activity.heartbeat({"points": [p.model_dump() for p in points], "rolling_out": setting.label(),
                                "updated": status.updated_replicas or 0, "ready": status.ready_replicas or 0, "of": want})
            activity.wait_for_cancelled_sync(poll_s)
            if activity.is_cancelled():
                raise CancelledError(f"waiting for {name} to roll out cancelled")

    # ---- Prometheus -------------------------------------------------------------------------------

    def _request_size(self, req: SweepBatchingInput) -> tuple[int, int]:
        """The sweep's (prompt, output) tokens: given, else the deployment's means over the last hour."""
        if req.prompt_tokens is not None:
            return req.prompt_tokens, req.output_tokens or req.prompt_tokens
        where = f'namespace="{req.deployment.namespace}",deployment="{req.deployment.name}"'
        finished = f"sum(increase(vllm:request_success_total{{{where}}}[1h]))"
        prompt = self.prometheus.value("traffic prompt tokens", f"sum(increase(vllm:prompt_tokens_total{{{where}}}[1h])) / {finished}")
        output = self.prometheus.value("traffic output tokens", f"sum(increase(vllm:generation_tokens_total{{{where}}}[1h])) / {finished}")
        usable = lambda v: v is not None and math.isfinite(v) and v >= 1  # noqa: E731
        return (
            round(prompt) if usable(prompt) else DEFAULT_PROMPT_TOKENS,
            req.output_tokens or (round(output) if usable(output) else DEFAULT_OUTPUT_TOKENS),
        )

    def _wait_scraped(self, ref: DeploymentRef, pods: list[str]) -> None:
        """Until Prometheus has a sample of every pod, so the run's increase starts from them."""
        query = f'count(vllm:num_requests_running{{{_pods(ref, pods)}}})'
        deadline = time.monotonic() + SCRAPE_WAIT_S
        while (self.prometheus.value("sweep pods scraped", query) or 0) < len(pods) and time.monotonic() < deadline:
            activity.wait_for_cancelled_sync(0.5)
            if activity.is_cancelled():
                raise CancelledError("sweep_batching cancelled")

    def _p99(self, histogram: str, ref: DeploymentRef, pods: list[str], window_s: int) -> float | None:
        promql = f"histogram_quantile(0.99, sum by (le) (increase({histogram}_bucket{{{_pods(ref, pods)}}}[{window_s}s])))"
        value = self.prometheus.value(f"sweep {histogram} p99", promql)
        return round(value, 4) if value is not None and math.isfinite(value) else None


def _pods(ref: DeploymentRef, pods: list[str]) -> str:
    return f'namespace="{ref.namespace}",pod=~"{"|".join(pods)}"'
