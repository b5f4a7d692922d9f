"""query_gates against the real Prometheus server scraping an exporter whose numbers we control.

The exporter derives every counter and histogram from one clock reading per scrape, so the
ratios the gates compute (error rate, quantiles) are exact whatever the scrape timing. It always
answers in the text format, as vLLM's server does: prometheus_client's own server would
negotiate OpenMetrics with Prometheus 2.42 and escape ``vllm:`` names to ``vllm_``.
"""

from __future__ import annotations

import sys
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from infra.prometheus import running_prometheus, serve_registry
from infra.sandbox.ports import free_port
from workflows.rollout.contract import GateQueriesInput

RPS = 10.0
BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5)
# version -> (error share, latency of every request)
VERSIONS = {"1.0.0": (0.0, 0.05), "2.0.0": (0.1, 0.3), "3.0.0": (0.0, 10.0)}
SEL = 'namespace="${namespace}",deployment="${deployment}",version="${version}"'
GATES = {
    "error_rate": (
        f'sum(rate(http_requests_total{{{SEL},status=~"5.."}}[${{window}}]))'
        f" / sum(rate(http_requests_total{{{SEL}}}[${{window}}]))"
    ),
    "p99": f"histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{{{SEL}}}[${{window}}])))",
    "stable_p99": (
        "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket"
        '{namespace="${namespace}",deployment="${deployment}",version="${stable_version}"}[${window}])))'
    ),
    "requests": f"sum(increase(http_requests_total{{{SEL}}}[${{window}}]))",
}


