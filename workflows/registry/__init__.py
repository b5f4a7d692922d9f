"""Model registry: the manifest schema and the retention workflow."""
