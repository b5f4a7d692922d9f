"""Token metering and quotas: tokens per tenant from the gateway's counters, and per-tenant quotas as its rate limits."""
