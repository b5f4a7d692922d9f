"""The worker's /metrics endpoint: the Temporal runtime's own Prometheus exporter.

tideplane's metrics (declared in ``workflows/core/telemetry.py``) are recorded through the SDK's
metric meters, ``workflow.metric_meter()`` and ``activity.metric_meter()``, so they come out of
the same exporter as the SDK's ``temporal_*`` metrics: one scrape target per worker pod, one port.
"""

from __future__ import annotations

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from workflows.core.telemetry import BUCKETS


def metrics_runtime(port: int, host: str = "0.0.0.0") -> Runtime:
    """A Temporal runtime serving every metric on ``http://host:port/metrics``.

    Pass it to ``Client.connect(runtime=...)``: the workers of that client record into it.
    Names are exported as declared (no ``_total``/unit suffixes added), so the SDK's own metrics
    keep their documented names; histograms get the buckets declared with each metric. Raises
    ValueError when the port is taken.
    """
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=f"{host}:{port}", histogram_bucket_overrides=BUCKETS)
        )
    )
