"""Cost: the daily CostReport workflow and the pure pricing arithmetic."""
