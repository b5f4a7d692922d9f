"""Where the answers to mirrored requests are recorded: an HTTP endpoint per route that lists
(stable answer, canary answer) pairs after a sequence number.

The Gateway API ``RequestMirror`` filter sends a copy of each sampled request to the canary and
drops the canary's answer, so the pairs must be recorded by whatever sees both answers: in the
sandbox the fleet simulator (``GET /mirror/<namespace>/<route>?after=<seq>``); in production a
logging proxy beside the gateway (docs/production.md, "Shadow comparison") serving the same JSON.
"""

from __future__ import annotations

import httpx

HTTP_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


class ShadowPairsClient:
    """``url_template`` has ``{namespace}`` and ``{name}`` (the HTTPRoute); None: not configured."""

    def __init__(self, url_template: str | None, timeout: httpx.Timeout = HTTP_TIMEOUT) -> None:
        self.url_template = url_template
        self.timeout = timeout

    def pairs(self, namespace: str, name: str, after: int, limit: int = 1000) -> dict:
        """``{"pairs": [{seq, prompt, stable_version, stable_answer, canary_version, canary_answer}], "last": seq}``."""
        assert self.url_template is not None
        url = self.url_template.format(namespace=namespace, name=name)
        with httpx.Client(timeout=self.timeout) as http:
            resp = http.get(url, params={"after": after, "limit": limit})
            resp.raise_for_status()
            return resp.json()
