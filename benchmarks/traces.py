"""Loaders for the public traces in ``../shared/traces`` (read in place, never copied).

- ServeGen (Alibaba Cloud Model Studio, Apache-2.0; Xiang et al., arXiv 2505.09999): per-client
  request rates per 600 s window with the inter-arrival distribution of each window.
- Azure LLM inference 2023, code (CC-BY 4.0; Patel et al., ISCA 2024): individual requests.
- Spot availability folders (``load_availability``), e.g. SkyNomad's H100 (Apache-2.0): per
  instance type and zone, 1 = preempted, 0 = available, at the folder's own step, with launch counts.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import random
import re
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
SKYNOMAD = TRACES_DIR / "skynomad-h100"
# Where each folder of TRACES_DIR comes from (its upstream licence file travels with it; see docs/benchmarks.md).
SOURCES = {
    "servegen": "github.com/alibaba/ServeGen, commit f891d118, Apache-2.0",
    "azure-llm-2023": "github.com/Azure/AzurePublicDataset, commit b469a113, CC-BY 4.0",
    "skynomad-h100": "github.com/andylizf/skynomad-artifact, commit 62b9aaa1, Apache-2.0",
}


class TraceMissing(FileNotFoundError):
    """A public trace is not where it is read from; the message names the path and how to get it."""


def missing(path: Path) -> str | None:
    """Why ``path`` cannot be read (one line naming it and how to get it), or None when it is there."""
    path = Path(path)
    if path.exists():
        return None
    try:
        folder = path.resolve().relative_to(TRACES_DIR.resolve()).parts[0]
    except (ValueError, IndexError):
        return f"trace {path} is absent"
    source = SOURCES.get(folder, "see docs/benchmarks.md")
    return (f"public trace {path} is absent: put the public traces in ../shared/traces beside the checkout or set "
            f"TIDEPLANE_TRACES_DIR to their folder ({folder}/ from {source}; layout in docs/benchmarks.md)")


def require(path: Path) -> Path:
    """``path`` when it exists, else ``TraceMissing`` saying where the trace comes from."""
    reason = missing(path)
    if reason:
        raise TraceMissing(reason)
    return Path(path)


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


def load_servegen(category: str = "m-large", path: Path = SERVEGEN, clients: int | None = None, exclude: frozenset[str] = frozenset()) -> RateTrace:
    """Total demand of one ServeGen model category (sum of its clients' rates per window).

    ``clients`` limits the number of client files read (sorted by name), for small test slices;
    ``exclude`` leaves out clients by name (``chunk-N``: served as models of their own).
    A window where every client reports zero is a gap in the release: its rate is None. So is a
    window whose total is under ``PARTIAL_GAP_FRACTION`` of the median: m-mid's gaps have ragged
    edges where only a few small clients report (0-2 % of the median, while real troughs stay
    above 25 %), and those would otherwise read as a night with no traffic.
    """
    rates: dict[int, float] = {}
    weighted_cv2: dict[int, float] = {}
    for name, rows in _servegen_clients(category, path, clients):
        if name in exclude:
            continue
        for start, rate, cv in rows:
            rates[start] = rates.get(start, 0.0) + rate
            weighted_cv2[start] = weighted_cv2.get(start, 0.0) + rate * cv * cv
    return _rate_trace(f"servegen/{category}", rates, weighted_cv2)


def load_servegen_clients(category: str, path: Path = SERVEGEN) -> dict[str, RateTrace]:
    """Each client of a ServeGen category on its own (``chunk-N`` -> its demand), e.g. as one small model each."""
    return {
        name: _rate_trace(f"servegen/{category}/{name}", {t: r for t, r, _ in rows}, {t: r * cv * cv for t, r, cv in rows})
        for name, rows in _servegen_clients(category, path, None)
    }


def _servegen_clients(category: str, path: Path, clients: int | None):
    """(client name, [(window start, rate, cv)]) of the first ``clients`` rate files of a category, by name."""
    prefix = f"data/language/{category}/"
    require(path)
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
            rows = [(int(float(row[0])), float(row[1] or 0), float(row[2]) if row[2] else 1.0) for row in csv.reader(io.StringIO(text))]
            yield member.name[len(prefix):].removesuffix("-trace.csv"), rows


def _rate_trace(name: str, rates: dict[int, float], weighted_cv2: dict[int, float]) -> RateTrace:
    """Windows of summed rates, with the gaps of the release (see ``load_servegen``) as None."""
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
    return RateTrace(name=name, window_s=600.0, windows=windows)


@dataclass(frozen=True)
class Request:
    t_s: float  # seconds since the first request
    prompt_tokens: int
    output_tokens: int


def load_azure(path: Path = AZURE_CODE) -> list[Request]:
    """The Azure 2023 requests, timestamps made relative to the first one."""
    rows = list(csv.DictReader(require(path).read_text().splitlines()))
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
    """One failure domain (an instance type in a zone) of an availability trace."""

    zone: str
    region: str
    instance_type: str
    step_s: float
    spot_price: float  # $/h of the instance
    on_demand_price: float  # $/h of the same instance on demand
    gpus: int
    available: list[bool]  # per step: True when spot capacity could be had
    launched: list[int] | None = None  # per step: instances a launch of ``requested`` got (None: not measured)
    requested: int | None = None

    @property
    def domain(self) -> str:
        return f"{self.instance_type}/{self.zone}"

    def capacity(self, step: int) -> int | None:
        """Spot instances the domain could hold at ``step`` (0 when preempted; None: no launch counts)."""
        if not self.available[step]:
            return 0
        return None if self.launched is None else self.launched[step]


@dataclass(frozen=True)
class AvailabilityTrace:
    name: str  # the folder's name: outputs are named after it
    source: str  # what it is, from its README/NOTICE's first line or the folder
    zones: list[SpotZone]

    @property
    def step_s(self) -> float:
        return self.zones[0].step_s

    @property
    def steps(self) -> int:
        return min(len(z.available) for z in self.zones)


def load_availability(folder: Path = SKYNOMAD) -> AvailabilityTrace:
    """A spot availability folder (format below, and in benchmarks/results/README.md's spot section).

    - ``<folder>/zones/*.json`` (or ``<folder>/*.json``), one per instance type and zone:
      ``{"metadata": {"zone", "gap_seconds", "start_time"?, "instance_type"?, "region"?,
      "price_info": {"price", "on_demand_price", "machine_type"?, "region"?, "components"?}},
      "data": [0 | 1, ...]}`` with 1 = spot unavailable (preempted) in that sample, any step;
      GPUs per instance from the ``gpu`` price component (1 when absent); region from the
      metadata, else the zone name without its last letter (us-central1-a, us-east-1a);
    - optionally one ``*launch*counts*.csv``: ``scheduled_at`` (ISO), ``requested_per_zone``, and
      a column per zone (or per ``instance_type/zone``) with the instances that launch got; rows are
      matched to samples by time (``start_time``), a missing sample keeps the last count.
    """
    folder = require(folder)
    files = sorted((folder / "zones").glob("*.json")) or sorted(folder.glob("*.json"))
    if not files:
        raise ValueError(f"no availability files (*.json or zones/*.json) in {folder}")
    counts = sorted(folder.glob("*launch*counts*.csv"))
    rows = list(csv.DictReader(counts[0].read_text().splitlines())) if counts else []
    zones = []
    for path in files:
        doc = json.loads(path.read_text())
        meta = doc["metadata"]
        price = meta["price_info"]
        zone = meta.get("zone") or path.name.split("_")[0]
        instance_type = meta.get("instance_type") or price.get("machine_type") or "instance"
        step_s = float(meta["gap_seconds"])
        data = doc["data"]
        launched, requested = _launch_counts(rows, zone, instance_type, meta.get("start_time"), step_s, len(data))
        zones.append(
            SpotZone(
                zone=zone,
                region=meta.get("region") or price.get("region") or re.sub(r"-?[a-z]$", "", zone),
                instance_type=instance_type,
                step_s=step_s,
                spot_price=float(price["price"]),
                on_demand_price=float(price["on_demand_price"]),
                gpus=sum(int(c["quantity"]) for c in price.get("components", []) if c.get("label") == "gpu") or 1,
                available=[v == 0 for v in data],
                launched=launched,
                requested=requested,
            )
        )
    notice = next((folder / n for n in ("README.md", "NOTICE") if (folder / n).exists()), None)
    source = notice.read_text().strip().splitlines()[0] if notice else folder.name
    return AvailabilityTrace(name=folder.name if folder.name != "zones" else folder.parent.name, source=source, zones=zones)


def _launch_counts(
    rows: list[dict], zone: str, instance_type: str, start: str | None, step_s: float, steps: int
) -> tuple[list[int] | None, int | None]:
    column = next((c for c in (f"{instance_type}/{zone}", zone) if rows and c in rows[0]), None)
    if column is None:
        return None, None
    by_step: dict[int, int] = {}
    t0 = datetime.fromisoformat(start) if start else None
    for i, row in enumerate(rows):
        if row.get(column) in (None, ""):
            continue
        at = round((datetime.fromisoformat(row["scheduled_at"]) - t0).total_seconds() / step_s) if t0 else i
        if 0 <= at < steps:
            by_step[at] = int(row[column])
    requested = int(rows[0].get("requested_per_zone") or max(by_step.values(), default=0))
    launched, last = [], requested
    for i in range(steps):
        last = by_step.get(i, last)
        launched.append(last)
    return launched, requested
