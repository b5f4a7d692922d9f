"""Prometheus side of the rollout: run the canary's gate queries and return plain numbers.

Queries are templates (``string.Template``) so a user with another gateway edits a query, not
the code. A template or PromQL error is bad input (non-retryable); an unreachable or failing
Prometheus is retryable and typed ``MetricsUnavailable`` so the workflow can spend its metric
error budget and pause instead of deciding blind.
"""

from __future__ import annotations

import math
import string
import sys

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from workers import telemetry
from workers.config import settings
from workflows.rollout.activities import QUERY_GATES, GateQueriesInput, GateQueriesResult

HTTP_TIMEOUT = httpx.Timeout(10.0, connect=3.0)
QUERY_TIMEOUT = "8s"  # Prometheus' own evaluation limit, under the HTTP timeout


def render(name: str, template: str, variables: dict[str, str]) -> str:
    """Substitute ``${var}``; a missing variable or a malformed placeholder names the gate."""
    try:
        return string.Template(template).substitute(variables)
    except KeyError as exc:
        raise ApplicationError(
            f"gate {name!r}: template variable {exc.args[0]!r} is not set (have {sorted(variables)})", non_retryable=True
        ) from None
    except ValueError as exc:
        raise ApplicationError(f"gate {name!r}: bad template {template!r}: {exc}", non_retryable=True) from None


def scalar(name: str, data: dict) -> float | None:
    """The instant query's single number: first sample of a vector, or a scalar; no data/NaN -> None.

    ±Inf (e.g. a quantile that falls in the +Inf bucket) becomes ±float max: JSON, and so the
    workflow payload, cannot carry Inf, and None would wrongly read as "no data".
    """
    kind, result = data.get("resultType"), data.get("result")
    if kind == "vector":
        if not result:
            return None
        if len(result) > 1:
            activity.logger.warning("gate %r returned %d series; using the first", name, len(result))
        raw = result[0]["value"][1]
    elif kind == "scalar":
        raw = result[1]
    else:
        raise ApplicationError(f"gate {name!r}: expected a vector or scalar, got a {kind}", non_retryable=True)
    value = float(raw)
    if math.isnan(value):
        return None
    if math.isinf(value):
        return math.copysign(sys.float_info.max, value)
    return value


def api(http: httpx.Client, name: str, path: str, params: dict) -> dict:
    """GET one Prometheus API call's ``data``; a PromQL error is bad input (non-retryable),
    anything else that keeps an answer from coming is ``MetricsUnavailable`` (retryable)."""
    url = f"{settings().prometheus_url}{path}"
    try:
        resp = http.get(url, params={**params, "timeout": QUERY_TIMEOUT})
    except httpx.HTTPError as exc:
        telemetry.METRIC_QUERY_ERRORS.labels("prometheus", "unreachable").inc()
        raise ApplicationError(f"Prometheus at {url} unreachable: {exc!r}", type="MetricsUnavailable") from None
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if resp.status_code == 400 and body.get("errorType") == "bad_data":
        telemetry.METRIC_QUERY_ERRORS.labels("prometheus", "bad_query").inc()
        raise ApplicationError(f"query {name!r}: Prometheus rejected {params['query']!r}: {body.get('error')}", non_retryable=True)
    if resp.status_code != 200 or body.get("status") != "success":
        telemetry.METRIC_QUERY_ERRORS.labels("prometheus", f"http_{resp.status_code}").inc()
        detail = body.get("error") or resp.text[:200]
        raise ApplicationError(f"query {name!r}: Prometheus answered HTTP {resp.status_code}: {detail}", type="MetricsUnavailable")
    return body["data"]


def query(http: httpx.Client, name: str, promql: str) -> float | None:
    """An instant query reduced to one number (None: no data)."""
    return scalar(name, api(http, name, "/api/v1/query", {"query": promql}))


@activity.defn(name=QUERY_GATES)
def query_gates(req: GateQueriesInput) -> GateQueriesResult:
    """Render every template first (fail fast on bad input), then run each as an instant query."""
    rendered = {name: render(name, template, req.variables) for name, template in req.queries.items()}
    with httpx.Client(timeout=HTTP_TIMEOUT) as http:
        return GateQueriesResult(values={name: query(http, name, promql) for name, promql in rendered.items()})


ACTIVITIES = [query_gates]
