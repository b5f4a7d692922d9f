"""Runtime-switchable fault injection, so tests can check that callers retry and back off."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from . import errors

KINDS = ("500", "409", "429", "delay")
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})  # a real API server answers 409 Conflict only to these


class Faults:
    """Answer a fraction of API requests with 500 / 409 Conflict (writes only) / 429, or delay them."""

    def __init__(self, rate: float = 0.0, kinds: list[str] | None = None, delay_seconds: float = 1.0,
                 methods: list[str] | None = None):
        self._lock = threading.Lock()
        self.settings: dict[str, Any] = {}
        self.update({"rate": rate, "kinds": kinds or ["500"], "delay_seconds": delay_seconds, "methods": methods or []},
                    replace=True)

    def update(self, body: Any, replace: bool = False) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request("faults must be a JSON object")
        merged = ({"rate": 0.0, "kinds": ["500"], "delay_seconds": 1.0, "methods": []} if replace else dict(self.settings))
        merged.update(body)
        unknown = set(merged) - {"rate", "kinds", "delay_seconds", "methods"}
        if unknown:
            raise errors.bad_request(f"unknown fault settings: {sorted(unknown)}")
        if not isinstance(merged["rate"], (int, float)) or not 0 <= merged["rate"] <= 1:
            raise errors.bad_request("faults.rate must be a number in [0, 1]")
        if not merged["kinds"] or any(k not in KINDS for k in merged["kinds"]):
            raise errors.bad_request(f"faults.kinds must be a non-empty subset of {list(KINDS)}")
        if not isinstance(merged["delay_seconds"], (int, float)) or merged["delay_seconds"] < 0:
            raise errors.bad_request("faults.delay_seconds must be >= 0")
        merged["methods"] = [m.upper() for m in merged["methods"] or []]
        with self._lock:
            self.settings = merged
        return dict(merged)

    def inject(self, method: str) -> None:
        """Raise the chosen failure (or sleep) for a request picked at random; else return at once."""
        s = self.settings
        if not s["rate"] or (s["methods"] and method not in s["methods"]) or random.random() >= s["rate"]:
            return
        kinds = [k for k in s["kinds"] if k != "409" or method in WRITES] or ["500"]
        kind = random.choice(kinds)
        if kind == "delay":
            time.sleep(s["delay_seconds"])
        elif kind == "409":
            raise errors.conflict("objects", "injected", why="injected fault: the object has been modified; "
                                  "please apply your changes to the latest version and try again")
        elif kind == "429":
            raise errors.too_many_requests("injected fault: too many requests, please try again later")
        else:
            raise errors.internal("injected fault")
