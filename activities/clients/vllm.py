"""The OpenAI-compatible endpoint of one serving version (vLLM): completions sent straight to the
version's Service, several at a time, to warm it up and benchmark it before it gets traffic."""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

from workflows.core.naming import DeploymentRef

def service_url(template: str, ref: DeploymentRef, version: str) -> str:
    """Base URL of one version's OpenAI-compatible server, per the worker's ``service_url_template``."""
    return template.format(service=ref.versioned(version), namespace=ref.namespace).rstrip("/")


# A cold replica's first completions are slow (CUDA graphs, caches); 120 s read bounds a stuck one.
HTTP_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
CONCURRENCY = 4


@dataclass
class CompletionRun:
    """What ``requests`` completions gave: per success its latency, generated tokens, the errors."""

    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


ANSWER_ATTEMPTS = 5  # per golden-set prompt: a 25 %-error release still gets its answers judged


class VllmClient:
    """Completions against ``<base_url>/v1/completions``; one HTTP client per run, closed after it."""

    def __init__(self, timeout: httpx.Timeout = HTTP_TIMEOUT, concurrency: int = CONCURRENCY, api_key: str | None = None) -> None:
        """``api_key``: the engines' key (vLLM's --api-key / VLLM_API_KEY), sent as a bearer token."""
        self.timeout = timeout
        self.concurrency = concurrency
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def completions(
        self, base_url: str, body: dict, requests: int, progress: Callable[[int, int], object] = lambda done, errors: None,
        concurrency: int | None = None,
    ) -> CompletionRun:
        """Send ``body`` ``requests`` times, ``concurrency`` (default: the client's) in flight;
        ``progress(done, errors)`` after each (e.g. a heartbeat). A failed request (HTTP error,
        malformed body) is counted, not raised."""
        url = base_url.rstrip("/") + "/v1/completions"
        run = CompletionRun()

        def one(http: httpx.Client) -> tuple[float, int]:
            start = time.monotonic()
            resp = http.post(url, json=body)
            resp.raise_for_status()
            usage = resp.json().get("usage") or {}
            return time.monotonic() - start, int(usage.get("completion_tokens", 0))

        started = time.monotonic()
        in_flight = concurrency or self.concurrency
        limits = httpx.Limits(max_connections=max(in_flight, 10), max_keepalive_connections=max(in_flight, 10))
        with httpx.Client(timeout=self.timeout, limits=limits, headers=self.headers) as http, \
                concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
            futures = [pool.submit(one, http) for _ in range(requests)]
            for done, fut in enumerate(concurrent.futures.as_completed(futures), 1):
                try:
                    latency, tokens = fut.result()
                    run.latencies.append(latency)
                    run.tokens += tokens
                except (httpx.HTTPError, ValueError, TypeError, AttributeError) as exc:  # incl. a malformed body
                    run.errors.append(repr(exc))
                progress(done, len(run.errors))
        run.seconds = time.monotonic() - started
        return run

    def answers(
        self, base_url: str, bodies: list[dict], progress: Callable[[int], object] = lambda done: None
    ) -> list[tuple[str | None, str | None]]:
        """One completion per body (in order), ``concurrency`` in flight: (text, None), or
        (None, error) for a request that failed. ``progress(done)`` after each. A server error or a
        broken connection is asked again (up to ``ANSWER_ATTEMPTS``): these answers are judged for
        what they say, and a version's error rate is the canary's error-rate gate's to judge."""
        url = base_url.rstrip("/") + "/v1/completions"

        def one(http: httpx.Client, body: dict) -> tuple[str | None, str | None]:
            error = None
            for _ in range(ANSWER_ATTEMPTS):
                try:
                    resp = http.post(url, json=body)
                    resp.raise_for_status()
                    return str(resp.json()["choices"][0]["text"]), None
                except httpx.HTTPStatusError as exc:
                    error = repr(exc)
                    if exc.response.status_code < 500:
                        break
                except httpx.TransportError as exc:
                    error = repr(exc)
                except (ValueError, TypeError, KeyError, IndexError) as exc:
                    return None, repr(exc)
            return None, error

        with httpx.Client(timeout=self.timeout, headers=self.headers) as http, concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            futures = [pool.submit(one, http, body) for body in bodies]
            for done, _ in enumerate(concurrent.futures.as_completed(futures), 1):
                progress(done)
            return [f.result() for f in futures]
