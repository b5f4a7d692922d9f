"""The model registry's side effects: the store in S3 beside the weights (store.py: manifests,
indexes, checksums, compare-and-swap writes) and the activities on it (registry_activities.py)."""
