"""The shipped scrape path (infra/k8s/monitoring/render.py): the committed files are its rendering,
the PodMonitors and the plain scrape_configs carry the same relabelling into the labels the queries
select on, and every alert names its runbook in docs/operating.md. The real Prometheus applying the
block: tests/e2e/core/test_scrape_path.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from infra.k8s.monitoring import render
from infra.prometheus import RULE_FILES
from workflows.core.engine_metrics import SCRAPE_LABELS

ROOT = Path(__file__).resolve().parents[3]
OPERATING = ROOT / "docs/operating.md"



def _load(path: str):
    return yaml.safe_load((ROOT / path).read_text())


def test_committed_files_are_the_rendering():
    assert render.main(["--check"]) == 0, "run: python -m infra.k8s.monitoring.render"


def _pairs(rules, source="source_labels", target="target_label"):
    return [(tuple(r[source]), r[target]) for r in rules if r.get("action") == "replace"]


def test_podmonitor_and_scrape_configs_relabel_alike_into_the_query_labels():
    plain = {job["job_name"]: job for job in _load("infra/k8s/monitoring/scrape-configs.yaml")["scrape_configs"]}
    serving = _load("infra/k8s/serving-namespace/monitoring/podmonitor.yaml")
    [endpoint] = serving["spec"]["podMetricsEndpoints"]
    plain_pairs = _pairs(plain[render.SERVING_JOB]["relabel_configs"])
    assert plain_pairs == _pairs(endpoint["relabelings"], "sourceLabels", "targetLabel")
    assert {target for _, target in plain_pairs} == set(SCRAPE_LABELS)
    assert dict((t, s) for s, t in plain_pairs)["deployment"] == ("__meta_kubernetes_pod_label_app_kubernetes_io_name",)
    assert dict((t, s) for s, t in plain_pairs)["version"] == ("__meta_kubernetes_pod_label_app_kubernetes_io_version",)
    # the operator selects what the plain block keeps: tideplane's serving pods, their http port
    keeps = {r["source_labels"][0]: r["regex"] for r in plain[render.SERVING_JOB]["relabel_configs"] if r["action"] == "keep"}
    assert serving["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": keeps["__meta_kubernetes_pod_label_app_kubernetes_io_managed_by"]}
    assert endpoint["port"] == keeps["__meta_kubernetes_pod_container_port_name"]
    assert "honor_labels" not in str(plain) and "honorLabels" not in str(serving)
    dcgm = _load("infra/k8s/monitoring/podmonitor-dcgm.yaml")["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert _pairs(plain[render.DCGM_JOB]["relabel_configs"]) == _pairs(dcgm, "sourceLabels", "targetLabel") == [(("__meta_kubernetes_pod_node_name",), "node")]
    # the exporter's own pod/namespace would hide the pod mapping its samples carry
    assert dcgm[0] == {"action": "labeldrop", "regex": "namespace|pod|container|endpoint"}


def test_serving_podmonitor_lands_in_each_serving_namespace():
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / "infra/k8s/overlays/example/namespaces/llm-serving")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    namespace = next(d for d in docs if d["kind"] == "Namespace")
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    assert namespace["metadata"]["labels"]["tideplane.io/serving"] == "true"
    assert monitor["metadata"]["namespace"] == namespace["metadata"]["name"] == "llm-serving"
    assert "namespaceSelector" not in monitor["spec"]  # its own namespace: the one the kit labels serving


def _anchors(doc: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", doc.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", re.sub(r"[`*_\[\]]", "", h.strip().lower())).replace(" ", "-") for h in headings}


def test_every_alert_names_its_runbook_and_the_rule_is_the_rule_files():
    rule = _load("infra/k8s/monitoring/prometheusrule.yaml")
    groups = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == groups
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 13
    anchors = _anchors(OPERATING)
    for alert in alerts:
        url = alert["annotations"].get("runbook_url", "")
        doc, _, anchor = url.partition("#")
        assert doc == "docs/operating.md" and anchor == alert["alert"].lower() and anchor in anchors, (alert["alert"], url)
