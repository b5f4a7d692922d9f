"""Request sizes (prompt and output tokens) per time window, from the traces.

ServeGen publishes, per client and 6-hour window, the distributions of input and output tokens
(``chunk-N-dataset.json``). A category's mix in a window is the clients' distributions weighted by
the requests each client sent in that window (its rate from the rate trace). Clients whose dataset
file is missing are, by the traces' README, given the pooled distribution of the others in the same
window: in the mix that is the same as pooling over the clients that have one, so they only change
the weights; ``SizeMix.missing`` names them and their share of the requests, for reports to say so.
The Azure trace carries each request's own token counts.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import random
import re
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path

MAX_POINTS = 256  # a distribution is kept as at most this many (tokens, probability) points
_PAIR = re.compile(r"(\d+)\s*:\s*([0-9.eE+-]+)")


@dataclass(frozen=True)
class TokenDist:
    """A discrete distribution of token counts: sorted (tokens, probability) points summing to 1."""

    points: tuple[tuple[int, float], ...]

    @staticmethod
    def of(weights: dict[int, float]) -> TokenDist:
        items = sorted((int(t), float(p)) for t, p in weights.items() if p > 0)
        total = sum(p for _, p in items)
        if not items:
            raise ValueError("an empty token distribution")
        items = [(t, p / total) for t, p in items]
        if len(items) > MAX_POINTS:  # merge neighbours into equal-probability bins, keeping each bin's mean
            merged, acc, weighted, edge = [], 0.0, 0.0, 1 / MAX_POINTS
            for t, p in items:
                acc += p
                weighted += t * p
                if acc >= edge - 1e-12:
                    merged.append((round(weighted / acc), acc))
                    acc = weighted = 0.0
            if acc > 0:
                merged.append((round(weighted / acc), acc))
            items = merged
        return TokenDist(tuple(items))

    def mean(self) -> float:
        return sum(t * p for t, p in self.points)

    def second_moment(self) -> float:
        return sum(t * t * p for t, p in self.points)

    def quantile(self, q: float) -> int:
        acc = 0.0
        for t, p in self.points:
            acc += p
            if acc >= q - 1e-12:
                return t
        return self.points[-1][0]

    def sampler(self, rng: random.Random):
        """A function drawing token counts from this distribution."""
        cumulative, acc = [], 0.0
        for _, p in self.points:
            acc += p
            cumulative.append(acc)
        tokens = [t for t, _ in self.points]
        last = len(tokens) - 1
        return lambda: tokens[min(last, bisect.bisect_left(cumulative, rng.random() * acc))]


@dataclass(frozen=True)
class SizeMix:
    """Prompt and output token distributions per window of ``window_s`` seconds (the last one repeats)."""

    window_s: float
    prompt: tuple[TokenDist, ...]
    output: tuple[TokenDist, ...]
    source: str
    missing: tuple[str, ...] = ()  # clients without their own distribution (pooled fallback)
    missing_share: float = 0.0  # their share of the requests
    offset_s: float = 0.0  # trace time of this mix's t = 0 (a slice that starts later)

    def index(self, t_s: float) -> int:
        """The window holding ``t_s`` (seconds since the slice's start)."""
        return min(len(self.prompt) - 1, max(0, int((t_s + self.offset_s) // self.window_s)))

    def at(self, t_s: float) -> tuple[TokenDist, TokenDist]:
        i = self.index(t_s)
        return self.prompt[i], self.output[i]

    def from_time(self, offset_s: float) -> SizeMix:
        """The same mix for a slice of the trace starting ``offset_s`` later."""
        return replace(self, offset_s=self.offset_s + offset_s)


def fixed(prompt_tokens: int, output_tokens: int) -> SizeMix:
    """Every request the same size (a sandbox profile's prompt/output tokens)."""
    return SizeMix(86400.0, (TokenDist(((prompt_tokens, 1.0),)),), (TokenDist(((output_tokens, 1.0),)),), "fixed")


def from_requests(requests, window_s: float, source: str) -> SizeMix:
    """Empirical per-window distributions of requests with ``t_s``, ``prompt_tokens``, ``output_tokens``."""
    windows: dict[int, tuple[dict, dict]] = {}
    for r in requests:
        prompts, outputs = windows.setdefault(int(r.t_s // window_s), ({}, {}))
        prompts[r.prompt_tokens] = prompts.get(r.prompt_tokens, 0) + 1
        outputs[max(1, r.output_tokens)] = outputs.get(max(1, r.output_tokens), 0) + 1
    keys = range(max(windows) + 1)
    last = windows[min(windows)]
    prompt, output = [], []
    for k in keys:
        last = windows.get(k, last)
        prompt.append(TokenDist.of(last[0]))
        output.append(TokenDist.of(last[1]))
    return SizeMix(window_s, tuple(prompt), tuple(output), source)


def _client(name: str) -> str:
    return name.rsplit("/", 1)[-1].split("-trace")[0].split("-dataset")[0]


def load_servegen_sizes(category: str, rates_path: Path, datasets_path: Path, clients: int | None = None) -> SizeMix:
    """Rate-weighted mix of a ServeGen category's clients per 6-hour window.

    ``clients`` keeps the first N rate files by name (as ``benchmarks.traces.load_servegen`` does).
    """
    prefix = f"data/language/{category}/"
    with tarfile.open(rates_path, "r|gz") as tar:
        names = sorted(m.name for m in tar if m.name.startswith(prefix) and m.name.endswith(".csv"))
    chosen = {_client(n) for n in names[:clients]}
    requests: dict[str, dict[int, float]] = {}  # client -> 6-hour window -> requests
    window_s = 21600
    with tarfile.open(rates_path, "r|gz") as tar:
        for member in tar:
            if not member.name.startswith(prefix) or _client(member.name) not in chosen:
                continue
            per = requests.setdefault(_client(member.name), {})
            for row in csv.reader(io.StringIO(tar.extractfile(member).read().decode())):
                start, rate = int(float(row[0])), float(row[1] or 0)
                per[start // window_s] = per.get(start // window_s, 0.0) + rate * 600
    pooled_prompt: dict[int, dict[int, float]] = {}
    pooled_output: dict[int, dict[int, float]] = {}
    have: set[str] = set()
    with tarfile.open(datasets_path, "r|gz") as tar:
        for member in tar:
            if not member.name.startswith(prefix) or not member.name.endswith("-dataset.json"):
                continue
            client = _client(member.name)
            if client not in chosen:
                continue
            have.add(client)
            doc = json.loads(tar.extractfile(member).read())
            for start, dists in doc.items():
                w = int(start) // window_s
                weight = requests.get(client, {}).get(w, 0.0)
                if weight <= 0:
                    continue
                for text, pooled in ((dists["input_tokens"], pooled_prompt), (dists["output_tokens"], pooled_output)):
                    pairs = _PAIR.findall(text)
                    total = sum(float(p) for _, p in pairs)
                    if total <= 0:
                        continue
                    into = pooled.setdefault(w, {})
                    for tokens, p in pairs:
                        into[int(tokens)] = into.get(int(tokens), 0.0) + weight * float(p) / total
    if not pooled_prompt:
        raise ValueError(f"no ServeGen token distributions for {category!r} in {datasets_path}")
    missing = tuple(sorted(chosen - have))
    total_requests = sum(sum(v.values()) for v in requests.values()) or 1.0
    share = sum(sum(requests.get(c, {}).values()) for c in missing) / total_requests
    windows = max(max(pooled_prompt), max(max(v) for v in requests.values()) if requests else 0) + 1
    prompt, output = [], []
    last = min(pooled_prompt)
    for w in range(windows):
        if w in pooled_prompt and w in pooled_output:
            last = w
        prompt.append(TokenDist.of(pooled_prompt[last]))
        output.append(TokenDist.of(pooled_output[last]))
    return SizeMix(window_s, tuple(prompt), tuple(output), f"servegen/{category} per-client token distributions", missing, share)
