"""Cost's side effects: ``CostActivities`` (GPU occupancy, pods, nodes and tokens from Prometheus)."""
