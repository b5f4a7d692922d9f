"""Cost: the daily CostReport workflow, the pure pricing arithmetic and the Prometheus activity contract."""
