"""The metric contract: every engine (vLLM), HTTP-server and DCGM metric family tideplane reads,
declared once, with the type and the label names its exporter writes.

Gates (workflows/rollout/types.py, workflows/adapters/types.py), scaling signals
(workflows/scaling/contract.py), batching (activities/rollout/batching_activities.py), cost
(workflows/cost/contract.py), the recording rules and alerts (infra/prometheus/) and the Grafana
dashboards (infra/grafana/) read these families and no other engine family; the tests hold them
to it (tests/unit/core/test_engine_metrics.py) and hold this list to a vLLM 0.32 exposition
(tests/fixtures/vllm/). Names are as the text exposition writes them on samples: a counter with
its ``_total``, a histogram by its base name (``_bucket``, ``_sum``, ``_count`` series).

vLLM labels its own samples with ``model_name`` and ``engine`` only (plus ``le`` on histogram
buckets and e.g. ``finished_reason``). The ``namespace``, ``pod``, ``deployment``, ``version`` and
``node`` labels every query selects on are added at scrape time by the relabelling tideplane ships
(infra/k8s/monitoring/, rendered by infra/k8s/monitoring/render.py) from the labels it writes on
its pods (workflows/core/naming.py); no engine writes them.

vLLM deprecates a metric in X.Y, hides it in X.Y+1 and removes it in X.Y+2:
``vllm:time_per_output_token_seconds`` (deprecated in 0.11, gone since) and
``vllm:gpu_cache_usage_perc`` are never read. Pure code: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VLLM = "vllm"
HTTP_SERVER = "vllm http server"  # prometheus-fastapi-instrumentator, mounted by vLLM's OpenAI server
DCGM = "dcgm-exporter"

ENGINE_LABELS = ("model_name", "engine")  # on every vLLM engine sample
# dcgm-exporter's device labels, and the pod mapping's (--kubernetes) namespace/pod/container.
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "namespace", "pod", "container")
# Added by scrape-time relabelling from the pod's labels and metadata, never by an exporter.
SCRAPE_LABELS = ("namespace", "pod", "deployment", "version", "node")

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # "gauge" | "counter" | "histogram"
    labels: tuple[str, ...]  # the exporter's own label names on its samples (``le`` not listed)
    source: str
    read_by: tuple[str, ...]

    def series(self) -> tuple[str, ...]:
        """The series names a query may select: a histogram's three, else the name itself."""
        if self.type == "histogram":
            return tuple(self.name + suffix for suffix in HISTOGRAM_SUFFIXES)
        return (self.name,)


