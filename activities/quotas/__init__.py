"""Token quotas' side effects: ``QuotaActivities`` (metered tokens from Prometheus, the gateway's
rate-limit policy in the cluster)."""
