"""The scrape path tideplane ships, rendered from one source so its forms cannot drift.

What the queries select on (``namespace``, ``pod``, ``deployment``, ``version``, ``node``) is made
at scrape time from what tideplane writes on its serving pods (workflows/core/naming.py), never by
the engine: vLLM labels its samples ``model_name`` and ``engine`` only
(workflows/core/engine_metrics.py). One list of rules (SERVING, DCGM below) is written as

- ``infra/k8s/serving-namespace/monitoring/podmonitor.yaml``: a Prometheus Operator PodMonitor for
  the serving pods, a kustomize Component of the serving-namespace kit, so every namespace that kit
  labels ``tideplane.io/serving=true`` gets one in it (a PodMonitor's own ``namespaceSelector``
  takes only names, so it selects pods of its own namespace; the Prometheus object selects the
  monitors of exactly those namespaces with
  ``podMonitorNamespaceSelector: {matchLabels: {tideplane.io/serving: "true"}}``);
- ``infra/k8s/monitoring/podmonitor-dcgm.yaml``: a PodMonitor for NVIDIA's dcgm-exporter, keeping
  the exporter's own pod mapping (the ``namespace``/``pod`` of the pod holding each GPU) and naming
  the ``node``;
- ``infra/k8s/monitoring/scrape-configs.yaml``: the same rules as a plain ``scrape_configs`` block
  (``kubernetes_sd_configs``, role pod) for a Prometheus without the operator; the sandbox's
  Prometheus loads exactly this block;
- ``infra/k8s/monitoring/prometheusrule.yaml``: the recording rules and alerts of infra/prometheus/
  as a PrometheusRule (each alert has a ``runbook_url`` into docs/operating.md).

Run ``python -m infra.k8s.monitoring.render`` after changing a rule (``--check`` fails when a
committed file differs; tests/unit/core/test_scrape_path.py runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from workflows.core import naming

ROOT = Path(__file__).resolve().parents[3]
SERVING_PORT = "http"  # the serving container's port name (activities/rollout/serving_pods.py)
SERVING_JOB = "tideplane-serving"
DCGM_JOB = "dcgm-exporter"
# dcgm-exporter's pods as its Helm chart labels them (the GPU Operator's: app=nvidia-dcgm-exporter).
DCGM_POD_LABEL = ("app.kubernetes.io/name", "dcgm-exporter")
DCGM_PORT = "metrics"
MONITOR_LABELS = {"app.kubernetes.io/part-of": "tideplane"}


def meta_label(label: str) -> str:
    """A pod label as Kubernetes discovery names it: ``__meta_kubernetes_pod_label_<sanitised>``."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def present(label: str) -> str:
    return "__meta_kubernetes_pod_labelpresent_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


# (source labels, action, regex, target label): the one list. "keep" rules select the targets the
# operator's own selector selects; "replace" rules make the labels the queries read.
SERVING_SELECT = [
    ([meta_label(naming.LABEL_MANAGED_BY)], "keep", naming.MANAGED_BY, None),
    ([present(naming.LABEL_MODEL)], "keep", "true", None),
    (["__meta_kubernetes_pod_container_port_name"], "keep", SERVING_PORT, None),
    (["__meta_kubernetes_pod_phase"], "keep", "Running", None),
]
SERVING = [
    (["__meta_kubernetes_namespace"], "replace", "(.+)", "namespace"),
    (["__meta_kubernetes_pod_name"], "replace", "(.+)", "pod"),
    ([meta_label(naming.LABEL_APP)], "replace", "(.+)", "deployment"),
    ([meta_label(naming.LABEL_VERSION)], "replace", "(.+)", "version"),
    (["__meta_kubernetes_pod_node_name"], "replace", "(.+)", "node"),
]
DCGM_SELECT = [
    ([meta_label(DCGM_POD_LABEL[0])], "keep", DCGM_POD_LABEL[1], None),
    (["__meta_kubernetes_pod_container_port_name"], "keep", DCGM_PORT, None),
]
# The exporter runs on the node it reports; its samples' namespace/pod name the GPU's holder (the
# pod mapping), so the exporter's own namespace/pod must not be added as target labels.
DCGM = [
    (["__meta_kubernetes_pod_node_name"], "replace", "(.+)", "node"),
]
DCGM_OPERATOR_DROP = "namespace|pod|container|endpoint"  # target labels the operator adds itself


def _relabel_config(source, action, regex, target) -> dict:
    rule: dict = {"source_labels": source, "action": action, "regex": regex}
    if target:
        rule |= {"target_label": target, "replacement": "$1"}
    return rule


def _relabeling(source, action, regex, target) -> dict:
    rule: dict = {"sourceLabels": source, "action": action, "regex": regex}
    if target:
        rule |= {"targetLabel": target, "replacement": "$1"}
    return rule


def scrape_configs() -> list[dict]:
    """The plain Prometheus block: no honor_labels, so an exporter can never set these labels itself."""
    return [
        {
            "job_name": SERVING_JOB,
            "kubernetes_sd_configs": [{"role": "pod"}],
            "relabel_configs": [_relabel_config(*r) for r in SERVING_SELECT + SERVING],
        },
        {
            "job_name": DCGM_JOB,
            "kubernetes_sd_configs": [{"role": "pod"}],
            "relabel_configs": [_relabel_config(*r) for r in DCGM_SELECT + DCGM],
        },
    ]


def serving_podmonitor() -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": SERVING_JOB, "labels": dict(MONITOR_LABELS)},
        "spec": {
            "selector": {
                "matchLabels": {naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
                "matchExpressions": [{"key": naming.LABEL_MODEL, "operator": "Exists"}],
            },
            "podMetricsEndpoints": [{
                "port": SERVING_PORT,
                "path": "/metrics",
                "relabelings": [_relabeling(*r) for r in SERVING_SELECT[3:] + SERVING],
            }],
        },
    }


def dcgm_podmonitor() -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": DCGM_JOB, "labels": dict(MONITOR_LABELS)},
        "spec": {
            "namespaceSelector": {"any": True},
            "selector": {"matchLabels": {DCGM_POD_LABEL[0]: DCGM_POD_LABEL[1]}},
            "podMetricsEndpoints": [{
                "port": DCGM_PORT,
                "path": "/metrics",
                "relabelings": [{"action": "labeldrop", "regex": DCGM_OPERATOR_DROP}] + [_relabeling(*r) for r in DCGM],
            }],
        },
    }


def prometheus_rule() -> dict:
    groups = []
    for name in ("recording-rules.yml", "alerts.yml"):
        groups += yaml.safe_load((ROOT / "infra/prometheus" / name).read_text())["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "tideplane", "labels": dict(MONITOR_LABELS)},
        "spec": {"groups": groups},
    }


HEADER = "# Rendered by `python -m infra.k8s.monitoring.render` from infra/k8s/monitoring/render.py: edit that, not this.\n"


def _dump(doc) -> str:
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=200)


def rendered() -> dict[Path, str]:
    return {
        ROOT / "infra/k8s/serving-namespace/monitoring/podmonitor.yaml": _dump(serving_podmonitor()),
        ROOT / "infra/k8s/monitoring/podmonitor-dcgm.yaml": _dump(dcgm_podmonitor()),
        ROOT / "infra/k8s/monitoring/scrape-configs.yaml": _dump({"scrape_configs": scrape_configs()}),
        ROOT / "infra/k8s/monitoring/prometheusrule.yaml": _dump(prometheus_rule()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed file differs from its rendering")
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
    if stale:
        print("stale (run python -m infra.k8s.monitoring.render): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