NUM_REQUESTS_WAITING = Family(
    "vllm:num_requests_waiting", "gauge", ENGINE_LABELS, VLLM,
    ("scaling queue_waiting", "demand forecast", "alert RequestsWaitingHigh", "dashboards"),
)
NUM_REQUESTS_RUNNING = Family(
    "vllm:num_requests_running", "gauge", ENGINE_LABELS, VLLM,
    ("scaling running", "replica history", "gpu_util join", "batching replicas", "cost serving pods", "dashboards"),
)
KV_CACHE_USAGE = Family("vllm:kv_cache_usage_perc", "gauge", ENGINE_LABELS, VLLM, ("scaling kv_cache_usage", "dashboards"))
TIME_TO_FIRST_TOKEN = Family(
    "vllm:time_to_first_token_seconds", "histogram", ENGINE_LABELS, VLLM,
    ("gate ttft_p99", "adapter gate ttft_p99", "scaling ttft_p99_seconds, request_rate", "batching", "recording rules", "dashboards"),
)
# TPOT is vLLM's per-request histogram: each finished request observes its own decode time over its
# output tokens after the first (vllm/v1/metrics/stats.py: decode_time / (num_generation_tokens - 1)),
# so a p99 is the p99 *request's* time per output token, what a TPOT SLO means. Not
# ``vllm:inter_token_latency_seconds``: it observes once per engine output event, and under
# speculative decoding one event carries several accepted tokens, so its quantiles weigh steps, not
# tokens or requests, and move with the acceptance rate.
REQUEST_TIME_PER_OUTPUT_TOKEN = Family(
    "vllm:request_time_per_output_token_seconds", "histogram", ENGINE_LABELS, VLLM,
    ("gate tpot_p99", "adapter gate tpot_p99", "batching", "recording rules", "alert TPOTP99High", "dashboards"),
)
E2E_REQUEST_LATENCY = Family(
    "vllm:e2e_request_latency_seconds", "histogram", ENGINE_LABELS, VLLM,
    ("gate p99_latency, stable_p99_latency", "scaling e2e_p95_seconds", "recording rules", "dashboards"),
)
REQUEST_QUEUE_TIME = Family("vllm:request_queue_time_seconds", "histogram", ENGINE_LABELS, VLLM, ("recording rules", "dashboards"))
REQUEST_PREFILL_TIME = Family("vllm:request_prefill_time_seconds", "histogram", ENGINE_LABELS, VLLM, ("recording rules", "dashboards"))
REQUEST_DECODE_TIME = Family("vllm:request_decode_time_seconds", "histogram", ENGINE_LABELS, VLLM, ("recording rules", "dashboards"))
PROMPT_TOKENS = Family("vllm:prompt_tokens_total", "counter", ENGINE_LABELS, VLLM, ("batching traffic shape", "cost", "recording rules"))
GENERATION_TOKENS = Family(
    "vllm:generation_tokens_total", "counter", ENGINE_LABELS, VLLM, ("batching traffic shape", "cost", "recording rules", "dashboards")
)
REQUEST_SUCCESS = Family(
    "vllm:request_success_total", "counter", (*ENGINE_LABELS, "finished_reason"), VLLM, ("batching traffic shape",)
)
HTTP_REQUESTS = Family(
    "http_requests_total", "counter", ("handler", "method", "status"), HTTP_SERVER,
    ("gate request_count, error_rate", "recording rules", "dashboards"),
)
GPU_UTIL = Family("DCGM_FI_DEV_GPU_UTIL", "gauge", DCGM_LABELS, DCGM, ("scaling gpu_util_percent", "cost occupancy", "recording rules", "alert GPUUtilisationHigh", "dashboards"))
FB_USED = Family("DCGM_FI_DEV_FB_USED", "gauge", DCGM_LABELS, DCGM, ("recording rules", "dashboards"))
FB_FREE = Family("DCGM_FI_DEV_FB_FREE", "gauge", DCGM_LABELS, DCGM, ("recording rules", "dashboards"))

FAMILIES: tuple[Family, ...] = (
    NUM_REQUESTS_WAITING, NUM_REQUESTS_RUNNING, KV_CACHE_USAGE, TIME_TO_FIRST_TOKEN, REQUEST_TIME_PER_OUTPUT_TOKEN,
    E2E_REQUEST_LATENCY, REQUEST_QUEUE_TIME, REQUEST_PREFILL_TIME, REQUEST_DECODE_TIME, PROMPT_TOKENS,
    GENERATION_TOKENS, REQUEST_SUCCESS, HTTP_REQUESTS, GPU_UTIL, FB_USED, FB_FREE,
)
BY_NAME = {family.name: family for family in FAMILIES}
# Never a default: removed from vLLM (see the module docstring).
REMOVED = ("vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc")


def family_of(series: str) -> Family | None:
    """The contract family a series name belongs to (``x_bucket`` -> histogram ``x``), or None."""
    if series in BY_NAME:
        return BY_NAME[series]
    for suffix in HISTOGRAM_SUFFIXES:
        base = series.removesuffix(suffix)
        if base != series and base in BY_NAME and BY_NAME[base].type == "histogram":
            return BY_NAME[base]
    return None


_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on", "ignoring", "group_left", "group_right"}


def metric_names(promql: str) -> set[str]:
    """The metric (series) names a PromQL expression selects: strings, matchers, ranges and label
    lists removed, function names and keywords dropped. ``${...}`` template variables are fine."""
    text = re.sub(r"\$\{\w+\}", "0", promql)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", text)
    return {n for n in names if n.lower() not in _KEYWORDS}
