"""The API server's timestamps: RFC 3339 in UTC, to the second, as Kubernetes writes them."""

from __future__ import annotations

from datetime import datetime, timezone


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
