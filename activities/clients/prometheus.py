"""Prometheus: instant and range queries through prometheus-api-client's PrometheusConnect.

A PromQL error is bad input (non-retryable ApplicationError); anything else that keeps an answer
from coming (unreachable, 5xx) is retryable and typed ``MetricsUnavailable`` so a workflow can
spend its metric error budget instead of deciding blind. Every such error is counted in
``tideplane_metric_query_errors_total`` (the activity's metric meter).
Query templates are ``string.Template`` so a user with another gateway edits a query, not code.
"""

from __future__ import annotations

import ast
import json
import math
import re
import string
import sys
from datetime import datetime, timezone
from typing import Any, Callable

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from temporalio import activity
from temporalio.common import MetricMeter
from temporalio.exceptions import ApplicationError
from urllib3.util.retry import Retry

from workflows.core import telemetry

HTTP_TIMEOUT = (3.0, 10.0)  # (connect, read) seconds
QUERY_TIMEOUT = "8s"  # Prometheus' own evaluation limit, under the HTTP timeout
_STATUS = re.compile(r"HTTP Status Code (\d+) \((.*)\)$", re.S)


def render(name: str, template: str, variables: dict[str, str]) -> str:
    """Substitute ``${var}``; a missing variable or a malformed placeholder names the query.

    Values are escaped as PromQL string contents (``\\`` and ``"``), so a value inside a label
    matcher can never end the string and add to the query; windows, which go inside ``[...]``,
    arrive rendered from numbers (workflows.core.bounds.render_window).
    """
    escaped = {key: str(value).replace("\\", "\\\\").replace('"', '\\"') for key, value in variables.items()}
    try:
        return string.Template(template).substitute(escaped)
    except KeyError as exc:
        raise ApplicationError(
            f"gate {name!r}: template variable {exc.args[0]!r} is not set (have {sorted(variables)})", non_retryable=True
        ) from None
    except ValueError as exc:
        raise ApplicationError(f"gate {name!r}: bad template {template!r}: {exc}", non_retryable=True) from None


def scalar(name: str, result: list) -> float | None:
    """An instant query's single number: first sample of a vector, or a scalar; no data/NaN -> None.

    ±Inf (e.g. a quantile that falls in the +Inf bucket) becomes ±float max: JSON, and so the
    workflow payload, cannot carry Inf, and None would wrongly read as "no data".
    """
    if not result:
        return None
    if isinstance(result[0], dict):  # a vector (or a range vector, which a gate cannot use)
        if "value" not in result[0]:
            raise ApplicationError(f"gate {name!r}: expected a vector or scalar, got a matrix", non_retryable=True)
        if len(result) > 1:
            activity.logger.warning("gate %r returned %d series; using the first", name, len(result))
        raw = result[0]["value"][1]
    else:  # a scalar: [time, "value"]
        raw = result[1]
    try:
        value = float(raw)
    except ValueError:
        raise ApplicationError(f"gate {name!r}: expected a number, got {raw!r}", non_retryable=True) from None
    if math.isnan(value):
        return None
    if math.isinf(value):
        return math.copysign(sys.float_info.max, value)
    return value


class PrometheusClient:
    """The worker's Prometheus; one requests session, no retries of its own (Temporal retries)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.connect = PrometheusConnect(url=self.url, retry=Retry(total=0, raise_on_status=False), timeout=HTTP_TIMEOUT)

    def _call(self, name: str, promql: str, run: Callable[[], Any]) -> Any:
        try:
            return run()
        except requests.RequestException as exc:
            _count_error("unreachable")
            raise ApplicationError(f"Prometheus at {self.url} unreachable: {exc!r}", type="MetricsUnavailable") from None
        except PrometheusApiClientException as exc:
            status, body = _error_response(exc)
            if status == 400 and body.get("errorType") == "bad_data":
                _count_error("bad_query")
                raise ApplicationError(
                    f"query {name!r}: Prometheus rejected {promql!r}: {body.get('error')}", non_retryable=True
                ) from None
            _count_error(f"http_{status}")
            raise ApplicationError(
                f"query {name!r}: Prometheus answered HTTP {status}: {body.get('error') or str(exc)[:200]}",
                type="MetricsUnavailable",
            ) from None
        except ValueError as exc:  # a 200 whose body is not Prometheus JSON
            _count_error("bad_response")
            raise ApplicationError(f"query {name!r}: Prometheus answered no JSON: {exc}", type="MetricsUnavailable") from None

    def instant(self, name: str, promql: str, at: float | None = None) -> list:
        """The raw ``result`` of an instant query (a list of series, or ``[time, value]`` for a scalar)."""
        params = {"timeout": QUERY_TIMEOUT} | ({"time": f"{at:.3f}"} if at is not None else {})
        return self._call(name, promql, lambda: self.connect.custom_query(promql, params=params))

    def range(self, name: str, promql: str, start: float, end: float, step: float) -> list[dict]:
        """The series of a range query, each ``{"metric": ..., "values": [[t, "v"], ...]}``."""
        # custom_query_range rounds its datetimes to whole seconds; the params override keeps them exact.
        params = {"start": start, "end": end, "timeout": QUERY_TIMEOUT}
        begin, finish = datetime.fromtimestamp(start, timezone.utc), datetime.fromtimestamp(end, timezone.utc)
        run = lambda: self.connect.custom_query_range(promql, begin, finish, str(step), params=params)  # noqa: E731
        return self._call(name, promql, run)

    def value(self, name: str, promql: str) -> float | None:
        """An instant query reduced to one number (None: no data)."""
        return scalar(name, self.instant(name, promql))


def _error_response(exc: PrometheusApiClientException) -> tuple[int, dict]:
    """(HTTP status, Prometheus' JSON error body) out of the client's exception text."""
    match = _STATUS.match(str(exc))
    if not match:
        return 0, {}
    try:
        body = json.loads(ast.literal_eval(match.group(2)))
    except (ValueError, SyntaxError):
        body = {}
    return int(match.group(1)), body if isinstance(body, dict) else {}


def _count_error(reason: str) -> None:
    meter = activity.metric_meter() if activity.in_activity() else MetricMeter.noop
    telemetry.metric_query_error(meter, "prometheus", reason)
