"""Model registry: the manifest schema, the retention workflow and the registry activity contract."""