class FleetExporter:
    """vLLM/HTTP-named series for deployment llm-serving/chat at RPS requests/s per version."""

    def __init__(self) -> None:
        self.t0 = time.time()

    def collect(self):
        n = (time.time() - self.t0) * RPS
        requests = CounterMetricFamily("http_requests", "HTTP requests", labels=["namespace", "deployment", "version", "status"])
        latency = HistogramMetricFamily(
            "vllm:e2e_request_latency_seconds", "end-to-end latency", labels=["namespace", "deployment", "version"]
        )
        for version, (errors, seconds) in VERSIONS.items():
            requests.add_metric(["llm-serving", "chat", version, "200"], n * (1 - errors))
            requests.add_metric(["llm-serving", "chat", version, "500"], n * errors)
            buckets = [(str(le), n if seconds <= le else 0.0) for le in BUCKETS] + [("+Inf", n)]
            latency.add_metric(["llm-serving", "chat", version], buckets, sum_value=n * seconds)
        yield requests
        yield latency


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Prometheus on a free port scraping the exporter every second; yields its URL once it has data."""
    registry = CollectorRegistry()
    registry.register(FleetExporter())
    with serve_registry(registry) as exporter, running_prometheus(tmp_path_factory.mktemp("prometheus"), {"fleet": exporter}) as url:
        deadline = time.monotonic() + 25
        while True:  # rate() needs two scrapes
            try:
                r = httpx.get(f"{url}/api/v1/query", params={"query": 'count(rate(http_requests_total[10s]) > 0)'}, timeout=2)
                if r.json()["data"]["result"]:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            assert time.monotonic() < deadline, "Prometheus never had two scrapes of the exporter"
            time.sleep(0.3)
        yield url


@pytest.fixture(scope="module")
def rollout(prometheus, make_rollout):
    return make_rollout(prometheus_url=prometheus)


def _vars(**extra: str) -> dict[str, str]:
    return {"namespace": "llm-serving", "deployment": "chat", "version": "2.0.0", "stable_version": "1.0.0", "window": "10s", **extra}


def _run(rollout, queries: dict[str, str], variables: dict[str, str]):
    return ActivityEnvironment().run(rollout.query_gates, GateQueriesInput(queries=queries, variables=variables))


def test_gate_queries_return_the_measured_numbers(rollout):
    values = _run(rollout, GATES, _vars()).values
    assert values["error_rate"] == pytest.approx(0.1, rel=1e-9)
    assert values["p99"] == pytest.approx(0.25 + 0.25 * 0.99, rel=1e-9)
    assert values["stable_p99"] == pytest.approx(0.1 * 0.99, rel=1e-9)
    assert 0 < values["requests"] < RPS * 10 * 1.5  # at most ~RPS × window (less while the window fills)


def test_no_data_is_none_and_inf_stays_a_failing_number(rollout):
    values = _run(rollout, GATES, _vars(version="9.9.9")).values
    assert values["error_rate"] is None and values["p99"] is None and values["requests"] is None
    # Beyond the last finite bucket Prometheus answers that bucket's bound; a ratio over zero is +Inf.
    slow = _run(rollout, {"p99": GATES["p99"], "ratio": "vector(1) / vector(0)", "neg": "-1 / 0"}, _vars(version="3.0.0")).values
    assert slow == {"p99": BUCKETS[-1], "ratio": sys.float_info.max, "neg": -sys.float_info.max}


def test_a_query_without_any_series_is_told_from_one_without_samples(rollout):
    """No series at all (a metric nobody exports: vLLM 0.32 has no vllm:time_per_output_token_seconds)
    is reported in no_series; a series whose window holds no observations (NaN) is only no data."""
    removed = GATES["p99"].replace("vllm:e2e_request_latency_seconds", "vllm:time_per_output_token_seconds")
    idle = "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{version=\"1.0.0\"}[${window}]) * 0))"
    result = _run(rollout, {"tpot_p99": removed, "idle": idle, "p99": GATES["p99"]}, _vars())
    assert result.values["tpot_p99"] is None and result.values["idle"] is None and result.values["p99"] is not None
    assert result.no_series == ["tpot_p99"]


def test_missing_template_variable_is_non_retryable_and_named(rollout):
    variables = _vars()
    del variables["stable_version"]
    with pytest.raises(ApplicationError) as err:
        _run(rollout, GATES, variables)
    assert err.value.non_retryable and "stable_version" in str(err.value) and "stable_p99" in str(err.value)


def test_bad_promql_and_range_result_are_non_retryable(rollout):
    with pytest.raises(ApplicationError) as err:
        _run(rollout, {"broken": "sum(rate(http_requests_total[${window}])"}, _vars())
    assert err.value.non_retryable and "broken" in str(err.value)
    with pytest.raises(ApplicationError) as err:
        _run(rollout, {"matrix": "http_requests_total[${window}]"}, _vars())
    assert err.value.non_retryable and "matrix" in str(err.value)


def test_unreachable_prometheus_is_retryable(make_rollout):
    with pytest.raises(ApplicationError) as err:
        _run(make_rollout(prometheus_url=f"http://127.0.0.1:{free_port()}"), GATES, _vars())
    assert not err.value.non_retryable and err.value.type == "MetricsUnavailable"


def test_demand_forecast_reads_the_rate_history_from_prometheus(prometheus):
    """forecast_demand's range query, a sample a step, from the deployment's first sample on."""
    from kubernetes import client

    from activities.clients.kube import KubeClient
    from activities.clients.prometheus import PrometheusClient
    from activities.scaling.scaling_activities import ScalingActivities
    from workflows.scaling.contract import DemandForecastInput

    scaling = ScalingActivities(KubeClient(client.ApiClient()), PrometheusClient(prometheus))
    query = 'sum(rate(http_requests_total{namespace="${namespace}",deployment="${deployment}",version="1.0.0"}[5s]))'
    request = DemandForecastInput(namespace="llm-serving", deployment="chat", at=0, horizon_seconds=1, step_seconds=1, query=query)
    deadline = time.monotonic() + 10
    while True:  # the fixture returns after two scrapes: wait for a few seconds of rate samples
        forecast = ActivityEnvironment().run(scaling.forecast_demand, request.model_copy(update={"at": time.time()}))
        if forecast.checked or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert forecast.basis == "trend"  # seconds of history: no seasonality yet
    assert 0 < forecast.level <= RPS * 1.05 and forecast.checked == 1  # a past origin was checked against what followed
    nothing = request.model_copy(update={"at": time.time(), "query": 'sum(rate(http_requests_total{deployment="none"}[5s]))'})
    assert ActivityEnvironment().run(scaling.forecast_demand, nothing).basis == "none"
