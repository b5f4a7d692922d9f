"""tideplane's Grafana dashboards: importable JSON, one file per view.

Each dashboard has a ``datasource`` variable (any Prometheus data source), so the same file works
through Dashboards > New > Import (upload the JSON, pick the Prometheus) and through file
provisioning.
"""

from __future__ import annotations

from pathlib import Path

DASHBOARD_DIR = Path(__file__).parent
DASHBOARDS = {
    "fleet": DASHBOARD_DIR / "fleet.json",
    "latency": DASHBOARD_DIR / "latency.json",
    "rollouts": DASHBOARD_DIR / "rollouts.json",
    "cost": DASHBOARD_DIR / "cost.json",
    "tokens": DASHBOARD_DIR / "tokens.json",
}


def import_help(prometheus_url: str) -> str:
    """What `tideplane sandbox status` prints: the files and how to load them into Grafana."""
    files = "\n".join(f"  {name:9} {path}" for name, path in DASHBOARDS.items())
    return (
        f"Grafana dashboards:\n{files}\n"
        f"Import: Grafana > Dashboards > New > Import > upload a file, choose a Prometheus data source at {prometheus_url}\n"
        f"  (or: curl -XPOST -H 'Content-Type: application/json' -u admin:admin http://GRAFANA/api/dashboards/db "
        f"-d \"{{\\\"dashboard\\\": $(cat FILE), \\\"overwrite\\\": true}}\")"
    )
