"""What the fleet simulator's models answer, and the answers it records for mirrored requests.

Answers are deterministic per (prompt, version), as under temperature 0: a version answers from
``REFERENCE_ANSWERS`` (the sandbox's ground truth, which ``golden.yaml`` beside this module
checks), unless its profile says otherwise — a prompt matching one of ``golden_failures``
(case-insensitive substrings) gets a confident wrong answer, and a ``drift`` share of open-ended
prompts (those without a reference answer, picked by a hash of prompt and version) get an answer
that differs from stable's (a refusal or a padded one): a release whose facts pass the golden set
while its everyday answers change, which only the shadow comparison of live traffic finds.

``MirrorLog`` honours the Gateway API ``RequestMirror`` filter of an HTTPRoute's first rule: every
tick, ``percent`` of the route's simulated requests are mirrored to the filter's backend; the
user's answer (from the route's main backend) and the mirrored answer (discarded, no user sees it)
are recorded as a pair, read back over ``GET /mirror/<namespace>/<route>?after=<seq>``.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import deque
from typing import Callable
from urllib.parse import parse_qs, urlparse

from infra.sandbox.config import Profile

REFERENCE_ANSWERS = {
    "capital of france": "The capital of France is Paris.",
    "17 * 23": "17 * 23 = 391.",
    "refund window": "Refunds are accepted within 30 days of delivery.",
    "maximum daily dose of paracetamol": "The maximum daily dose of paracetamol for adults is 4 grams (4000 mg).",
    "order 1234 as json": '{"order_id": 1234, "status": "shipped", "items": 2}',
    "boiling point of water": "Water boils at 100 degrees Celsius at sea level.",
}
# Live traffic the sandbox mirrors: ordinary questions (answered by the default rule) and a few
# of the reference ones, cycled in order, each from one of CUSTOMERS customers (distinct prompts).
LIVE_PROMPTS = (
    "Summarise our returns policy for a customer.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Translate 'good morning' into Spanish.",
    "What is the refund window?",
    "Explain what a GPU does in two sentences.",
    "What is the boiling point of water?",
    "Suggest a name for a sailing boat.",
    "What is 17 * 23?",
    "List three uses of copper.",
)
CUSTOMERS = 50
REFUSAL_ANSWER = "I'm sorry, but I can't help with that request."
MIRROR_KEEP = 5000  # pairs kept per route (oldest dropped)
MIRROR_FILTER = "RequestMirror"


def reference_answer(prompt: str) -> str:
    text = prompt.casefold()
    for key, answer in REFERENCE_ANSWERS.items():
        if key in text:
            return answer
    digest = hashlib.sha256(prompt.encode()).hexdigest()
    return f"Here is a short answer ({digest[:8]}): {prompt.strip().rstrip('?.')} — handled as usual."


def _wrong(answer: str) -> str:
    """A confident hallucination: every digit shifted, Paris moved; never the reference."""
    wrong = re.sub(r"\d", lambda m: str((int(m.group()) + 4) % 10), answer).replace("Paris", "Lyon")
    return wrong if wrong != answer else "It is Atlantis, as everyone knows."


def _share(prompt: str, version: str) -> float:
    """A stable pseudo-random number in [0, 1) per (prompt, version)."""
    return int(hashlib.sha256(f"{version}\0{prompt}".encode()).hexdigest()[:8], 16) / 2**32


def answer(prompt: str, version: str, profile: Profile) -> str:
    """The version's answer to ``prompt`` (deterministic: the same prompt, the same answer)."""
    reference = reference_answer(prompt)
    if any(f.casefold() in prompt.casefold() for f in profile.golden_failures):
        return _wrong(reference)
    share = _share(prompt, version)
    open_ended = not any(key in prompt.casefold() for key in REFERENCE_ANSWERS)
    if open_ended and share < profile.drift:
        return REFUSAL_ANSWER if share < profile.drift / 2 else f"{reference} To elaborate at length: {reference} {reference}"
    return reference


def _mirror(route: dict) -> tuple[str, int] | None:
    """(mirrored Service, percent) of the route's first rule, if it mirrors."""
    rules = (route.get("spec") or {}).get("rules") or [{}]
    for item in rules[0].get("filters") or []:
        if item.get("type") == MIRROR_FILTER:
            mirror = item.get("requestMirror") or {}
            backend = (mirror.get("backendRef") or {}).get("name")
            if backend:
                return backend, int(mirror.get("percent", 100))
    return None


class MirrorLog:
    """Mirrored pairs per route, generated from the simulated demand (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pairs: dict[str, deque] = {}
        self.carry: dict[str, float] = {}
        self.seq = 0

    def advance(
        self,
        demand: dict[str, float],
        routes: list[dict],
        version_of: Callable[[str, str], tuple[str, Profile] | None],
        dt: float,
    ) -> None:
        """Record ``percent`` of ``dt`` seconds of each mirroring route's demand.

        ``version_of(namespace, service)`` gives the version behind a Service with Ready pods and its
        profile (None: no Ready pod, so the gateway's mirror goes nowhere). The user's answer comes
        from the route's heaviest backend (stable during a canary).
        """
        with self.lock:
            for route in routes:
                namespace, name = route["metadata"].get("namespace", "default"), route["metadata"]["name"]
                key = f"{namespace}/{name}"
                mirror = _mirror(route)
                rps = demand.get(key, 0.0)
                backends = ((route.get("spec") or {}).get("rules") or [{}])[0].get("backendRefs") or []
                if mirror is None or rps <= 0 or not backends:
                    self.carry.pop(key, None)
                    continue
                service, percent = mirror
                primary = max(backends, key=lambda b: int(b.get("weight", 1)))["name"]
                shadow, served = version_of(namespace, service), version_of(namespace, primary)
                if shadow is None or served is None or primary == service:
                    continue
                due = self.carry.get(key, 0.0) + rps * dt * percent / 100
                count, self.carry[key] = int(due), due - int(due)
                log = self.pairs.setdefault(key, deque(maxlen=MIRROR_KEEP))
                for _ in range(count):
                    self.seq += 1
                    prompt = f"{LIVE_PROMPTS[self.seq % len(LIVE_PROMPTS)]} (customer {self.seq % CUSTOMERS})"
                    log.append(
                        {
                            "seq": self.seq,
                            "at": time.time(),
                            "prompt": prompt,
                            "stable_version": served[0],
                            "stable_answer": answer(prompt, *served),
                            "canary_version": shadow[0],
                            "canary_answer": answer(prompt, *shadow),
                        }
                    )

    def read(self, path: str) -> dict | None:
        """``/mirror/<namespace>/<route>?after=<seq>&limit=<n>``: pairs after ``seq``; None: bad path."""
        url = urlparse(path)
        parts = url.path.strip("/").split("/")
        if len(parts) != 3:
            return None
        query = parse_qs(url.query)
        after = int((query.get("after") or ["0"])[0])
        limit = int((query.get("limit") or ["1000"])[0])
        with self.lock:
            pairs = [p for p in self.pairs.get(f"{parts[1]}/{parts[2]}", ()) if p["seq"] > after][:limit]
        return {"pairs": pairs, "last": pairs[-1]["seq"] if pairs else after}
