"""Prometheus side of the cost report: GPU occupancy, pod/node identity and tokens over a window.

Every query is pinned to the window's end (``time=``/``end=``), so a retried activity reads the
same numbers. The one Prometheus client (activities/clients/prometheus.py) runs the queries and
renders the templates; this module adds vector and range results (one row per label set) and maps
them onto the cost model's rows.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.clients.prometheus import PrometheusClient, render
from workflows.cost import contract
from workflows.cost.contract import CollectCostInput, CostInputs, MonthSpendInput
from workflows.cost.pricing import GpuSeconds, NodeInfo, PodInfo, TokenCount, compute_cost
from workflows.cost.budget import Spend

MAX_POINTS = 10_000  # per series and request; Prometheus refuses more than 11,000


def _labels(name: str, labels: dict[str, str], *required: str) -> list[str]:
    missing = [key for key in required if key not in labels]
    if missing:
        raise ApplicationError(f"cost query {name!r} must return labels {list(required)}; {labels} lacks {missing}",
                               non_retryable=True)
    return [labels[key] for key in required]


class CostActivities(contract.CostActivities):
    """Reads the cost inputs from one Prometheus."""

    def __init__(self, prometheus: PrometheusClient) -> None:
        self.prometheus = prometheus

    def _vector(self, name: str, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
        """An instant query's series as (labels, value)."""
        result = self.prometheus.instant(name, promql, at)
        if result and not (isinstance(result[0], dict) and "value" in result[0]):
            kind = "matrix" if isinstance(result[0], dict) else "scalar"
            raise ApplicationError(f"cost query {name!r}: expected a vector, got a {kind}", non_retryable=True)
        return [(series["metric"], float(series["value"][1])) for series in result]

    def _integrate(self, name: str, promql: str, end: float, window: int, step: int) -> dict[tuple, float]:
        """Sum of ``promql`` x ``step`` over the ``window / step`` instants ending at ``end``, per label set.

        A range query at exactly those instants (not a subquery, whose end-inclusiveness changed in
        Prometheus 3), split into requests under Prometheus' points limit.
        """
        totals: dict[tuple, float] = {}
        first = end - window + step
        while first <= end:
            last = min(end, first + (MAX_POINTS - 1) * step)
            for series in self.prometheus.range(name, promql, first, last, step):
                key = tuple(sorted(series["metric"].items()))
                totals[key] = totals.get(key, 0.0) + sum(float(v) for _, v in series["values"]) * step
            first = last + step
        return totals

    @activity.defn(name="collect_cost_inputs")
    def collect_cost_inputs(self, req: CollectCostInput) -> CostInputs:
        if req.window_seconds % req.step_seconds:
            raise ApplicationError(
                f"window_seconds {req.window_seconds} is not a multiple of step_seconds {req.step_seconds}",
                non_retryable=True,
            )
        variables = {"window": f"{req.window_seconds}s"}
        q = {name: render(name, template, variables) for name, template in req.queries.model_dump().items()}
        at = req.end.timestamp()
        occupancy = self._integrate("gpu_occupancy", q["gpu_occupancy"], at, req.window_seconds, req.step_seconds)
        gpu = [
            GpuSeconds(**dict(zip(("namespace", "pod", "node"), _labels("gpu_occupancy", dict(m), "namespace", "pod", "node"))),
                       gpu_seconds=v)
            for m, v in occupancy.items()
        ]
        pods = [
            PodInfo(**dict(zip(("namespace", "pod", "deployment", "version", "model"),
                               _labels("pods", m, "namespace", "pod", "deployment", "version", "model_name"))))
            for m, _ in self._vector("pods", q["pods"], at)
        ]
        nodes = [
            NodeInfo(**dict(zip(("node", "pool", "capacity_type"), _labels("nodes", m, "node", "pool", "capacity_type"))))
            for m, _ in self._vector("nodes", q["nodes"], at)
        ]
        counts: dict[tuple[str, ...], dict[str, float]] = {}
        for kind in ("generation_tokens", "prompt_tokens"):
            for m, v in self._vector(kind, q[kind], at):
                key = tuple(_labels(kind, m, "namespace", "deployment", "version", "model_name"))
                counts.setdefault(key, {"generation_tokens": 0.0, "prompt_tokens": 0.0})[kind] = v
        tokens = [
            TokenCount(namespace=ns, deployment=dep, version=ver, model=model, **values)
            for (ns, dep, ver, model), values in sorted(counts.items())
        ]
        activity.logger.info("cost inputs: %d GPU rows, %d pods, %d nodes, %d versions with tokens",
                             len(gpu), len(pods), len(nodes), len(tokens))
        return CostInputs(gpu=gpu, pods=pods, nodes=nodes, tokens=tokens)

    @activity.defn(name="read_month_spend")
    def read_month_spend(self, req: MonthSpendInput) -> Spend:
        def cost_per_window(window_seconds: int) -> tuple[float, int]:
            """The cost of the last ``window_seconds`` (rounded down to whole steps) and that window."""
            window = max(req.step_seconds, window_seconds // req.step_seconds * req.step_seconds)
            inputs = self.collect_cost_inputs(CollectCostInput(end=req.end, window_seconds=window, step_seconds=req.step_seconds,
                                                               queries=req.queries))
            return compute_cost(inputs.gpu, inputs.pods, inputs.nodes, inputs.tokens, req.prices).total_cost, window

        spent, _ = cost_per_window(int((req.end - req.month_start).total_seconds()))
        recent, window = cost_per_window(req.rate_window_seconds)
        return Spend(spent_usd=spent, rate_usd_per_hour=recent * 3600 / window)
