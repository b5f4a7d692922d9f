"""Loaders for the public traces in ``../shared/traces`` (read in place, never copied).

- ServeGen (Alibaba Cloud Model Studio, Apache-2.0; Xiang et al., arXiv 2505.09999): per-client
  request rates per 600 s window with the inter-arrival distribution of each window.
- Azure LLM inference 2023, code (CC-BY 4.0; Patel et al., ISCA 2024): individual requests.
- SkyNomad spot H100 availability (Apache-2.0): per zone, 1 = preempted, 0 = available, every 600 s.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import random
import tarfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

# ../shared/traces beside the checkout (as CI lays it out); TIDEPLANE_TRACES_DIR for a checkout elsewhere.
TRACES_DIR = Path(os.environ.get("TIDEPLANE_TRACES_DIR") or Path(__file__).resolve().parents[2] / "shared" / "traces")
SERVEGEN = TRACES_DIR / "servegen" / "servegen-language-m-large-m-mid.tar.gz"
SERVEGEN_DATASETS = TRACES_DIR / "servegen" / "servegen-language-m-large-m-mid-datasets.tar.gz"  # token distributions
PARTIAL_GAP_FRACTION = 0.05  # a window below this fraction of the median total is missing data
AZURE_CODE = TRACES_DIR / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
SKYNOMAD_ZONES = TRACES_DIR / "skynomad-h100" / "zones"


@dataclass(frozen=True)
class RateWindow:
    """Demand of one window: mean rate and the index of dispersion of its arrival counts."""

    start_s: float
    rate: float | None  # requests/s; None = missing data (a gap in the release), not zero demand
    dispersion: float  # Var(N)/E(N) of the count in any interval >> the mean gap: sum(r_i cv_i^2)/sum(r_i)


@dataclass(frozen=True)
class RateTrace:
    name: str
    window_s: float
    windows: list[RateWindow]

    @property
    def duration_s(self) -> float:
        return len(self.windows) * self.window_s

    def arrivals(self, step_s: float, seed: int = 0) -> list[float]:
        """Requests arriving in each step of ``step_s`` seconds, deterministic for a seed.

        Each window's total is the trace's own ``rate * window_s``; it is split over the window's
        steps by normalised gamma draws with shape ``rate*step/dispersion``, i.e. the burstiness of
        superposed renewal processes (a renewal count's variance grows as ``rate*cv^2*t``) but
        conditioned on the measured window total, so an extreme cv (ServeGen has clients with
        cv > 1000) moves arrivals inside the window instead of inventing demand the trace never
        saw. Missing windows carry the last known window forward: a gap fakes neither a trough
        nor a peak.
        """
        rng = random.Random(seed)
        steps_per_window = max(1, round(self.window_s / step_s))
        out: list[float] = []
        last = next((w for w in self.windows if w.rate is not None), None)
        for window in self.windows:
            if window.rate is not None:
                last = window
            total = (last.rate if last else 0.0) * self.window_s
            if total <= 0:
                out.extend([0.0] * steps_per_window)
                continue
            shape = max(total / steps_per_window / max(last.dispersion, 1e-6), 1e-3)
            draws = [rng.gammavariate(shape, 1.0) for _ in range(steps_per_window)]
            norm = sum(draws) or 1.0
            out.extend(total * d / norm for d in draws)
        return out


def load_servegen(category: str = "m-large", path: Path = SERVEGEN, clients: int | None = None) -> RateTrace:
    """Total demand of one ServeGen model category (sum of its clients' rates per window).

    ``clients`` limits the number of client files read (sorted by name), for small test slices.
    A window where every client reports zero is a gap in the release: its rate is None. So is a
    window whose total is under ``PARTIAL_GAP_FRACTION`` of the median: m-mid's gaps have ragged
    edges where only a few small clients report (0-2 % of the median, while real troughs stay
    above 25 %), and those would otherwise read as a night with no traffic.
    """
    rates: dict[int, float] = {}
    weighted_cv2: dict[int, float] = {}
    prefix = f"data/language/{category}/"
    with tarfile.open(path, "r|gz") as tar:  # streamed: random access into a .tar.gz re-inflates from the start
        names = sorted(m.name for m in tar if m.name.startswith(prefix) and m.name.endswith(".csv"))
    if not names:
        raise ValueError(f"no ServeGen category {category!r} in {path}")
    chosen = set(names[:clients])
    with tarfile.open(path, "r|gz") as tar:
        for member in tar:
            if member.name not in chosen:
                continue
            text = tar.extractfile(member).read().decode()
            for row in csv.reader(io.StringIO(text)):
                start, rate = int(float(row[0])), float(row[1] or 0)
                cv = float(row[2]) if row[2] else 1.0
                rates[start] = rates.get(start, 0.0) + rate
                weighted_cv2[start] = weighted_cv2.get(start, 0.0) + rate * cv * cv
    positive = sorted(r for r in rates.values() if r > 0)
    cutoff = PARTIAL_GAP_FRACTION * positive[len(positive) // 2] if positive else 0.0
    windows = [
        RateWindow(
            start_s=start,
            rate=rates[start] if rates[start] > cutoff else None,
            dispersion=weighted_cv2[start] / rates[start] if rates[start] > cutoff else 1.0,
        )
        for start in sorted(rates)
    ]
    return RateTrace(name=f"servegen/{category}", window_s=600.0, windows=windows)


@dataclass(frozen=True)
class Request:
    t_s: float  # seconds since the first request
    prompt_tokens: int
    output_tokens: int


def load_azure(path: Path = AZURE_CODE) -> list[Request]:
    """The Azure 2023 requests, timestamps made relative to the first one."""
    rows = list(csv.DictReader(path.read_text().splitlines()))
    if not rows:
        raise ValueError(f"no requests in {path}")
    stamps = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in rows]
    t0 = stamps[0]
    return [
        Request((s - t0).total_seconds(), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
        for s, r in zip(stamps, rows)
    ]


def bin_requests(requests: list[Request], step_s: float) -> list[float]:
    """Request counts per step of ``step_s`` seconds."""
    end = max(r.t_s for r in requests)
    counts = [0.0] * (math.floor(end / step_s) + 1)
    for r in requests:
        counts[math.floor(r.t_s / step_s)] += 1
    return counts


@dataclass(frozen=True)
class SpotZone:
    zone: str
    step_s: float
    spot_price: float  # $/h of the instance
    on_demand_price: float  # $/h of the same instance on demand
    gpus: int
    available: list[bool]  # per step: True when spot capacity could be had


def load_skynomad(zones_dir: Path = SKYNOMAD_ZONES) -> list[SpotZone]:
    """Every zone's spot availability (the trace's 1 = preempted is turned into available=False)."""
    zones = []
    for path in sorted(zones_dir.glob("*_h100_16.json")):
        doc = json.loads(path.read_text())
        meta = doc["metadata"]
        price = meta["price_info"]
        gpus = sum(int(c["quantity"]) for c in price.get("components", []) if c.get("label") == "gpu") or 1
        zones.append(
            SpotZone(
                zone=meta.get("zone", path.name.split("_")[0]),
                step_s=float(meta["gap_seconds"]),
                spot_price=float(price["price"]),
                on_demand_price=float(price["on_demand_price"]),
                gpus=gpus,
                available=[v == 0 for v in doc["data"]],
            )
        )
    if not zones:
        raise ValueError(f"no SkyNomad zone files in {zones_dir}")
    return zones
