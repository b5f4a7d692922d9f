"""The policies tideplane is compared with, each as its users would run it.

- ``StaticPolicy``: a fixed fleet (the benchmark sweeps its size into a curve);
- ``HpaPolicy``: Kubernetes' HorizontalPodAutoscaler (autoscaling/v2 defaults) on a per-pod
  utilisation metric, here ``DCGM_FI_DEV_GPU_UTIL`` through a metrics adapter;
- ``KedaPolicy``: KEDA's Prometheus scaler on a fleet-wide total (``vllm:num_requests_waiting``,
  waiting + running, or ``rate(vllm:request_success_total[1m])`` as vLLM's production-stack
  configures it), ``metricType: AverageValue``: HPA's rule for external metrics;
- ``OraclePolicy``: perfect foresight of each second's arrivals, for a run with zero cold start.

Both HPA-driven ones share ``HpaRule``: the controller's sync rules, not the metric.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from workflows.scaling.decide import Signals


@dataclass
class StaticPolicy:
    name: str
    replicas: int
    interval_s: float = 3600.0

    def initial(self) -> int:
        return self.replicas

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int:
        return self.replicas


@dataclass
class HpaRule:
    """HPA v2's defaults: 10 % tolerance; up by at most max(100 %, 4 pods) per sync; down to the
    highest recommendation of the last 300 s (stabilisation window); a missing metric holds.
    ``up_period_s``: the scale-up policies' ``periodSeconds`` (one such step per period; 0: every sync)."""

    min_replicas: int = 1
    max_replicas: int = 1000
    tolerance: float = 0.1
    down_stabilisation_s: float = 300.0
    up_period_s: float = 0.0
    _recent: list[tuple[float, int]] = field(default_factory=list)
    _last_up: float = -math.inf

    def apply(self, now_s: float, current: int, ratio: float | None, recommended: int) -> int:
        """``ratio``: metric / target as HPA computes it (within tolerance of 1: no change)."""
        rec = current if ratio is None or abs(ratio - 1) <= self.tolerance else recommended
        rec = min(self.max_replicas, max(self.min_replicas, rec))
        self._recent = [(t, r) for t, r in self._recent if now_s - t < self.down_stabilisation_s] + [(now_s, rec)]
        if rec > current:
            if now_s - self._last_up < self.up_period_s:
                return current
            self._last_up = now_s
            return min(rec, max(2 * current, current + 4))
        return min(current, max(r for _, r in self._recent))


@dataclass
class HpaPolicy:
    """HPA on the pods' mean GPU utilisation: ``ceil(ready * util / target)``."""

    start: int
    target_percent: float = 70.0
    rule: HpaRule = field(default_factory=HpaRule)
    interval_s: float = 15.0

    @property
    def name(self) -> str:
        return f"hpa-gpu-util-{self.target_percent:g}"

    def initial(self) -> int:
        return self.start

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int:
        util = signals.gpu_util_percent
        if util is None or ready == 0:
            return self.rule.apply(now_s, current, None, current)
        ratio = util / self.target_percent
        return self.rule.apply(now_s, current, ratio, math.ceil(ready * ratio))


@dataclass
class KedaPolicy:
    """KEDA's Prometheus scaler, ``AverageValue`` target per replica: ``ceil(total / target)``."""

    start: int
    target_per_replica: float = 10.0
    metric: str = "waiting"  # "waiting": vllm:num_requests_waiting; "in_flight": + vllm:num_requests_running; "rate": req/s served
    rule: HpaRule = field(default_factory=HpaRule)
    interval_s: float = 15.0

    @property
    def name(self) -> str:
        window = f"-down{self.rule.down_stabilisation_s:g}" if self.metric == "rate" else ""  # the rate grid sweeps it too
        return f"keda-{self.metric}-{self.target_per_replica:.3g}{window}"

    def initial(self) -> int:
        return self.start

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int:
        total = signals.request_rate if self.metric == "rate" else signals.queue_waiting
        if total is not None and self.metric == "in_flight":
            total += signals.running or 0.0
        if total is None:
            return self.rule.apply(now_s, current, None, current)
        ratio = total / (self.target_per_replica * max(current, 1))
        return self.rule.apply(now_s, current, ratio, math.ceil(total / self.target_per_replica))


@dataclass
class OraclePolicy:
    """Knows every second's arrivals ahead; sizes each interval so no second of it queues.

    ``arrivals``: requests per second; ``capacity_rps(t)``: what one replica admits per second at
    t (the model's saturation throughput for that time's request sizes). Run with zero cold start.
    """

    arrivals: list[float]
    capacity_rps: Callable[[float], float]
    interval_s: float = 15.0
    name: str = "oracle"

    def need(self, now_s: float) -> int:
        start, end = int(now_s), int(now_s + self.interval_s)
        peak = max(self.arrivals[start:end], default=0.0)
        return max(1, math.ceil(peak / self.capacity_rps(now_s) - 1e-9))

    def initial(self) -> int:
        return self.need(0.0)

    def desired(self, now_s: float, current: int, ready: int, signals: Signals) -> int:
        return self.need(now_s)
