"""The new version's own endpoint: warm it up and take a small benchmark before it gets traffic.

Requests go straight to the version's Service (not through the HTTPRoute), so the benchmark
measures the new version alone and users never see a cold replica.
"""

from __future__ import annotations

import concurrent.futures
import math
import time

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from workers.config import settings
from workflows import naming
from workflows.rollout.activities import WARM_UP, Benchmark, WarmUpInput

# A cold replica's first completions are slow (CUDA graphs, caches); 120 s read bounds a stuck one.
HTTP_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
CONCURRENCY = 4


def service_url(namespace: str, name: str, version: str) -> str:
    """Base URL of one version's OpenAI-compatible server, per settings().service_url_template."""
    service = naming.versioned_name(name, version)
    return settings().service_url_template.format(service=service, namespace=namespace).rstrip("/")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@activity.defn(name=WARM_UP)
def warm_up(req: WarmUpInput) -> Benchmark:
    """Send ``requests`` completions; tokens/s is generated tokens over the wall time of the run.

    Raises (retryable) when every request failed: a benchmark of nothing is not a result.
    """
    url = service_url(req.deployment.namespace, req.deployment.name, req.version) + "/v1/completions"
    body = {"prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0}
    if req.model:
        body["model"] = req.model
    latencies: list[float] = []
    tokens = 0
    errors: list[str] = []

    def one(http: httpx.Client) -> tuple[float, int]:
        start = time.monotonic()
        resp = http.post(url, json=body)
        resp.raise_for_status()
        usage = resp.json().get("usage") or {}
        return time.monotonic() - start, int(usage.get("completion_tokens", 0))

    started = time.monotonic()
    with httpx.Client(timeout=HTTP_TIMEOUT) as http, concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        futures = [pool.submit(one, http) for _ in range(req.requests)]
        for done, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            try:
                latency, n = fut.result()
                latencies.append(latency)
                tokens += n
            except (httpx.HTTPError, ValueError, TypeError, AttributeError) as exc:  # incl. a malformed body
                errors.append(repr(exc))
            activity.heartbeat({"done": done, "of": req.requests, "errors": len(errors)})
    elapsed = time.monotonic() - started
    if not latencies:
        raise ApplicationError(f"warm-up: all {req.requests} requests to {url} failed; last: {errors[-1]}")
    if errors:
        activity.logger.warning("warm-up of %s: %d/%d requests failed, e.g. %s", url, len(errors), req.requests, errors[0])
    return Benchmark(
        requests=req.requests,
        errors=len(errors),
        tokens_per_second=round(tokens / elapsed, 3) if elapsed > 0 else 0.0,
        p50_latency_seconds=round(percentile(latencies, 50), 4),
        p99_latency_seconds=round(percentile(latencies, 99), 4),
    )


ACTIVITIES = [warm_up]
